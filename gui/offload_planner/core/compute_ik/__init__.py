"""Compute buffers as ik_llama.cpp reserves them, simulated on shapes like :mod:`offload_planner.core.compute`
does for mainline.

ik_llama.cpp builds its own graphs (``src/llama-build-context.cpp``): fused ops (``ggml_fused_rms_norm``
for every weighted RMS norm, ``ggml_fused_up_gate`` for dense gated FFNs, ``ggml_moe_up_gate`` and
``ggml_mul_multi_add`` for the routed experts), its own KQ mask (one f16 ``[n_kv, pad(n_tokens, 16)]``
tensor with flash attention), KV stores as ``ggml_cpy`` into cache views, and for DeepSeek-style models
its MLA paths (``-mla 1/2/3``; with flash attention and a prompt batch of >= 128 tokens, ``-mla 2/3``
expands the latent cache to per-head K and V through ``attn_kv_b``; -amb splits that expansion, or
the K*Q product of the paths without flash attention, when its f32 scratch exceeds the cap).  Graphs
here: deepseek2, llama (dense and MoE), qwen3moe, glm4moe, gpt-oss (SWA mask, sinks, expert biases) and
gemma3 (SWA mask, post norms); ik keeps full-size caches for SWA layers.  Its graph allocator is the older
``ggml-alloc.c`` (fewer ops may run in place) and it reserves one graph: a prompt batch of
``min(n_ctx, n_ubatch)`` tokens over the whole KV cache, every token an output.

This package builds those graphs on :class:`compute.T` shapes and runs :class:`compute.Scheduler` and an
allocator with ik's in-place rules over them.  By concept: :mod:`.ops` (ik's own ops and mask padding),
:mod:`.builder` (the graph's shape and ``llm_build_context``'s blocks), :mod:`.mla` (DeepSeek's attention
in every -mla mode), :mod:`.archs` (one graph per architecture, and the MTP graphs), :mod:`.scheduler`
(ik's CUDA op offload of host weights), :mod:`.allocator` (ik's in-place rules), :mod:`.simulate` (from
the planner's model and placement to the graph's inputs), :mod:`.reserve` (the one reserve) and
:mod:`.buffers` (the planner's entry points).  This module re-exports what the rest of the planner uses.

Verified against ik's libllama (the ik-llama-cpp-python wheel, CPU backend) to the 0.01 MiB it prints,
node counts included: ``tests/integration/test_ik_compute.py``.  With GPUs the graph shapes are ik's but
its scheduler and CUDA buffer rules are not verified here.
"""

from __future__ import annotations

from offload_planner.core.compute_ik.archs import IK_GRAPHS, IK_MTP_GRAPHS
from offload_planner.core.compute_ik.buffers import IK_SIMULATED, ik_compute_buffers, ik_mtp_compute_buffers
from offload_planner.core.compute_ik.reserve import IkReserve, simulate_ik
from offload_planner.core.compute_ik.scheduler import IkBackend
from offload_planner.core.compute_ik.simulate import loads_nextn, supported

__all__ = [
    "IK_GRAPHS", "IK_MTP_GRAPHS", "IK_SIMULATED", "IkBackend", "IkReserve", "ik_compute_buffers",
    "ik_mtp_compute_buffers", "loads_nextn", "simulate_ik", "supported",
]
