"""DeepSeek Sparse Attention (deepseek32: DeepSeek V3.2 / V3.2-Exp / V3.2-Speciale; glm-dsa: GLM-5): the
lightning indexer's key cache beside the MLA cache, as the pinned llama.cpp allocates it.

``llama_model::create_memory`` (src/llama-model.cpp 2404-2452) builds a ``llama_kv_cache_dsa``
(src/llama-kv-cache-dsa.cpp) for the main context: two ``llama_kv_cache`` objects, logged in this order

* "creating main KV cache, size = N cells": the K-only MLA cache of the trunk layers (``filter_mla``: the
  NextN blocks are never attended by the trunk), what :func:`memory.kv_buffers` already projects;
* "creating indexer KV cache, size = N cells": a copy of the hparams with ``n_head_kv = 1`` on every layer
  and ``n_embd_head_k_full = indexer_head_size``: per layer one K tensor ``[indexer_head_size, cells,
  n_stream]`` of ``type_k`` (-ctk applies; still MLA, so no V tensor and -ctv does not), on the layer's
  device (CPU with -nkvo), the same cells and streams as the MLA cache (-c, -np, --kv-unified), for the
  layers ``filter_lid`` keeps: every trunk layer of deepseek32, the trunk layers with a full indexer
  (``is_indexer_full``) of glm-dsa.  Each cache allocates its own buffer per buffer type (a second
  "KV buffer size" line per device), and ``memory_breakdown`` sums both (what ``--fit`` counts).

An MTP context (``-spec-type`` with the NextN head) gets a plain cache of the NextN layers only, no
indexer: what the callers' ``cached`` range already asks of :func:`memory.kv_buffers`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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


#: GLM-5.2's indexer layout when its file has no ``attention.indexer.types`` (src/models/glm-dsa.cpp
#: ``GLM_5_2_DEFAULT_INDEXER_TYPES``): layers 0 and 1, then every fourth from 2 up to 74; the rest none.
_GLM_5_2_FULL_UNTIL = 78

#: glm-dsa files of GLM 5 / 5.1 (trained context under 1M) have a full indexer on every layer.
_GLM_PRE_5_2_CTX = 1048576


def _glm_5_2_default(il: int) -> bool:
    return il < 2 or (il < _GLM_5_2_FULL_UNTIL and (il - 2) % 4 == 0)


def _all_layers(model: Model, il: int) -> bool:
    return True


def _glm_dsa_full(model: Model, il: int) -> bool:
    """``is_indexer_full(il)``: ``attention.indexer.types`` (one bool per trunk layer) when the file has it,
    else every layer before GLM-5.2 (trained context < 1M), GLM-5.2's default layout after."""
    types = model.metadata.get(f"{model.arch}.attention.indexer.types")
    if isinstance(types, list | tuple) and not isinstance(types, str):
        return il < len(types) and bool(types[il])
    if model.summary.n_ctx_train < _GLM_PRE_5_2_CTX:
        return True
    return _glm_5_2_default(il)


@dataclass(frozen=True)
class DsaArch:
    """What one DSA architecture does differently (the rest is deepseek2's MLA)."""

    name: str
    #: the trunk layers whose indexer keys are cached (``filter_lid`` of ``create_memory``)
    indexer_cached: Callable[[Model, int], bool]
    #: the NextN block's tensors llama.cpp loads even without MTP: deepseek32.cpp and glm-dsa.cpp create
    #: ``exp_probs_b`` with ``TENSOR_NOT_REQUIRED`` but without the block's skip flags
    nextn_always_loaded: tuple[str, ...] = ("exp_probs_b.bias",)


DSA_ARCHS: dict[str, DsaArch] = {
    "deepseek32": DsaArch("deepseek32", _all_layers),
    "glm-dsa": DsaArch("glm-dsa", _glm_dsa_full),
}


def is_dsa(arch: str) -> bool:
    return arch in DSA_ARCHS


