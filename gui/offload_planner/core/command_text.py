"""Command lines as text: display formats (core ``format_command``) and reading a pasted command
(shell text -> argv -> core ``parse_server_args`` and ``check_semantics``)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from offload_planner.core.cmdline import Dialect, ParsedArgs, Style, format_command, parse_server_args

#: (style, label) of the formats the command pane offers.
STYLES: tuple[tuple[str, str], ...] = (
    (Style.BASH.value, "bash"),
    (Style.POWERSHELL.value, "PowerShell"),
    (Style.CMD.value, "cmd.exe"),
    (Style.LLAMA_SWAP.value, "llama-swap"),
    (Style.DOCKER_ENV.value, "docker env"),
)


def render(argv: Sequence[str], style: str, dialect: str, *, multiline: bool = False) -> str:
    return format_command(list(argv), style, dialect=Dialect(dialect), multiline=multiline)


def split_command_text(text: str) -> list[str]:
    """A pasted command as an argument list; line continuations of bash (\\), PowerShell (`) and
    cmd (^) are joined. The program name stays (the parser recognises it)."""
    for cont in ("\\\r\n", "\\\n", "`\r\n", "`\n", "^\r\n", "^\n"):
        text = text.replace(cont, " ")
    try:
        return shlex.split(text, comments=False, posix=True)
    except ValueError as e:
        raise ValueError(f"cannot split the command: {e}") from None


def read_command(text: str, dialect: str) -> ParsedArgs:
    """Parse a pasted llama-server command as ``dialect`` reads it (errors in ``.errors``; the
    refusals that depend on devices and model come from ``.check_semantics``)."""
    return parse_server_args(split_command_text(text), dialect=Dialect(dialect))
