"""Byte sizes: parse ``24GiB``/``24G``/``24000MB`` and format as llama.cpp users read them."""

from __future__ import annotations

import re

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

_UNITS = {
    "": 1, "b": 1,
    "k": KiB, "kb": 1000, "kib": KiB,
    "m": MiB, "mb": 1000**2, "mib": MiB,
    "g": GiB, "gb": 1000**3, "gib": GiB,
    "t": TiB, "tb": 1000**4, "tib": TiB,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """``24GiB`` -> bytes. Bare ``G``/``M`` are binary units, as in llama.cpp's messages."""
    m = _SIZE_RE.match(text)
    if m is None or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. 24GiB, 8000MiB, 12G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


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
