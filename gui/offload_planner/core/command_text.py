"""Command lines as text: display formats (core ``format_command``) and reading a pasted command
(shell text -> argv -> core ``parse_server_args`` and ``check_semantics``) into a plan."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from offload_planner.core.cmdline import (
    Dialect,
    ParsedArgs,
    Style,
    check_semantics,
    format_command,
    ignored_draft_devices,
    parse_server_args,
    skipped_devices,
)
from offload_planner.core.cmdline.emit import PS_LEGACY
from offload_planner.core.cmdline.ik_draft_params import draft_params_notes
from offload_planner.core.cmdline.shell_read import legacy_line, msvcrt_split, powershell_words
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.plan import Plan, plan_from_args

#: (style, label) of the formats the command pane offers.
STYLES: tuple[tuple[str, str], ...] = (
    (Style.BASH.value, "bash"),
    (Style.POWERSHELL.value, "PowerShell"),
    (Style.CMD.value, "cmd.exe"),
    (Style.LLAMA_SWAP.value, "llama-swap"),
    (Style.DOCKER_ENV.value, "docker env"),
)


def render(argv: Sequence[str], style: str, dialect: Dialect, *, multiline: bool = False) -> str:
    return format_command(list(argv), style, dialect=Dialect(dialect), multiline=multiline)


_ANSI_C_SIMPLE = {"n": b"\n", "t": b"\t", "r": b"\r", "a": b"\a", "b": b"\b", "f": b"\f", "v": b"\v",
                  "e": b"\x1b", "E": b"\x1b", "\\": b"\\", "'": b"'", '"': b'"', "?": b"?"}
_ANSI_C_ESCAPE = re.compile(r"\\(x[0-9A-Fa-f]{1,2}|[0-7]{1,3}|u[0-9A-Fa-f]{1,4}|U[0-9A-Fa-f]{1,8}|.)", re.S)


def _ansi_c_bytes(body: str) -> str:
    """The text of bash's ``$'body'``: its escapes decoded (bytes that are no UTF-8 kept as
    ``surrogateescape`` characters, as Python keeps them in a path)."""
    out = bytearray()
    pos = 0
    for m in _ANSI_C_ESCAPE.finditer(body):
        out += body[pos:m.start()].encode("utf-8", "surrogateescape")
        esc = m.group(1)
        if esc[0] == "x":
            out.append(int(esc[1:], 16))
        elif esc[0] in "01234567":
            out.append(int(esc, 8) & 0xFF)
        elif esc[0] in "uU" and len(esc) > 1:
            out += chr(min(int(esc[1:], 16), 0x10FFFF)).encode("utf-8", "surrogatepass")
        else:
            out += _ANSI_C_SIMPLE.get(esc, ("\\" + esc).encode("utf-8", "surrogateescape"))
        pos = m.end()
    out += body[pos:].encode("utf-8", "surrogateescape")
    return out.decode("utf-8", "surrogateescape")


_SHELL_PIECE = re.compile(r"\$'((?:[^'\\]|\\.)*)'|'[^']*'|\"(?:[^\"\\]|\\.)*\"|\\.|[^$'\"\\]+|.", re.S)


def _ansi_c_as_single_quotes(text: str) -> str:
    """``text`` with each bash ``$'...'`` (how the bash export writes a control character) turned
    into the same characters in plain single quotes, which ``shlex`` reads."""
    if "$'" not in text:
        return text
    out = []
    for m in _SHELL_PIECE.finditer(text):
        if m.group(1) is None:
            out.append(m.group())
        else:
            out.append("'" + _ansi_c_bytes(m.group(1)).replace("'", "'\"'\"'") + "'")
    return "".join(out)


#: A whole line that is a comment: cmd's ``REM`` (and ``::``), PowerShell's and bash's ``#`` (the cmd
#: export writes a ``REM`` line before a command with a ``!``).
_COMMENT_LINE = re.compile(r"^[ \t]*(?:(?:REM|@REM)(?:[ \t].*)?|::.*|#.*)(?:\r?\n|$)", re.I | re.M)
#: How the PowerShell export opens a command that needs the legacy argument passing.
_PS_LEGACY_OPEN = "& { " + PS_LEGACY + "; "


def _cmd_unescaped(text: str) -> str:
    """The line cmd.exe hands the program: each ``^`` outside double quotes escapes the next character."""
    out: list[str] = []
    in_quotes = False
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            in_quotes = not in_quotes
        elif ch == "^" and not in_quotes and i + 1 < len(text):
            i += 1
            ch = text[i]
        out.append(ch)
        i += 1
    return "".join(out)


def split_command_text(text: str) -> list[str]:
    """A pasted command as an argument list; whole-line comments dropped, line continuations of bash
    (\\), PowerShell (`) and cmd (^) joined, and bash's ``$'...'`` strings read. What the PowerShell
    export writes (``& 'program'``, the legacy block, `` ` `` continuations) is read as PowerShell
    (``'it''s'``: ``it's``), a command with a ``REM`` line or ``^`` continuations as cmd.exe; any other
    as bash. The program name stays (the parser recognises it)."""
    rem = re.search(r"^[ \t]*(?:@?REM\b|::)", text, re.I | re.M) is not None
    text = _COMMENT_LINE.sub("", text)
    cmd = rem or bool(re.search(r"\^\r?\n", text))
    powershell = bool(re.search(r"`\r?\n", text))
    for cont in ("\\\r\n", "\\\n", "`\r\n", "`\n", "^\r\n", "^\n"):
        text = text.replace(cont, " ")
    text = text.strip()
    if cmd:  # cmd.exe's: ^ escapes outside double quotes, then the program's CommandLineToArgvW
        return msvcrt_split(_cmd_unescaped(text))
    legacy = text.startswith(_PS_LEGACY_OPEN) and text.endswith("}")
    if legacy:
        text = text[len(_PS_LEGACY_OPEN):-1].strip()
    try:
        if legacy or powershell or text.startswith("& "):
            words = powershell_words(text.removeprefix("& "))
            return words[:1] + msvcrt_split(legacy_line(words[1:])) if legacy else words
        return shlex.split(_ansi_c_as_single_quotes(text), comments=False, posix=True)
    except ValueError as e:
        raise ValueError(f"cannot split the command: {e}") from None


def read_command(text: str, dialect: Dialect) -> ParsedArgs:
    """Parse a pasted llama-server command as ``dialect`` reads it (errors in ``.errors``; the
    refusals that depend on devices and model come from ``check_semantics``)."""
    return parse_server_args(split_command_text(text), dialect=Dialect(dialect))


#: How a pasted command's refusal starts among its notes (the window lists those as errors).
REFUSED = "pasted command: llama-server would refuse it: "


def plan_from_command(plan: Plan, text: str) -> tuple[Plan, list[str]]:
    """A plan for the open model and devices built from a pasted llama-server command line, and
    notes for the user (llama-server's refusals, warnings, a different -m)."""
    parsed = read_command(text, plan.dialect)
    args = parsed.args
    devices = plan.devices
    rpc = list(args.rpc_servers or [])
    if rpc:  # llama.cpp lists RPC servers first
        rpc_devs = tuple(
            Device(f"RPC{i}", DeviceKind.RPC, description=f"RPC server {ep}", source="rpc", endpoint=ep)
            for i, ep in enumerate(rpc)
        )
        devices = DeviceSet(
            devices.cpu, rpc_devs + tuple(g for g in devices.gpus if g.kind is not DeviceKind.RPC)
        )
    errors = [*parsed.errors, *check_semantics(parsed, devices.names, is_mla=plan.model.summary.is_mla,
                                                             arch=plan.model.arch)]
    notes = [f"{REFUSED}{e}" for e in errors]
    notes += [f"pasted command: {w}" for w in parsed.warnings]
    notes += [f"pasted command: {w}" for w in skipped_devices(parsed, devices.names)]
    notes += [f"pasted command: {w}" for w in ignored_draft_devices(parsed) + draft_params_notes(parsed)]
    if args.model and Path(args.model).name != Path(plan.model.path).name:
        notes.append(
            f"pasted command: -m {args.model} is not the open model; the plan uses {plan.model.path}"
        )
    new = plan_from_args(plan.model, devices, parsed, plan.dialect)
    return replace(new, moves={}), notes
