"""Metadata values read as llama.cpp reads them, checked before the planner computes with them.

llama.cpp reads hyperparameters with ``llama_model_loader::get_key``: a count is a ``uint32``, a
per-layer value a ``uint32`` or an array of at most ``LLAMA_MAX_LAYERS`` of them, and a model has
at most ``LLAMA_MAX_LAYERS`` blocks (``GGML_ASSERT`` in ``llama_model::load_hparams``).  A value
that breaks these (a float32 inf as a count, a NaN, 2^31 blocks, a negative count) is one
:class:`GGUFError` naming the file, the key and the byte offset of the key, not an OverflowError
or a 4 GB list later.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from offload_planner.core.errors import GGUFError

UINT32_MAX = 2**32 - 1
#: ``LLAMA_MAX_LAYERS`` (src/llama-hparams.h): llama.cpp asserts ``n_layer <= 512`` at load.
LLAMA_MAX_LAYERS = 512

PerLayer = int | list[int]


def _show(v: object) -> str:
    if isinstance(v, float):
        return repr(v)
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


class Meta:
    """Checked reads of one model's metadata; errors name the file, the key and its offset."""

    def __init__(self, path: str, md: Mapping[str, object], offsets: Mapping[str, int]) -> None:
        self.path = path
        self.md = md
        self.offsets = offsets

    def fail(self, key: str, message: str) -> GGUFError:
        return GGUFError(self.path, f"key {key!r}: {message}", self.offsets.get(key))

    def count(self, key: str, default: int = 0, *, hi: int = UINT32_MAX, what: str = "") -> int:
        """An unsigned 32-bit count (``default`` when absent); ``hi`` is a tighter bound."""
        v = self.md.get(key, None)
        if v is None:
            return default
        return self._int(key, v, hi, what)

    def _int(self, key: str, v: object, hi: int, what: str) -> int:
        if isinstance(v, bool):
            return int(v)
        if isinstance(v, float):
            raise self.fail(key, f"{_show(v)} is a float where llama.cpp reads an integer (uint32)")
        if not isinstance(v, int):
            kind = "an array" if hasattr(v, "__len__") and not isinstance(v, str) else f"a {type(v).__name__}"
            raise self.fail(key, f"{_show(v)} is {kind} where llama.cpp reads an integer (uint32)")
        if v < 0 or v > UINT32_MAX:
            raise self.fail(key, f"{v} is out of range for llama.cpp's uint32")
        if v > hi:
            raise self.fail(key, f"{v} {what or f'is over {hi}'}")
        return v

    def real(self, key: str, default: float) -> float:
        """A finite number (llama.cpp reads it as a float); ``default`` when absent."""
        v = self.md.get(key, None)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.fail(key, f"{_show(v)} is not a number")
        f = float(v) if isinstance(v, float) or abs(v) < 2**1000 else math.inf
        if not math.isfinite(f):
            raise self.fail(key, f"{_show(v)} is not a finite number")
        return f

    def per_layer(self, key: str, default: PerLayer, n_layer: int) -> PerLayer:
        """``get_key_or_arr``: one count for every layer, or an array of exactly ``n_layer`` counts
        (at most ``LLAMA_MAX_LAYERS``); an array whose values are all equal collapses to that value."""
        v = self.md.get(key, None)
        if v is None:
            return default
        if isinstance(v, int | float | bool):
            return self._int(key, v, UINT32_MAX, "")
        if isinstance(v, str) or not hasattr(v, "__len__"):
            raise self.fail(key, f"{_show(v)} is not a count nor an array of counts")
        length = len(v)
        if length > LLAMA_MAX_LAYERS:
            raise self.fail(key, f"array of {length} values exceeds llama.cpp's maximum of "
                                 f"{LLAMA_MAX_LAYERS} (LLAMA_MAX_LAYERS)")
        if not isinstance(v, list):
            raise self.fail(key, f"{_show(v)} is not an array of counts")
        if n_layer and length != n_layer:
            raise self.fail(key, f"array of {length} values where llama.cpp wants one per layer "
                                 f"(block_count {n_layer})")
        vals = [self._int(key, x, UINT32_MAX, "") for x in v]
        if vals and all(x == vals[0] for x in vals) and len(vals) >= n_layer:
            return vals[0]
        return vals
