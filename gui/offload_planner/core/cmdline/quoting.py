"""Quoting one argument for a shell, for display and copying only (nothing here is ever run)."""

from __future__ import annotations

import re

_POSIX_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_PS_SAFE = re.compile(r"[A-Za-z0-9_.:/\\=+-]+")
_CMD_META = "&|<>()^"


def quote_posix(arg: str) -> str:
    """POSIX sh: bare when only safe characters, else single quotes (``'`` as ``'"'"'``)."""
    if arg and _POSIX_SAFE.fullmatch(arg):
        return arg
    return "'" + arg.replace("'", "'\"'\"'") + "'"


def quote_powershell(arg: str) -> str:
    """PowerShell: single quotes (no expansion inside), ``'`` doubled.

    A bare word must not start with ``-`` followed by something PowerShell could read as a number
    or an operator, nor contain ``,;(){}$@#`'"`` or spaces; everything else is quoted.
    """
    if arg and _PS_SAFE.fullmatch(arg) and not arg.startswith(("--%", "@")):
        return arg
    return "'" + arg.replace("'", "''") + "'"


def msvcrt_quote(arg: str, force: bool = False) -> str:
    """Quote for ``CommandLineToArgvW`` / the MSVC runtime (backslashes before ``"`` doubled)."""
    if not force and arg and not any(c in arg for c in ' \t"'):
        return arg
    out = ['"']
    backslashes = 0
    for ch in arg:
        if ch == "\\":
            backslashes += 1
            continue
        if ch == '"':
            out.append("\\" * (2 * backslashes + 1) + '"')
        else:
            out.append("\\" * backslashes + ch)
        backslashes = 0
    out.append("\\" * (2 * backslashes) + '"')
    return "".join(out)


def quote_cmd(arg: str) -> str:
    """cmd.exe: MSVC-runtime quoting (double quotes around anything with cmd metacharacters), then
    ``^`` before each metacharacter that cmd itself sees outside double quotes (after a ``\\"``).

    ``%NAME%`` is still expanded by cmd when such a variable exists; nothing can prevent that
    inside double quotes on an interactive command line.
    """
    force = not arg or any(c in arg for c in _CMD_META)
    quoted = msvcrt_quote(arg, force)
    out: list[str] = []
    in_quotes = False
    for ch in quoted:
        if ch == '"':
            in_quotes = not in_quotes
        elif not in_quotes and ch in _CMD_META:
            out.append("^")
        out.append(ch)
    return "".join(out)
