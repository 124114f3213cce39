"""The indexer key cache of ``llama_memory_hybrid_idx`` (qwen4exp, glm5-next), as the pinned llama.cpp
allocates it.

``llama_model::create_memory`` (src/llama-model.cpp 2457-2500, 2694-2760) gives qwen4exp (when its
``attention.indexer.key_length`` is not 0; its loader sets no SWA type) and glm5-next a
``llama_memory_hybrid_idx``
(src/llama-memory-hybrid-idx.cpp 23-72): a ``llama_memory_hybrid`` (the attention KV cache and the
recurrent state, :mod:`core.recurrent_state`) plus a third ``llama_kv_cache`` built after them, logged
"creating indexer KV cache, size = N cells", with a copy of the hparams in which

* ``n_head_kv = 1`` on every layer (one key head);
* ``n_embd_head_k_full = indexer_head_size * (indexer_kpool > 0 ? indexer_kpool_row : 1)``: a k-pool
  indexer caches its per-token rows and the pooled keys side by side (qwen4exp: key | pooled, row 2;
  glm5-next: key | gate | pooled, row 3, the hparams default);
* the MLA head sizes set, so the cache holds K alone (no V tensor, -ctv does not apply).

So per layer ``filter_idx`` keeps: one K tensor ``[indexer_head_size * row, kv_size, n_stream]`` of
``type_k`` (-ctk applies), on the layer's device (the CPU with -nkvo), the attention cache's cells and
streams (-c, -np, --kv-unified); one buffer per buffer type (a further "KV buffer size" line per
device after the attention cache's and the RS lines).  ``memory_breakdown`` adds it to the KV.

``filter_idx``: qwen4exp, the trunk layers that are not recurrent; glm5-next, those with a full indexer
(``attention.indexer.types``, every layer when absent).  qwen4exp's ``indexer_kpool`` is the one non-zero
``attention.compress_ratios`` entry (0 when none: row 1); glm5-next's is ``attention.indexer.kpool``
(src/models/qwen4exp.cpp 56-81, src/models/glm5-next.cpp 39-47).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from offload_planner.core.buffer import Buffer
from offload_planner.core.ggml_types import type_by_name
from offload_planner.core.key_cache import per_device

if TYPE_CHECKING:
    from offload_planner.core.devices import DeviceSet
    from offload_planner.core.memory import ContextParams, ResolvedContext
    from offload_planner.core.model import Model
    from offload_planner.core.placement import Placement


def _arr(model: Model, key: str) -> list[int] | None:
    v = model.metadata.get(f"{model.arch}.{key}")
    if isinstance(v, Sequence) and not isinstance(v, str):
        return [int(x) for x in v]
    if not isinstance(v, int):
        return None
    return [v] * model.summary.n_layer  # get_key_or_arr: one value for every layer


def _qwen4exp_kpool(model: Model) -> int:
    """The common non-zero ``compress_ratios`` entry (the loader refuses two different ones), 0 if none."""
    ratios = _arr(model, "attention.compress_ratios") or []
    return next((r for r in ratios if r), 0)


def _glm5_next_kpool(model: Model) -> int:
    return model.arch_int("attention.indexer.kpool", 0)


def _qwen4exp_cached(model: Model, il: int, recurrent: bool) -> bool:
    return not recurrent


def _glm5_next_cached(model: Model, il: int, recurrent: bool) -> bool:
    types = _arr(model, "attention.indexer.types")
    full = True if types is None else il < len(types) and bool(types[il])
    return not recurrent and full


@dataclass(frozen=True)
class IndexerArch:
    """One architecture's indexer cache: its k-pool size, the row width factor of a k-pool indexer
    (``indexer_kpool_row``) and the trunk layers ``filter_idx`` keeps (given ``is_recr(il)``)."""

    kpool: Callable[[Model], int]
    kpool_row: int
    cached: Callable[[Model, int, bool], bool]


INDEXER_ARCHS: dict[str, IndexerArch] = {
    # src/models/qwen4exp.cpp 78-81: hparams.indexer_kpool_row = 2 (raw key | pooled key)
    "qwen4exp": IndexerArch(_qwen4exp_kpool, 2, _qwen4exp_cached),
    # src/llama-hparams.h 289: indexer_kpool_row = 3 (glm5-next does not change it: key | gate | pooled)
    "glm5-next": IndexerArch(_glm5_next_kpool, 3, _glm5_next_cached),
}


def head_size(model: Model) -> int:
    return model.arch_int("attention.indexer.key_length", 0)


def row_width(model: Model) -> int:
    """``n_embd_k_gqa`` of the indexer cache: ``indexer_head_size * (kpool > 0 ? kpool_row : 1)``."""
    a = INDEXER_ARCHS[model.arch]
    return head_size(model) * (a.kpool_row if a.kpool(model) > 0 else 1)


def indexer_layers(model: Model, recurrent: Sequence[bool]) -> list[int]:
    """The trunk layers with an indexer cache; empty for other architectures and for a qwen4exp file
    without indexer (``filter_idx`` null: no cache at all)."""
    a = INDEXER_ARCHS.get(model.arch)
    if a is None or head_size(model) == 0:
        return []
    return [il for il in range(model.summary.n_layer_trunk) if a.cached(model, il, recurrent[il])]


def indexer_buffers(model: Model, placement: Placement, p: ContextParams, ctx: ResolvedContext,
                    devices: DeviceSet, recurrent: Sequence[bool]) -> list[Buffer]:
    """The main context's indexer cache (the trunk layers ``filter_idx`` keeps)."""
    return _buffers(model, placement, p, ctx, devices, indexer_layers(model, recurrent))


def mtp_indexer_buffers(model: Model, placement: Placement, p: ContextParams, ctx: ResolvedContext,
                        devices: DeviceSet) -> list[Buffer]:
    """The MTP context's indexer cache: its ``llama_memory_hybrid_idx`` keeps the NextN block alone
    (``filter_attn`` and ``filter_idx`` ``il >= n_layer()``, no recurrent layer; src/llama-model.cpp
    2476-2483 and 2720-2726), so the NextN layers' indexer keys; none for other architectures."""
    if model.arch not in INDEXER_ARCHS or head_size(model) == 0:
        return []
    s = model.summary
    return _buffers(model, placement, p, ctx, devices, list(range(s.n_layer_trunk, s.n_layer)))


def _buffers(model: Model, placement: Placement, p: ContextParams, ctx: ResolvedContext,
             devices: DeviceSet, layers: list[int]) -> list[Buffer]:
    """The indexer cache's ``KV buffer`` per buffer type for ``layers``: each layer's K tensor padded to
    the device's alignment (one buffer a buffer type, ``ggml_backend_alloc_ctx_tensors_from_buft``)."""
    if not layers:
        return []
    width = row_width(model)
    row = type_by_name(p.type_k).row_bytes(width)
    per, count = per_device(placement, p.offload_kqv, devices, layers, row * ctx.n_ctx_seq * ctx.n_stream)
    why = (f"indexer keys (llama_memory_hybrid_idx): {ctx.n_ctx_seq} cells x {ctx.n_stream} streams x "
           f"{width} ({p.type_k}), one key head, no V")
    return [Buffer(d, d, "kv", per[d], f"{count[d]} layers; {why}") for d in sorted(per)]
