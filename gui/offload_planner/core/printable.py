"""Text that is safe to print or show: control characters written as escapes.

One escaper for every message, log line and report (the server's log through
``backend.log_lines``, command-line messages through ``core.cmdline.quoting.visible``, ``inspect``):
C0 controls but tab, DEL, C1 controls (``\\x9b`` is a terminal's CSI), the Unicode line and paragraph
separators, the bidirectional embeddings/overrides/isolates, the byte-order mark and surrogates (an
undecodable byte of a path or of a server's output, kept by ``surrogateescape``, shows as that byte:
``\\xff``).  Escapes: ``\\n``, ``\\r``, ``\\x1b`` below U+0100, ``\\u202e`` above.
"""

from __future__ import annotations

import re

#: What gets escaped (inclusive code point ranges).
ESCAPED_RANGES = ((0x00, 0x08), (0x0A, 0x1F), (0x7F, 0x9F), (0x2028, 0x202E), (0x2066, 0x2069),
                  (0xFEFF, 0xFEFF), (0xD800, 0xDFFF))
_NEWLINE = 0x0A
_PLAIN_ASCII = bytes([9, *range(32, 127)])  # tab and the printable ASCII characters
_PLAIN_ASCII_LINES = _PLAIN_ASCII + b"\n"


def _escape(code: int) -> str:
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte
        return f"\\x{code - 0xDC00:02x}"
    return {0x0A: "\\n", 0x0D: "\\r"}.get(code) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def _ranges(keep_newlines: bool) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in ESCAPED_RANGES:
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


#: One character :func:`printable` escapes.
CONTROL = _class(False)
_CONTROL_BUT_NEWLINE = _class(True)
_ESCAPES = {c: _escape(c) for c in _codes(False)}  # str.translate tables
_ESCAPES_BUT_NEWLINE = {c: _escape(c) for c in _codes(True)}


def is_plain(text: str, keep_newlines: bool = False) -> bool:
    """No character :func:`printable` would escape (ASCII, the usual case, is checked in C)."""
    if text.isascii():
        return not text.encode("ascii").translate(None, _PLAIN_ASCII_LINES if keep_newlines else _PLAIN_ASCII)
    return not (_CONTROL_BUT_NEWLINE if keep_newlines else CONTROL).search(text)


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control character but tab (and newlines, if asked) written as an escape:
    ``\\x1b``, ``\\r``, ``\\u202e``; an undecodable byte kept by ``surrogateescape`` as ``\\xff``."""
    if is_plain(text, keep_newlines):
        return text
    return text.translate(_ESCAPES_BUT_NEWLINE if keep_newlines else _ESCAPES)
