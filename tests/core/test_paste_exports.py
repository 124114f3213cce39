"""Paste command… reads back what the Command tab's formats write: PowerShell's call operator and its
'' quotes, the legacy block for Windows PowerShell 5.1, cmd.exe's ^ escapes and its REM line. A
PowerShell command whose program path was quoted (``& 'C:\\llama cpp\\llama-server.exe' ...``) was read
as a positional argument llama-server refuses."""

from __future__ import annotations

import pytest

from offload_planner.core.cmdline import format_command
from offload_planner.core.command_text import split_command_text

ARGVS = [
    ["C:\\llama cpp\\llama-server.exe", "-m", "C:\\models\\m.gguf", "-c", "512"],
    ["llama-server", "-m", "m.gguf", "--alias", "it's \u2019quoted\u2019", "-ot", "blk\\.(1|2)\\.=CPU"],
    ["llama-server", "-m", "m.gguf", "-a", 'x"y', "--alias", "", "--x", "C:\\my models\\", "-y", "a&b|c^d"],
    ["llama-server", "-m", "m.gguf", "-ot", "blk\\.(?!0\\.).*=CPU", "--alias", "a b", "-z", 'q"&"r'],
]


@pytest.mark.parametrize("argv", ARGVS)
@pytest.mark.parametrize("multiline", [False, True])
def test_powershell_exports_read_back(argv: list[str], multiline: bool) -> None:
    """The forms only PowerShell writes: the call operator, the legacy block, ` continuations. One line
    of bare words and '...' is read as bash (the same text in both but for '' inside quotes)."""
    text = format_command(argv, "powershell", multiline=multiline)
    if multiline or text.startswith("& "):
        assert split_command_text(text) == argv


@pytest.mark.parametrize("argv", ARGVS)
def test_cmd_exports_read_back(argv: list[str]) -> None:
    """The multi-line form (its ^ continuations say cmd), and any form with the REM line."""
    assert split_command_text(format_command(argv, "cmd", multiline=True)) == argv
    one_line = format_command(argv, "cmd")
    if one_line.startswith("REM "):
        assert split_command_text(one_line) == argv


def test_comment_lines_are_not_arguments() -> None:
    assert split_command_text("# from my notes\nllama-server -c 512\n") == ["llama-server", "-c", "512"]
    assert split_command_text("REM x\r\nllama-server ^\r\n  -c 512") == ["llama-server", "-c", "512"]