def nextn_tensor_loaded(arch: str, name: str, layer: int) -> bool:
    """Whether tensor ``name`` of NextN block ``layer`` is loaded even without MTP (it then belongs to
    the layer's device like a trunk tensor)."""
    a = DSA_ARCHS.get(arch)
    return a is not None and any(name == f"blk.{layer}.{s}" for s in a.nextn_always_loaded)


def indexer_head_size(model: Model) -> int:
    return model.arch_int("attention.indexer.key_length", 0)


def indexer_layers(model: Model) -> list[int]:
    """The trunk layers with an indexer key cache (empty for other architectures)."""
    a = DSA_ARCHS.get(model.arch)
    if a is None:
        return []
    return [il for il in range(model.summary.n_layer_trunk) if a.indexer_cached(model, il)]


def indexer_kv_buffers(model: Model, placement: Placement, ctx: ResolvedContext, p: ContextParams,
                       devices: DeviceSet, cached: Iterable[int] | None) -> list[Buffer]:
    """The indexer cache's buffer per device for the ``cached`` layers (None: the trunk, the main
    context), empty for other architectures and for a context that caches no trunk layer (MTP)."""
    layers = indexer_layers(model)
    if not layers:
        return []
    if cached is not None:
        wanted = set(cached)
        layers = [il for il in layers if il in wanted]
    row = type_by_name(p.type_k).row_bytes(indexer_head_size(model))
    per_dev, count = per_device(placement, p.offload_kqv, devices, layers, row * ctx.n_ctx_seq * ctx.n_stream)
    why = (f"lightning indexer keys (llama_kv_cache_dsa): {ctx.n_ctx_seq} cells x {ctx.n_stream} streams "
           f"x {indexer_head_size(model)} ({p.type_k}), one key head, no V")
    return [Buffer(d, d, "kv", n, f"{count[d]} layers; {why}") for d, n in per_dev.items()]


def dsa_shape(model: Model) -> tuple[int, tuple[bool, ...]]:
    """The graph shape's DSA fields (``compute.graph.Shape``): the indexer's top-k and, per trunk layer,
    whether it runs its own indexer; ``(0, ())`` for other architectures."""
    if not is_dsa(model.arch):
        return 0, ()
    full = set(indexer_layers(model))
    return (model.arch_int("attention.indexer.top_k", 0),
            tuple(il in full for il in range(model.summary.n_layer_trunk)))


#: ik_llama.cpp's full-indexer layers of a glm-dsa model: fixed, whatever the file says
#: (``indexer_is_full[il] = (il <= 1) || (il % 4 == 2)``, src/llama-hparams.cpp 1917-1919 at 8337e4cd)
def _ik_full(il: int) -> bool:
    return il <= 1 or il % 4 == 2


#: the indexer cache's type in ik (``--indexer-cache-type-k``, -ictk; the planner does not read the flag)
IK_INDEXER_TYPE = "f16"


def ik_indexer_kv(model: Model, placement: Placement, kv_size: int, offload_kqv: bool,
                  devices: DeviceSet) -> dict[str, int]:
    """ik_llama.cpp's DSA indexer key cache (``cache_kr_l``, src/llama.cpp 1344-1349 and 1432-1436 at
    8337e4cd): for a glm-dsa model, one ``[indexer_head_size, kv_size]`` tensor of -ictk's type (f16)
    per trunk layer that has ``indexer.attn_k`` and a full indexer by ik's own rule, in the layer's KV
    buffer (the CPU's with -nkvo); bytes per device, each tensor padded to its alignment (the caller adds
    them to the device's KV buffer: ik allocates one buffer a buffer type)."""
    if model.arch != "glm-dsa" or not indexer_head_size(model):
        return {}
    row = type_by_name(IK_INDEXER_TYPE).row_bytes(indexer_head_size(model))
    layers = [il for il in range(model.summary.n_layer_trunk)
              if _ik_full(il) and model.get(f"blk.{il}.indexer.attn_k.weight") is not None]
    return dict(per_device(placement, offload_kqv, devices, layers, row * kv_size)[0])
