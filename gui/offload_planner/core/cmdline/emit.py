"""Showing a llama-server command line for a shell, llama-swap or docker (display/copy only).

Nothing produced here is ever handed to a shell by the planner: the app runs llama-server with
an argument list.  ``format_command`` output is for people to paste.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from enum import StrEnum
from pathlib import PurePath, PureWindowsPath

from offload_planner.core.cmdline.envform import ArgGroup, args_to_env, group_args
from offload_planner.core.cmdline.parse import split_program
from offload_planner.core.cmdline.quoting import (
    CONTROL,
    msvcrt_quote,
    quote_bash,
    quote_bash_command,
    quote_cmd,
    quote_posix,
    quote_powershell,
    visible,
)
from offload_planner.core.cmdline.secrets import masked
from offload_planner.core.dialects.base import Dialect
from offload_planner.core.errors import PlannerError

PORT_MACRO = "${PORT}"


class Style(StrEnum):
    BASH = "bash"
    POWERSHELL = "powershell"
    CMD = "cmd"
    LLAMA_SWAP = "llama-swap"
    DOCKER_ENV = "docker-env"


class ExportRefused(PlannerError, ValueError):
    """An argument the chosen format cannot carry exactly: the message names the argument, the
    format and why (the export is refused rather than written wrong)."""


#: Longest line cmd.exe accepts; longest command line CreateProcess accepts (PowerShell's limit).
CMD_LINE_MAX = 8191
#: docker --env-file reads its lines with a bufio.Scanner: a line of 64 KiB or more is an error.
ENV_FILE_LINE_MAX = 64 * 1024
WINDOWS_COMMAND_MAX = 32767
#: What llama-swap replaces in a model's ``cmd`` before splitting it (its macros and ``${env.X}``).
_SWAP_MACRO = re.compile(r"\$\{(?:env\.[A-Za-z_][A-Za-z0-9_]*|[A-Za-z0-9_-]+)\}")
_C0_BUT_TAB = re.compile("[\x00-\x08\x0a-\x1f]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_STRAY_SURROGATE = re.compile("[\ud800-\udc7f\udd00-\udfff]")


def _what(argv: Sequence[str], i: int) -> str:
    """Argument ``i`` for a message (a secret's value as ``***``: messages are shown and logged)."""
    shown = masked(argv)
    prev = f", the value of {visible(shown[i - 1])}" if i > 0 and argv[i - 1].startswith("-") else ""
    return f"argument {i} {visible(shown[i])}{prev}" if i > 0 else f"the program {visible(argv[0])}"


def _refuse_if(argv: Sequence[str], fmt: str, found: Callable[[str], str | None]) -> None:
    """Raise :class:`ExportRefused` at the first argument ``found`` says ``fmt`` cannot carry."""
    for i, arg in enumerate(argv):
        why = found(arg)
        if why is not None:
            raise ExportRefused(f"cannot write the command for {fmt}: {_what(argv, i)}: {why}")


def _no_argv_can(arg: str) -> str | None:
    if "\0" in arg:
        return "no command line can carry a NUL character (the program would see the argument end there)"
    if _STRAY_SURROGATE.search(arg):
        return "it holds a lone surrogate, which is no character a command line can carry"
    return None


def _windows_cannot(arg: str) -> str | None:
    if _SURROGATE.search(arg):
        return "it holds a byte that is not UTF-8, which a Windows command line cannot carry"
    return _no_argv_can(arg)


def _cmd_cannot(arg: str) -> str | None:
    m = _C0_BUT_TAB.search(arg)
    if m is None or m.group() == "\0":
        return _windows_cannot(arg)
    return (f"cmd.exe cannot carry the control character {visible(m.group())} in an argument "
            "(a line break ends the command, a carriage return is dropped); use PowerShell")


def _swap_cannot(arg: str) -> str | None:
    if "\0" in arg:
        return _no_argv_can(arg)
    m = CONTROL.search(arg)
    if m is not None:
        return (f"llama-swap's YAML cmd block cannot carry the control character {visible(m.group())}"
                " (a line break would end the argument's line, and YAML forbids the others)")
    m = _SWAP_MACRO.search(arg)
    if m is not None:
        return (f"llama-swap replaces {m.group()} in a cmd with its macro or environment variable, "
                "and has no way to write it literally")
    return _no_argv_can(arg)


def _lines(argv: Sequence[str], dialect: Dialect, quote: Callable[[str], str],
           quote_program: Callable[[str], str] | None = None) -> list[str]:
    """The program, then one line per flag with its values, each token quoted."""
    program, args = split_program(argv)
    out = [(quote_program or quote)(program)] if program is not None else []
    out.extend(" ".join(quote(t) for t in g.tokens) for g in group_args(args, dialect))
    return out


def _join(lines: list[str], multiline: bool, continuation: str) -> str:
    return f"{continuation}\n  ".join(lines) if multiline else " ".join(lines)


def _powershell(argv: Sequence[str], dialect: Dialect, multiline: bool) -> str:
    _refuse_if(argv, "PowerShell", _windows_cannot)
    length = len(" ".join(msvcrt_quote(a) for a in argv))
    if length > WINDOWS_COMMAND_MAX:
        raise ExportRefused(f"cannot write the command for PowerShell: the program's command line "
                            f"would be {length:,} characters, and Windows starts none longer "
                            f"than {WINDOWS_COMMAND_MAX:,}")
    program, args = split_program(argv)
    legacy = any(map(_ps_legacy_fragile, args))
    lines = _lines(argv, dialect, _ps_legacy_quote if legacy else quote_powershell, quote_powershell)
    if program is not None and lines and lines[0].startswith("'"):
        lines[0] = "& " + lines[0]  # a quoted program needs the call operator
    if legacy and lines:
        lines[0] = f"& {{ {PS_LEGACY}; {lines[0]}"
        lines[-1] += " }"
    return _join(lines, multiline, " `")


#: Set in a script block of its own (the setting ends with it): PowerShell 7.3 and later then pass
#: arguments to a program as Windows PowerShell 5.1 and PowerShell 7.0-7.2 always do, so that one
#: form of the command gives the program the same arguments in every version. In 5.1 the variable
#: means nothing and setting it does nothing.
PS_LEGACY = "$PSNativeCommandArgumentPassing = 'Legacy'"


def _ps_legacy_fragile(arg: str) -> bool:
    """An argument Windows PowerShell 5.1 (and 7.0-7.2) would not pass as written: it drops an empty
    one, passes a ``"`` raw (the program reads it as a quote), and quotes one with a space as
    ``"arg"`` without escaping a trailing backslash (``"C:\\my models\\"``: the ``\\"`` is a quote)."""
    return arg == "" or '"' in arg or (arg.endswith("\\") and any(c.isspace() for c in arg))


def _ps_legacy_quote(arg: str) -> str:
    """``arg`` for the legacy passing (PowerShell's ``NeedQuotes``, ``NativeCommandParameterBinder.cs``):
    a fragile one as the exact Windows command-line form, double quotes and all (``"a\\"b"``), which
    PowerShell passes as it is (every ``"`` in it but the first follows a backslash or ends it, so
    PowerShell adds no quotes of its own); any other as PowerShell 7.3 would pass it."""
    return quote_powershell(msvcrt_quote(arg, force=True) if _ps_legacy_fragile(arg) else arg)


def _model_name(groups: list[ArgGroup]) -> str:
    for key in ("--alias", "--model"):
        for g in groups:
            if g.spec is not None and g.spec.key == key and g.values:
                value = g.values[0]
                if key == "--alias":
                    return value
                name = PureWindowsPath(value).name if "\\" in value else PurePath(value).name
                return name.removesuffix(".gguf")
    return "model"


def _cmd(argv: Sequence[str], dialect: Dialect, multiline: bool) -> str:
    _refuse_if(argv, "cmd.exe", _cmd_cannot)
    one_line = _join(_lines(argv, dialect, quote_cmd), False, "")
    if one_line.count("%") > 1:
        i = next(i for i, a in enumerate(argv) if "%" in a)
        raise ExportRefused(f"cannot write the command for cmd.exe: {_what(argv, i)}: cmd.exe replaces "
                            "%NAME% with a variable's value even inside double quotes, and a command "
                            "line has no way to write it literally; use PowerShell")
    if len(one_line) > CMD_LINE_MAX:
        raise ExportRefused(f"cannot write the command for cmd.exe: it is {len(one_line):,} characters, "
                            f"and cmd.exe reads no line longer than {CMD_LINE_MAX:,}; use PowerShell")
    note = _delayed_expansion_note(argv)
    return note + _join(_lines(argv, dialect, quote_cmd), multiline, " ^")


def _delayed_expansion_note(argv: Sequence[str]) -> str:
    """A ``REM`` line before a command with a ``!`` in an argument (a path, a ``(?!...)`` regex): exact
    in cmd.exe as it starts (delayed expansion off), but with delayed expansion on cmd replaces
    ``!NAME!``, drops a lone ``!`` and eats ``^`` on such a line, even inside double quotes, and no
    quoting serves both. The note has no ``%``, ``!`` or ``^`` of its own."""
    i = next((i for i, a in enumerate(argv) if "!" in a), None)
    if i is None:
        return ""
    what = f"argument {i}" if i > 0 else "the program"
    return (f"REM for cmd.exe with delayed expansion off, its default: with it on (cmd /v:on, setlocal "
            f"EnableDelayedExpansion) cmd changes {what}, which holds an exclamation mark\n")


def _llama_swap(argv: Sequence[str], dialect: Dialect, name: str | None) -> str:
    _refuse_if(argv, "llama-swap", _swap_cannot)
    program, args = split_program(argv)
    groups = group_args(args, dialect)
    lines = [quote_posix(program or "llama-server")]
    has_port = False
    for g in groups:
        if g.spec is not None and g.spec.key == "--port":
            lines.append(f"{quote_posix(g.tokens[0])} {PORT_MACRO}")
            has_port = True
        else:
            lines.append(" ".join(quote_posix(t) for t in g.tokens))
    if not has_port:
        lines.insert(1, f"--port {PORT_MACRO}")
    key_text = name or _model_name(groups)
    why = _swap_cannot(key_text)
    if why is not None:
        raise ExportRefused(
            f"cannot write the command for llama-swap: the model name {visible(key_text)}: {why}")
    key = json.dumps(key_text, ensure_ascii=False)  # YAML reads "\ud83d\ude42" as two lone surrogates
    body = "\n".join(f"      {line}" for line in lines)
    return f"models:\n  {key}:\n    cmd: |\n{body}\n"


def _docker_env(argv: Sequence[str], dialect: Dialect) -> str:
    _refuse_if(argv, "docker env", _no_argv_can)
    _program, args = split_program(argv)
    split = args_to_env(args, dialect)
    lines = [f"{k}={v}" for k, v in split.env.items()]
    for line in lines:
        if len(line.encode()) >= ENV_FILE_LINE_MAX:
            raise ExportRefused(f"cannot write the docker env file: {line.partition('=')[0]} would be a "
                                f"{len(line.encode()):,}-byte line, and docker --env-file reads lines "
                                f"shorter than {ENV_FILE_LINE_MAX:,} bytes")
    lines.extend(f"# note: {n}" for n in split.notes)
    if split.rest:  # an empty "# command ...: " line read as if something were missing
        command = " ".join(quote_bash(t) for t in split.rest)
        lines.append(f"# command (arguments after the image's llama-server entrypoint): {command}")
    return "\n".join(lines) + "\n"


def format_command(
    argv: Sequence[str],
    style: str,
    *,
    dialect: Dialect = Dialect.LLAMA_CPP,
    multiline: bool = False,
    name: str | None = None,
) -> str:
    """Render ``argv`` (program first, if any) for ``style``: ``bash`` (POSIX quoting only where
    needed), ``powershell``, ``cmd``, ``llama-swap`` (a ``models:`` entry, ``--port ${PORT}``) or
    ``docker-env`` (``LLAMA_ARG_*=value`` lines for an ``--env-file`` plus the remaining arguments).
    ``multiline`` puts each flag on its own continued line (bash/powershell/cmd).
    """
    kind = Style(style)
    if kind is Style.BASH:
        _refuse_if(argv, "bash", _no_argv_can)
        return _join(_lines(argv, dialect, quote_bash, quote_bash_command), multiline, " \\")
    if kind is Style.POWERSHELL:
        return _powershell(argv, dialect, multiline)
    if kind is Style.CMD:
        return _cmd(argv, dialect, multiline)
    if kind is Style.LLAMA_SWAP:
        return _llama_swap(argv, dialect, name)
    return _docker_env(argv, dialect)
