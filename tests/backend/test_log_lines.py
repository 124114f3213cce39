"""LineSplitter and printable: server output as safe lines in bounded memory (issue 12, point 7)."""

from __future__ import annotations

import random
import re

from offload_planner.backend.log_lines import (
    CUT_MARK,
    LINE_LIMIT,
    MAX_LINE_CHARS,
    LineSplitter,
    dropped_note,
    printable,
    safe_line,
)
from offload_planner.core.units import MiB

#: What a terminal or a list view must never be handed: C0 controls but tab, DEL, C1 controls,
#: line/paragraph separators, bidirectional overrides.
UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _feed(chunks: list[bytes]) -> tuple[list[str], int]:
    """All lines, and the most characters the splitter held between reads."""
    s = LineSplitter()
    lines: list[str] = []
    most = 0
    for c in chunks:
        lines += s.feed(c)
        most = max(most, s.buffered)
    return lines + s.finish(), most


def test_32_mib_without_a_newline_is_held_in_constant_memory() -> None:
    chunk = b"x" * 65536
    lines, most = _feed([chunk] * (32 * MiB // len(chunk)) + [b"\nafter\n"])
    assert most <= MAX_LINE_CHARS
    assert lines == ["x" * MAX_LINE_CHARS + CUT_MARK, dropped_note(32 * MiB - MAX_LINE_CHARS), "after"]
    assert lines[1] == "…[33,550,336 more characters of the line above dropped]"


def test_a_line_at_the_limit_is_whole_one_more_character_is_cut() -> None:
    at = b"a" * MAX_LINE_CHARS
    assert _feed([at + b"\n"])[0] == ["a" * MAX_LINE_CHARS]
    assert _feed([at, b"b\n"])[0] == ["a" * MAX_LINE_CHARS + CUT_MARK, dropped_note(1)]
    no_newline_at_the_end = [at + b"b"]
    assert _feed(no_newline_at_the_end)[0] == ["a" * MAX_LINE_CHARS + CUT_MARK, dropped_note(1)]


def test_terminal_escapes_and_invalid_utf8_are_shown_escaped() -> None:
    raw = b"\x1b]0;pwned\x07\x1b[2J\tok \x9b31m\r\ncaf\xc3\xa9 \xff\xfe \xe2\x80\xae evil\rover\n\x00"
    lines, _ = _feed([raw[i:i + 3] for i in range(0, len(raw), 3)])  # every UTF-8 sequence split
    assert lines == ["\\x1b]0;pwned\\x07\\x1b[2J\tok \\x9b31m",
                     "caf\u00e9 \\xff\\xfe \\u202e evil\\rover",
                     "\\x00"]


def test_binary_garbage_yields_only_printable_bounded_lines() -> None:
    rng = random.Random(12)
    data = rng.randbytes(2 * MiB)
    cuts = sorted(rng.sample(range(len(data)), 500))
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    lines, most = _feed(chunks)
    assert most <= MAX_LINE_CHARS and lines
    assert all(len(ln) <= LINE_LIMIT for ln in lines)
    assert not any(UNSAFE.search(ln) for ln in lines)
    assert sum(ln.count("\\x1b") for ln in lines) > 1000  # the ESC bytes are there, escaped


def test_printable_keeps_tabs_and_optionally_newlines_and_is_idempotent() -> None:
    assert printable("a\tb\nc\x1b") == "a\tb\\nc\\x1b"
    assert printable("a\tb\nc\x1b", keep_newlines=True) == "a\tb\nc\\x1b"
    assert printable("plain café ✓") == "plain café ✓"
    lines, _ = _feed([random.Random(3).randbytes(200_000)])
    assert [safe_line(ln) for ln in lines] == lines  # the log view's safe_line leaves them alone
    assert safe_line("\x1b" * MAX_LINE_CHARS) == "\\x1b" * (MAX_LINE_CHARS // 4) + CUT_MARK
