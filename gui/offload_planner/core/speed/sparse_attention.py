"""DeepSeek Sparse Attention (deepseek32, glm-dsa: :mod:`offload_planner.core.dsa`) in one generated
token's reads and FLOPs.

The pinned build does not gather the indexer's top-k cells: ``build_attn`` with a ``top_k``
(src/llama-graph.cpp 3125-3176) writes zeros at the top-k positions of an all ``-inf`` mask
(``ggml_set_rows``), adds the causal mask and runs the ordinary MLA attention over every cell with it.
So what a token costs depends on the kernel:

* a backend whose one-token flash attention skips a cell its mask holds at ``-inf``
  (:func:`reads.skipping_devices`: ggml-cpu ``if (mv == -INFINITY) continue`` in
  ``ggml_compute_forward_flash_attn_ext_f16_one_chunk``, ops.cpp 8968) reads and multiplies the MLA
  cache at ``min(depth, top_k)`` cells; every other case (CUDA's vector kernel, which scans no mask
  below 1024 queries; any backend without flash attention, whose ``soft_max`` follows the whole KQ
  product) at ``depth``, as a dense model;
* every layer with an indexer of its own (:func:`dsa.indexer_layers`) scores all ``depth`` cells first:
  ``ggml_lightning_indexer`` (deepseek32.cpp 280) reads the indexer's key cache (which
  :func:`memory.kv_buffers` already counts, at ``depth``) and does ``2 x head_count x key_length``
  FLOPs a cell.

ik_llama.cpp (its own glm-dsa cache, :func:`dsa.ik_indexer_kv`, and graph) is left as a dense model.
"""

from __future__ import annotations

from offload_planner.core.dsa import indexer_head_size, indexer_layers, is_dsa
from offload_planner.core.memory import ContextParams
from offload_planner.core.model import Model


def top_k(model: Model, params: ContextParams) -> int:
    """The cells a token's MLA attention reads where the kernel skips masked cells (0: not sparse)."""
    if not is_dsa(model.arch) or not params.dialect.dsa_indexer_cache:
        return 0
    return model.arch_int("attention.indexer.top_k", 0)


def indexer_flops(model: Model, depth: int) -> dict[int, float]:
    """The lightning indexer's FLOPs for one token at ``depth`` cells, per layer that runs one."""
    heads = model.arch_int("attention.indexer.head_count", 0)
    per_cell = 2.0 * heads * indexer_head_size(model)
    return {il: per_cell * depth for il in indexer_layers(model)}
