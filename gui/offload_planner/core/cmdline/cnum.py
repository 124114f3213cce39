"""C++ number parsing as llama.cpp uses it: ``std::stoi``, ``std::stof``, ``std::stoull``.

They skip leading whitespace, read the longest valid prefix and ignore the rest (``-c 12x`` is 12),
and throw ``std::invalid_argument`` / ``std::out_of_range`` whose ``what()`` is the function name.
"""

from __future__ import annotations

import math
import re

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
_WS = " \t\n\v\f\r"
_INT = re.compile(r"[+-]?\d+")
_HEX_FLOAT = re.compile(r"[+-]?0[xX]([0-9a-fA-F]*\.?[0-9a-fA-F]*)([pP][+-]?\d+)?")
_DEC_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_SPECIAL_FLOAT = re.compile(r"[+-]?(inf(inity)?|nan(\([0-9A-Za-z_]*\))?)", re.IGNORECASE)
_FLT_MAX = 3.4028234663852886e38


class CNumberError(ValueError):
    """A conversion failure; ``str()`` is the C++ ``what()`` text ("stoi", "stof", ...)."""


def stoi(text: str) -> int:
    m = _INT.match(text.lstrip(_WS))
    if not m:
        raise CNumberError("stoi")
    value = int(m.group(0))
    if not INT_MIN <= value <= INT_MAX:
        raise CNumberError("stoi")
    return value


def stoull(text: str) -> int:
    """``std::stoull`` (strtoull): a leading ``-`` negates modulo 2**64, as C does."""
    m = _INT.match(text.lstrip(_WS))
    if not m:
        raise CNumberError("stoull")
    digits = m.group(0)
    magnitude = int(digits.lstrip("+-"))
    if magnitude >= 2**64:
        raise CNumberError("stoull")
    return (2**64 - magnitude) % 2**64 if digits.startswith("-") else magnitude


def stof(text: str) -> float:
    s = text.lstrip(_WS)
    special = _SPECIAL_FLOAT.match(s)
    if special:
        word = special.group(0).lstrip("+-").lower()
        sign = -1.0 if special.group(0).startswith("-") else 1.0
        return sign * (math.inf if word.startswith("inf") else math.nan)
    hexm = _HEX_FLOAT.match(s)
    if hexm and any(c in "0123456789abcdefABCDEF" for c in hexm.group(1)):
        value = _hex_float(hexm.group(0))
    else:
        m = _DEC_FLOAT.match(s)
        if not m:
            raise CNumberError("stof")
        value = float(m.group(0))
    if math.isinf(value) or abs(value) > _FLT_MAX:
        raise CNumberError("stof")
    return value


def _hex_float(text: str) -> float:
    body = text.lstrip("+-")[2:]
    mantissa, _, exp = body.lower().partition("p")
    whole, _, frac = mantissa.partition(".")
    value = int(whole or "0", 16) + (int(frac, 16) / 16 ** len(frac) if frac else 0.0)
    value *= 2.0 ** int(exp or "0")
    return -value if text.startswith("-") else value
