"""Reading untrusted JSON field by field: every value is checked for its type and range, and a bad
one is reported with its JSON path (``$.devices.gpus[0].total``).

``parse_json`` reads text strictly (no NaN/Infinity, no number that is not finite, no nesting the
parser cannot hold); :class:`At` wraps a value with its path and offers typed accessors that raise
:class:`JsonFieldError` naming the path.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from offload_planner.core.errors import PlannerError

_MISSING: Any = object()
#: Deeper than any file we write; ``json`` itself gives up (RecursionError) around 1,000 levels.
MAX_DEPTH = 32


class JsonFieldError(PlannerError):
    """A JSON value of the wrong type or out of range; ``path`` is where it is."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.detail = message
        super().__init__(f"{path}: {message}")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str) -> Any:
    """``json.loads`` that refuses NaN, Infinity, numbers that overflow to infinity and a key given
    twice in one object.

    Raises ValueError (malformed text, an integer of thousands of digits) or RecursionError (deep
    nesting); callers turn both into their own error naming the file."""
    data = json.loads(text, parse_float=_finite, parse_constant=_no_constant, object_pairs_hook=_unique)
    _check_depth(data)
    return data


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are each given once (``json`` keeps the last of a repeated key silently: a
    hand-edited ``"free"`` written twice would plan against whichever came last)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key[:40]!r} is given twice in one object")
        out[key] = value
    return out


def _check_depth(data: Any) -> None:
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


@dataclass(frozen=True)
class At:
    """A JSON value and where it is in the document."""

    value: Any
    path: str = "$"

    def fail(self, message: str) -> JsonFieldError:
        return JsonFieldError(self.path, message)

    def _expected(self, what: str) -> JsonFieldError:
        return self.fail(f"expected {what}, found {_kind(self.value)}")

    # --- containers ------------------------------------------------------------------------

    def obj(self) -> dict[str, Any]:
        if not isinstance(self.value, dict):
            raise self._expected("an object")
        return self.value

    def key(self, name: str, default: Any = _MISSING) -> At:
        """The member ``name``; required unless a default is given (null is a value: the accessor
        decides whether it may be null)."""
        data = self.obj()
        path = f"{self.path}.{name}"
        if name not in data:
            if default is _MISSING:
                raise JsonFieldError(path, "missing")
            return At(default, path)
        return At(data[name], path)

    def items(self, *, max_len: int) -> list[tuple[str, At]]:
        """The members; a key that is not valid Unicode is refused like a bad value."""
        data = self.obj()
        if len(data) > max_len:
            raise self.fail(f"{len(data):,} entries (at most {max_len:,})")
        out = []
        for k, v in data.items():
            at = At(v, f"{self.path}[{json.dumps(k)[:80]}]")
            if not _encodable(k):
                raise at.fail("the key is not valid Unicode (a lone surrogate escape)")
            out.append((k, at))
        return out

    def elements(self, *, max_len: int) -> list[At]:
        if not isinstance(self.value, list):
            raise self._expected("a list")
        if len(self.value) > max_len:
            raise self.fail(f"{len(self.value):,} entries (at most {max_len:,})")
        return [At(v, f"{self.path}[{i}]") for i, v in enumerate(self.value)]

    # --- scalars ---------------------------------------------------------------------------

    def text(self, *, max_len: int = 4096, nonempty: bool = False) -> str:
        """A string without NUL characters (they cannot go into a path or a command line)."""
        v = self.value
        if not isinstance(v, str):
            raise self._expected("a string")
        if len(v) > max_len:
            raise self.fail(f"string of {len(v):,} characters (at most {max_len:,})")
        if "\0" in v:
            raise self.fail("contains a NUL character")
        if not _encodable(v):
            raise self.fail("not valid Unicode (a lone surrogate escape)")
        if nonempty and not v.strip():
            raise self.fail("empty")
        return v

    def choice(self, options: Sequence[str]) -> str:
        v = self.text(max_len=256)
        if v not in options:
            raise self.fail(f"{v!r} is not one of {', '.join(options)}")
        return v

    def boolean(self) -> bool:
        if not isinstance(self.value, bool):
            raise self._expected("true or false")
        return self.value

    def integer(self, lo: int, hi: int) -> int:
        v = self.value
        if isinstance(v, bool) or not isinstance(v, int):
            raise self._expected("an integer")
        if not lo <= v <= hi:
            shown = str(v) if abs(v) < 10**30 else f"an integer of {len(str(abs(v)))} digits"
            raise self.fail(f"{shown} is out of range ({lo:,}..{hi:,})")
        return v

    def opt_integer(self, lo: int, hi: int) -> int | None:
        return None if self.value is None else self.integer(lo, hi)

    def number(self, lo: float, hi: float) -> float:
        v = self.value
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self._expected("a number")
        f = float(v) if not isinstance(v, int) or abs(v) < 2**1000 else math.inf
        if not (math.isfinite(f) and lo <= f <= hi):
            raise self.fail(f"{v if math.isfinite(f) else 'a huge number'} is out of range ({lo:g}..{hi:g})")
        return f

    def opt_number(self, lo: float, hi: float) -> float | None:
        return None if self.value is None else self.number(lo, hi)
