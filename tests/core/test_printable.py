"""One escaper for messages and logs: ``core.printable.printable``, which both the log lines
(``backend.log_lines``) and command-line messages (``core.cmdline.quoting.visible``) use."""

from __future__ import annotations

import pytest

from offload_planner.backend.log_lines import LineSplitter, safe_line
from offload_planner.core.cmdline.quoting import quote_bash, visible
from offload_planner.core.printable import CONTROL, printable

HOSTILE = ["\x1b[2J", "a\rb", "\x9b31m", "\x7f", "l\u2028s", "\u202eevil", "\u2066i", "\ufeffbom",
           "bad\udcffbyte", "lone\ud800", "tab\tok", "caf\u00e9"]


@pytest.mark.parametrize("text", HOSTILE)
def test_messages_and_log_lines_escape_alike(text: str) -> None:
    shown = printable(text)
    assert visible(text) == "'" + shown + "'"
    assert safe_line(text) == shown
    if "\ud800" not in text:  # no bytes decode to a lone high surrogate
        assert LineSplitter().feed(text.encode("utf-8", "surrogateescape") + b"\n") == [shown]
    assert not CONTROL.search(shown)


def test_the_escapes() -> None:
    assert printable("\x1b\r\x9b\u202e\ufeff\udcff\ud800\t") == "\\x1b\\r\\x9b\\u202e\\ufeff\\xff\\ud800\t"
    assert printable("a\nb", keep_newlines=True) == "a\nb" and printable("a\nb") == "a\\nb"


def test_bash_quoting_keeps_its_byte_escapes() -> None:
    """What bash reads back must be the bytes, whatever the locale: ``$'\\xe2\\x80\\xae'``, not ``\\u``."""
    assert quote_bash("a\u202eb\ufeff") == "$'a\\xe2\\x80\\xaeb\\xef\\xbb\\xbf'"
