"""cmd.exe tracks double quotes across the whole line, not per argument: an argument with an odd number
of ``"`` in its written form (``"x\\"y"``: cmd sees three quotes) left cmd inside quotes for the next
argument and outside them inside the next quoted one, where ``&`` ran a command of its own
(``--alias "a&calc.exe&b"`` started calc.exe)."""

from __future__ import annotations

import pytest
from tests.core.test_cmdline_emit import _cmd_then_argv

from offload_planner.core.cmdline import format_command

META = "&|<>()"


def _unescaped_outside_quotes(line: str) -> list[int]:
    """Where cmd.exe (quote state over the whole line, ``^`` escaping the next character outside
    quotes) sees a metacharacter it acts on."""
    found, in_quotes, i = [], False, 0
    while i < len(line):
        ch = line[i]
        if ch == "^" and not in_quotes:
            i += 2
            continue
        if ch == '"':
            in_quotes = not in_quotes
        elif ch in META and not in_quotes:
            found.append(i)
        i += 1
    return found


@pytest.mark.parametrize("argv", [
    ["llama-server", "-a", 'x"y', "--alias", "a&calc.exe&b"],
    ["llama-server", "--alias", 'q"', "-m", "C:\\m (1)\\x.gguf", "-ot", "a|b=CPU"],
    ["llama-server", "-a", 'a"b\\', "-x", "<in>", "-y", '"', "-z", "p&q"],
    ["llama-server", "-a", '"a"b"', "-b", "x y", "-c", "&"],
])
@pytest.mark.parametrize("multiline", [False, True])
def test_no_metacharacter_reaches_cmd_unescaped(argv: list[str], multiline: bool) -> None:
    text = format_command(argv, "cmd", multiline=multiline)
    for line in text.split("\n"):
        assert _unescaped_outside_quotes(line) == [], (line, argv)
        assert not line.endswith("^") or _ends_outside_quotes(line), line  # a continuation cmd reads
    assert _cmd_then_argv(text) == argv


def _ends_outside_quotes(line: str) -> bool:
    in_quotes, i = False, 0
    while i < len(line) - 1:
        if line[i] == "^" and not in_quotes:
            i += 2
            continue
        if line[i] == '"':
            in_quotes = not in_quotes
        i += 1
    return not in_quotes
