"""A server's output as lines that are safe to print or show: linear time, bounded memory, no
control characters.

:class:`LineSplitter` takes the bytes as they arrive, decodes UTF-8 incrementally (an invalid byte
becomes the text ``\\xff``), splits at ``\\n`` (dropping a ``\\r`` before it) and escapes control
characters with :func:`printable` (the decoder keeps invalid bytes as surrogates, which is fast;
they are written as ``\\xff`` there).  A line longer than :data:`MAX_LINE_CHARS` is cut: its first
:data:`MAX_LINE_CHARS` characters come out at once, ending in :data:`CUT_MARK`, the rest is only
counted, and when its newline arrives one more line says how many characters were dropped.  Between
reads only the unfinished line is kept, never more than :data:`MAX_LINE_CHARS` of it, so a backend
printing gigabytes without a newline costs constant memory and time linear in what it printed.

:func:`printable` escapes C0 controls but tab, DEL, C1 controls (``\\x9b`` is a terminal's CSI), the
Unicode line and paragraph separators, the bidirectional overrides and lone surrogates;
:func:`safe_line` does that and the cut for a line from anywhere else (the log view uses it on
everything it is given).
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Sequence

MAX_LINE_CHARS = 4096
CUT_MARK = " …[line cut]"
#: The longest line :class:`LineSplitter` and :func:`safe_line` return.
LINE_LIMIT = MAX_LINE_CHARS + len(CUT_MARK)

#: What gets escaped: C0 controls but tab, DEL and C1 controls, line and paragraph separators,
#: bidirectional embeddings/overrides/isolates, surrogates (undecodable bytes, from surrogateescape).
_ESCAPED_RANGES = ((0x00, 0x08), (0x0A, 0x1F), (0x7F, 0x9F), (0x2028, 0x202E), (0x2066, 0x2069),
                   (0xD800, 0xDFFF))
_NEWLINE = 0x0A
_PLAIN_ASCII = bytes([9, *range(32, 127)])  # tab and the printable ASCII characters
_PLAIN_ASCII_LINES = _PLAIN_ASCII + b"\n"


def _escape(code: int) -> str:
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte
        return f"\\x{code - 0xDC00:02x}"
    return {0x0A: "\\n", 0x0D: "\\r"}.get(code) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def _ranges(keep_newlines: bool) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in _ESCAPED_RANGES:
        if keep_newlines and lo <= _NEWLINE <= hi:
            out += [r for r in ((lo, _NEWLINE - 1), (_NEWLINE + 1, hi)) if r[0] <= r[1]]
        else:
            out.append((lo, hi))
    return out


def _codes(keep_newlines: bool) -> list[int]:
    return [c for lo, hi in _ranges(keep_newlines) for c in range(lo, hi + 1)]


def _class(keep_newlines: bool) -> re.Pattern[str]:
    return re.compile("[" + "".join(f"{re.escape(chr(lo))}-{re.escape(chr(hi))}"
                                     for lo, hi in _ranges(keep_newlines)) + "]")


_CONTROL_RE = _class(False)
_CONTROL_BUT_NEWLINE_RE = _class(True)
_ESCAPES = {c: _escape(c) for c in _codes(False)}  # str.translate tables
_ESCAPES_BUT_NEWLINE = {c: _escape(c) for c in _codes(True)}


def _plain(text: str, keep_newlines: bool = False) -> bool:
    """No character :func:`printable` would escape (ASCII, the usual case, is checked in C)."""
    if text.isascii():
        return not text.encode("ascii").translate(None, _PLAIN_ASCII_LINES if keep_newlines else _PLAIN_ASCII)
    return not (_CONTROL_BUT_NEWLINE_RE if keep_newlines else _CONTROL_RE).search(text)


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control character but tab (and newlines, if asked) written as an escape:
    ``\\x1b``, ``\\r``, ``\\u202e``; an undecodable byte kept by ``surrogateescape`` as ``\\xff``."""
    if _plain(text, keep_newlines):
        return text
    return text.translate(_ESCAPES_BUT_NEWLINE if keep_newlines else _ESCAPES)


def safe_line(text: str) -> str:
    """:func:`printable`, then cut to :data:`LINE_LIMIT` characters (a no-op on splitter output)."""
    text = printable(text)
    return text if len(text) <= LINE_LIMIT else text[:MAX_LINE_CHARS] + CUT_MARK


def safe_lines(lines: Sequence[str]) -> Sequence[str]:
    """:func:`safe_line` of each line; one scan and no copy when they are all safe already."""
    if not lines or (max(map(len, lines)) <= LINE_LIMIT and _plain("".join(lines))):
        return lines
    return [safe_line(line) for line in lines]


def dropped_note(n: int) -> str:
    return f"…[{n:,} more characters of the line above dropped]"


class LineSplitter:
    """Bytes in, complete printable lines out (see the module)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        self._parts: list[str] = []  # the unfinished line, in pieces
        self._held = 0  # characters in _parts
        self._dropped: int | None = None  # characters dropped of an over-long line (None: not cut)

    @property
    def buffered(self) -> int:
        """Characters of the unfinished line held (at most :data:`MAX_LINE_CHARS`)."""
        return self._held

    @property
    def partial(self) -> str:
        """The unfinished line so far (empty once it was cut)."""
        return "".join(self._parts)

    def feed(self, data: bytes) -> list[str]:
        """The lines ``data`` completes."""
        return self._split(self._decoder.decode(data))

    def finish(self) -> list[str]:
        """The lines still pending at the end of the output (the last one may lack its newline)."""
        out = self._split(self._decoder.decode(b"", final=True))
        if self._held or self._dropped is not None:
            self._end_line(out)
        return out

    def _split(self, text: str) -> list[str]:
        out: list[str] = []
        pieces = text.split("\n")
        rest = pieces.pop()  # after the last newline: the start of the next line
        if pieces:
            self._hold(pieces[0], out)  # completes the line held from earlier reads
            self._end_line(out)
            out += self._complete(pieces[1:], clean=_plain(text, keep_newlines=True))
        if rest:
            self._hold(rest, out)
        return out

    def _complete(self, lines: list[str], clean: bool) -> list[str]:
        """Whole lines read in one piece: as they are when ``clean`` and short (the usual case)."""
        if not lines or (clean and max(map(len, lines)) <= MAX_LINE_CHARS):
            return lines
        out: list[str] = []
        for line in lines:
            self._hold(line, out)
            self._end_line(out)
        return out

    def _hold(self, piece: str, out: list[str]) -> None:
        if self._dropped is not None:
            self._dropped += len(piece)
            return
        room = MAX_LINE_CHARS - self._held
        if len(piece) <= room:
            self._parts.append(piece)
            self._held += len(piece)
            return
        self._parts.append(piece[:room])
        out.append(safe_line("".join(self._parts))[:MAX_LINE_CHARS] + CUT_MARK)
        self._parts, self._held, self._dropped = [], 0, len(piece) - room

    def _end_line(self, out: list[str]) -> None:
        if self._dropped is not None:
            out.append(dropped_note(self._dropped))
        else:
            line = "".join(self._parts)
            out.append(safe_line(line[:-1] if line.endswith("\r") else line))
        self._parts, self._held, self._dropped = [], 0, None
