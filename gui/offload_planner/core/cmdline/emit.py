"""Showing a llama-server command line for a shell, llama-swap or docker (display/copy only).

Nothing produced here is ever handed to a shell by the planner: the app runs llama-server with
an argument list.  ``format_command`` output is for people to paste.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from enum import StrEnum
from pathlib import PurePath, PureWindowsPath

from offload_planner.core.cmdline.envform import ArgGroup, args_to_env, group_args
from offload_planner.core.cmdline.parse import split_program
from offload_planner.core.cmdline.quoting import quote_cmd, quote_posix, quote_powershell
from offload_planner.core.dialects.base import Dialect

PORT_MACRO = "${PORT}"


class Style(StrEnum):
    BASH = "bash"
    POWERSHELL = "powershell"
    CMD = "cmd"
    LLAMA_SWAP = "llama-swap"
    DOCKER_ENV = "docker-env"


def _lines(argv: Sequence[str], dialect: Dialect, quote: Callable[[str], str]) -> list[str]:
    """The program, then one line per flag with its values, each token quoted."""
    program, args = split_program(argv)
    out = [quote(program)] if program is not None else []
    out.extend(" ".join(quote(t) for t in g.tokens) for g in group_args(args, dialect))
    return out


def _join(lines: list[str], multiline: bool, continuation: str) -> str:
    return f"{continuation}\n  ".join(lines) if multiline else " ".join(lines)


def _powershell(argv: Sequence[str], dialect: Dialect, multiline: bool) -> str:
    lines = _lines(argv, dialect, quote_powershell)
    program, _ = split_program(argv)
    if program is not None and lines and lines[0].startswith("'"):
        lines[0] = "& " + lines[0]  # a quoted program needs the call operator
    return _join(lines, multiline, " `")


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


def _llama_swap(argv: Sequence[str], dialect: Dialect, name: str | None) -> str:
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
    key = json.dumps(name or _model_name(groups))
    body = "\n".join(f"      {line}" for line in lines)
    return f"models:\n  {key}:\n    cmd: |\n{body}\n"


def _docker_env(argv: Sequence[str], dialect: Dialect) -> str:
    _program, args = split_program(argv)
    split = args_to_env(args, dialect)
    lines = [f"{k}={v}" for k, v in split.env.items()]
    lines.extend(f"# note: {n}" for n in split.notes)
    if split.rest:  # an empty "# command ...: " line read as if something were missing
        command = " ".join(quote_posix(t) for t in split.rest)
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
        return _join(_lines(argv, dialect, quote_posix), multiline, " \\")
    if kind is Style.POWERSHELL:
        return _powershell(argv, dialect, multiline)
    if kind is Style.CMD:
        return _join(_lines(argv, dialect, quote_cmd), multiline, " ^")
    if kind is Style.LLAMA_SWAP:
        return _llama_swap(argv, dialect, name)
    return _docker_env(argv, dialect)
