"""Quoting one argument for a shell, for display and copying only (nothing here is ever run)."""

from __future__ import annotations

import re

from offload_planner.core.printable import CONTROL, printable

_POSIX_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_PS_SAFE = re.compile(r"[A-Za-z0-9_.:/\\=+-]+")
_CMD_META = "&|<>()^"
#: A bare word PowerShell breaks in two when it passes it to a program: ``-a.b`` as ``-a`` ``.b``
#: (PowerShell issue #6291, open), ``-v:x`` after ``--`` as ``-v:`` ``x`` (#17399).
_PS_SPLITS = re.compile(r"-[^.:]*[.:]")
#: PowerShell ends a single-quoted string at any of these (and reads any of them doubled as one).
_PS_SINGLE_QUOTES = "'\u2018\u2019\u201a\u201b"
#: Inside ``$'...'``: ``'`` and ``!`` as hex escapes, so an interactive shell's history expansion
#: that does not know ``$'...'`` (it ends the quote at ``\'``) finds no ``!`` to expand.
_ANSI_C = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", "'": "\\x27", "!": "\\x21"}


def quote_posix(arg: str) -> str:
    """POSIX sh: bare when only safe characters, else single quotes (``'`` as ``'"'"'``)."""
    if arg and _POSIX_SAFE.fullmatch(arg):
        return arg
    return "'" + arg.replace("'", "'\"'\"'") + "'"


def _ansi_c_char(ch: str) -> str:
    known = _ANSI_C.get(ch)
    if known is not None:
        return known
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte of the original path: that byte again
        return f"\\x{code - 0xDC00:02x}"
    if CONTROL.fullmatch(ch):  # one core.printable escapes: its UTF-8 bytes (exact in any locale)
        return "".join(f"\\x{b:02x}" for b in ch.encode("utf-8", "surrogatepass"))
    return ch


def quote_bash(arg: str) -> str:
    """bash: :func:`quote_posix`, except that an argument with a character :data:`CONTROL` matches
    is written ``$'...'`` with that character escaped (``\\n``, ``\\x1b``): bash gives back the
    same bytes, and printing the command shows the escape rather than acting on it.  An argument
    cannot hold NUL (execve ends it there); callers refuse that first."""
    if not CONTROL.search(arg):
        return quote_posix(arg)
    return "$'" + "".join(_ansi_c_char(ch) for ch in arg) + "'"


#: Bare words bash would not run as a command's name: its reserved words, and assignments.
_BASH_RESERVED = frozenset({"case", "coproc", "do", "done", "elif", "else", "esac", "fi", "for", "function",
                            "if", "in", "select", "then", "time", "until", "while"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")


def quote_bash_command(arg: str) -> str:
    """:func:`quote_bash` for the command's first word: a reserved word (``time``) or an assignment
    (``A=b``) is quoted too, so bash runs it as the program."""
    quoted = quote_bash(arg)
    if quoted == arg and (arg in _BASH_RESERVED or _ASSIGNMENT.match(arg)):
        return "'" + arg + "'"
    return quoted


def visible(arg: str, limit: int = 60) -> str:
    """``arg`` for a message: quoted, each :data:`CONTROL` character escaped (core's one escaper,
    :func:`~offload_planner.core.printable.printable`), cut at ``limit``."""
    return "'" + printable(arg[:limit]) + ("…" if len(arg) > limit else "") + "'"


def quote_powershell(arg: str) -> str:
    """PowerShell: single quotes (no expansion inside), ``'`` doubled, and so are the typographic
    single quotes ``‘ ’ ‚ ‛`` (PowerShell ends a single-quoted string at any of them too).  What
    reaches the program is exact in PowerShell 7.3 and later (Windows PowerShell 5.1 drops an empty
    argument and the ``"`` inside one: no single quoting serves both; ``emit`` writes a command with
    such an argument in the legacy form every version reads alike).

    A bare word must not start with ``-`` followed by something PowerShell could read as a number
    or an operator, nor contain ``,;(){}$@#`'"`` or spaces; everything else is quoted.
    """
    if arg and _PS_SAFE.fullmatch(arg) and not arg.startswith(("--%", "@")) and not _PS_SPLITS.match(arg):
        return arg
    return "'" + "".join(ch * 2 if ch in _PS_SINGLE_QUOTES else ch for ch in arg) + "'"


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

    ``%NAME%`` is expanded by cmd even inside double quotes and nothing on an interactive command
    line prevents it: ``format_command`` refuses a line with two ``%`` (and control characters,
    which cmd cannot carry).  ``!NAME!`` is left as it is: cmd expands it only with delayed
    expansion on (``cmd /v:on``), which an interactive cmd does not have by default; ``emit`` puts a
    ``REM`` line before such a command naming the argument.
    """
    force = not arg or any(c in arg for c in _CMD_META)
    quoted = msvcrt_quote(arg, force)
    out: list[str] = []
    in_quotes = False
    last = len(quoted) - 1
    for i, ch in enumerate(quoted):
        if ch == '"':
            if i == last and i > 0 and not in_quotes:
                # cmd tracks quotes over the whole line: with an odd number of them (an escaped \" in
                # the argument) this closing quote would leave cmd inside quotes for the arguments after
                # it, where its next opening quote takes it out (``&`` there ran a command); ^" passes
                # the quote without changing cmd's state
                out.append("^")
            else:
                in_quotes = not in_quotes
        elif not in_quotes and ch in _CMD_META:
            out.append("^")
        out.append(ch)
    return "".join(out)
