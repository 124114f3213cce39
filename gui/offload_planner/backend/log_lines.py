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

:func:`printable` (core's one escaper, :mod:`offload_planner.core.printable`) escapes C0 controls but
tab, DEL, C1 controls (``\\x9b`` is a terminal's CSI), the Unicode line and paragraph separators, the
bidirectional overrides, the byte-order mark and lone surrogates; :func:`safe_line` does that and
the cut for a line from anywhere else (the log view uses it on everything it is given).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from offload_planner.core.printable import is_plain as _plain
from offload_planner.core.printable import printable

MAX_LINE_CHARS = 4096
CUT_MARK = " …[line cut]"
#: The longest line :class:`LineSplitter` and :func:`safe_line` return.
LINE_LIMIT = MAX_LINE_CHARS + len(CUT_MARK)
__all__ = ["CUT_MARK", "LINE_LIMIT", "MAX_LINE_CHARS", "LineSplitter", "dropped_note", "printable",
           "safe_line", "safe_lines"]


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
