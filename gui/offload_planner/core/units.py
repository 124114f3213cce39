"""Byte sizes: parse ``24GiB``/``24G``/``24000MB`` and format as llama.cpp users read them."""

from __future__ import annotations

import re

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

_UNITS = {
    "b": 1,
    "k": KiB, "kb": 1000, "kib": KiB,
    "m": MiB, "mb": 1000**2, "mib": MiB,
    "g": GiB, "gb": 1000**3, "gib": GiB,
    "t": TiB, "tb": 1000**4, "tib": TiB,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$", re.ASCII)


def pad(x: int, n: int) -> int:
    """``x`` rounded up to a multiple of ``n`` (GGML_PAD: an alignment, a cell count)."""
    return -(-x // n) * n


#: The largest size taken (1 EiB), beyond any device; also keeps the size an int64.
MAX_SIZE = 1 << 60

SIZE_FORMS = "24GiB, 24G (both 24 x 1024^3 bytes), 24GB (24 x 1000^3), 8000MiB, 1TiB or 4096B"


def parse_size(text: str) -> int:
    """``24GiB`` -> bytes. Bare ``G``/``M`` are binary units, as in llama.cpp's messages. A number
    without a unit is refused (``24`` is too easily meant as GiB): bytes are written ``4096B``."""
    m = _SIZE_RE.match(text)
    if m is not None and not m.group(2):
        raise ValueError(f"size {text.strip()!r} has no unit: write e.g. {text.strip()}GiB "
                         f"(accepted: {SIZE_FORMS})")
    if m is None or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (accepted: {SIZE_FORMS})")
    size = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not size < MAX_SIZE:  # also infinity: a 400-digit number
        raise ValueError(f"size {text.strip()!r} is too large (at most 1 EiB)")
    return int(size)


def fmt_bytes(n: float, *, precision: int = 2) -> str:
    """Human size with binary units: ``376.71 GiB``, ``12.50 MiB``."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{sign}{n / size:.{precision}f} {unit}"
    return f"{sign}{int(n)} B"


def mib(n: float) -> float:
    return n / MiB
