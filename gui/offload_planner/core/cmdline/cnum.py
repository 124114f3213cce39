"""C++ number parsing as llama.cpp uses it: ``std::stoi``, ``std::stof``, ``std::stoull``.

They skip leading whitespace, read the longest valid prefix and ignore the rest (``-c 12x`` is 12;
:func:`ignored_tail` says what was ignored), and throw ``std::invalid_argument`` /
``std::out_of_range`` whose ``what()`` is the function name.  Digits are ASCII only: ``strtol`` in
the C locale does not read ``１２３`` (full-width), though Python's ``int()`` would.
"""

from __future__ import annotations

import math
import re

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
_WS = " \t\n\v\f\r"
_INT = re.compile(r"[+-]?[0-9]+")
_HEX_FLOAT = re.compile(r"[+-]?0[xX]([0-9a-fA-F]*\.?[0-9a-fA-F]*)([pP][+-]?[0-9]+)?")
_DEC_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_SPECIAL_FLOAT = re.compile(r"[+-]?(inf(inity)?|nan(\([0-9A-Za-z_]*\))?)", re.IGNORECASE | re.ASCII)
_FLT_MAX = 3.4028234663852886e38


class CNumberError(ValueError):
    """A conversion failure; ``str()`` is the C++ ``what()`` text ("stoi", "stof", ...) and
    ``reason`` says it for a person ("expected an integer")."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(what)
        self.reason = reason

    def about(self, flag: str, value: str) -> str:
        """``-ngl abc: expected an integer`` (``LLAMA_ARG_N_GPU_LAYERS=abc: ...`` for a variable)."""
        return f"{flag}{'=' if flag.startswith('LLAMA_') else ' '}{value}: {self.reason}"


def _not_a_number(what: str, text: str, kind: str) -> CNumberError:
    if any(c.isdigit() and not c.isascii() for c in text):
        return CNumberError(what, f"expected {kind} in ASCII digits 0-9")
    return CNumberError(what, f"expected {kind}")


def stoi(text: str) -> int:
    m = _INT.match(text.lstrip(_WS))
    if not m:
        raise _not_a_number("stoi", text, "an integer")
    value = int(m.group(0))
    if not INT_MIN <= value <= INT_MAX:
        raise CNumberError("stoi", f"out of range (a 32-bit int: {INT_MIN} to {INT_MAX})")
    return value


def stoull(text: str) -> int:
    """``std::stoull`` (strtoull): a leading ``-`` negates modulo 2**64, as C does."""
    m = _INT.match(text.lstrip(_WS))
    if not m:
        raise _not_a_number("stoull", text, "an integer")
    digits = m.group(0)
    magnitude = int(digits.lstrip("+-"))
    if magnitude >= 2**64:
        raise CNumberError("stoull", "out of range (a 64-bit unsigned integer)")
    return (2**64 - magnitude) % 2**64 if digits.startswith("-") else magnitude


def stoul(text: str) -> int:
    """``std::stoul``: ``std::stoull``'s reading where ``unsigned long`` has 64 bits (LP64, where
    llama-server runs), with its own name in the error."""
    try:
        return stoull(text)
    except CNumberError as e:
        raise CNumberError("stoul", e.reason) from None


def _float_prefix(s: str) -> tuple[str, str] | None:
    """(kind, text) of the number ``strtof`` reads at the start of ``s``: special, hex or dec."""
    special = _SPECIAL_FLOAT.match(s)
    if special:
        return "special", special.group(0)
    hexm = _HEX_FLOAT.match(s)
    if hexm and any(c in "0123456789abcdefABCDEF" for c in hexm.group(1)):
        return "hex", hexm.group(0)
    m = _DEC_FLOAT.match(s)
    return ("dec", m.group(0)) if m else None


def stof(text: str) -> float:
    found = _float_prefix(text.lstrip(_WS))
    if found is None:
        raise _not_a_number("stof", text, "a number")
    kind, number = found
    if kind == "special":
        word = number.lstrip("+-").lower()
        sign = -1.0 if number.startswith("-") else 1.0
        return sign * (math.inf if word.startswith("inf") else math.nan)
    value = _hex_float(number) if kind == "hex" else float(number)
    if math.isinf(value) or abs(value) > _FLT_MAX:
        raise CNumberError("stof", "out of range for a float")
    return value


def ignored_tail(text: str, *, floating: bool = False) -> str:
    """What ``std::stoi`` (or ``std::stof`` with ``floating``) leaves unread after the number:
    ``"k"`` for ``"32k"``; empty when the whole text is the number (or none was read)."""
    s = text.lstrip(_WS)
    if floating:
        found = _float_prefix(s)
        return s[len(found[1]):] if found else ""
    m = _INT.match(s)
    return s[m.end():] if m else ""


def _hex_float(text: str) -> float:
    body = text.lstrip("+-")[2:]
    mantissa, _, exp = body.lower().partition("p")
    whole, _, frac = mantissa.partition(".")
    value = int(whole or "0", 16) + (int(frac, 16) / 16 ** len(frac) if frac else 0.0)
    value *= 2.0 ** int(exp or "0")
    return -value if text.startswith("-") else value
