"""Compute buffers as llama.cpp reserves them: the model's graph, scheduled and allocated in miniature.

The package, by concept: :mod:`.ggml` (tensors and ops), :mod:`.graph` (the llm graph context and
builder), :mod:`.archs` (one graph per architecture), :mod:`.scheduler` (backends, splits, copies),
:mod:`.allocator` (the graph allocator), :mod:`.reserve` (one reserve from scratch),
:mod:`.incremental` (the same reserve replayed against a recorded one: :mod:`.recording` with
:mod:`.rec_alloc`, :mod:`.replay`, :mod:`.replay_alloc`, :mod:`.bound`; or run again on the graph
kept from an earlier one: :mod:`.template`, whose allocation walk jumps whole periods of equal
layers: :mod:`.jumps`), :mod:`.simulate` (from a placement to the reserves, and the estimate) and
:mod:`.buffers` (the planner's entry point).  This module re-exports what the rest of the planner uses.

llama.cpp sizes each backend's compute buffer by building the worst-case graph (``sched_reserve``:
a prompt ubatch of ``min(n_ctx, n_ubatch)`` tokens over the full KV cache, then the one-token-per-
sequence graph; each buffer keeps the larger), splitting it over the backends
(``ggml_backend_sched_split_graph``) and running the graph allocator over it (``ggml_gallocr``: tensors
are freed after their last use, a node may reuse its parent's memory in place, free blocks are taken
best-fit).  There is no closed form: the peak is wherever the live set of one layer, the inputs and the
copies between backends is largest.  So this module does the same thing on shapes only:

* a mini ggml (:class:`T` and the op constructors) with ggml's shapes, strides, views and in-place
  rules, and ``ggml_build_forward_expand``'s depth-first node order;
* the graph of each supported architecture (``src/models/*.cpp`` + ``src/llama-graph.cpp``):
  token-embedding ``GET_ROWS`` (plus the unused mixed-batch branch), the KQ mask(s) (f16 with flash
  attention, f32 without; a second mask for SWA layers), KV stores as ``SET_ROWS`` views, flash
  attention or ``KQ``/``softmax``/``KQV``, dense and MoE FFNs with every router/top-k/weighting
  tensor, the ``out_ids`` row selection of the last layer, the logits of ``n_outputs`` rows;
* the scheduler's backend assignment (weights pin ops, GPU backends expand up and down, inputs live
  on the CPU, ``norm`` tensors forced to their layer's device), its splits and the copies of split
  inputs, op offload of host weights to the first GPU that offloads the op (CUDA-like devices, batch
  >= 32), and pipeline parallelism (4 copies of every graph input and split input, never freed);
* ``ggml_gallocr`` / ``ggml_dyn_tallocr`` exactly: leafs first, child and view counts, in-place reuse,
  best-fit free blocks with merging, per-buffer-type alignment.

Supported architectures: llama, qwen2, qwen3, qwen3moe, deepseek2 (MLA), glm4moe, gpt-oss, gemma3,
gptneox, and the gated-delta-net hybrids qwen3next, qwen35, qwen35moe (:mod:`.archs_deltanet`: the
recurrent-state gathers and copies, ``ssm_conv``, the fused ``GATED_DELTA_NET`` of the pinned build).
Others (and files whose tensors do not fit their architecture's graph) get :func:`term_estimate`:
a KQ mask (+ KQ scores without flash attention) and the largest layer's activations per device,
the logits on the output device; flagged as an estimate in ``why``.

Calibration notes (no bench: measured against the pinned llama.cpp, ``llama-server -lv 4`` and
``llama-fit-params -lv 5``; ``tests/integration/test_compute_vs_llama.py`` repeats it):

* Small models, CPU only and with one or two ggml-rpc-server devices: equal to the 0.01 MiB llama.cpp
  prints on every buffer of ~75 command lines (six architectures, plus qwen2/qwen3 dense written with
  a patched synth), over -ngl, -ts, -ot (to CPU and to RPC), -c, -b, -ub (16..1024), -fa on/off/auto,
  -ctk/-ctv f16/q8_0/q4_0, -np/-kvu, -nkvo, --swa-full, pipeline parallelism; graph node and split
  counts equal llama.cpp's.  Real-size CPU-only server runs (Qwen3-30B-A3B, gpt-oss-120b,
  GLM-4.5-Air as sparse files, ``-nr``): equal too.
* Real-size dry runs (DeepSeek-V3, Qwen3-30B-A3B, gpt-oss-120b, GLM-4.5-Air; CPU only and with
  1-2 RPC devices; -c up to 131072, -ub up to 2048): equal to ``llama-fit-params`` with
  ``simulate(no_alloc=True)``.  The dry run is not what the server allocates: its
  ``ggml_backend_sched_reserve_size`` resets the scheduler and drops the ``norm`` tensors forced
  onto their layer's device (and -nkvo's CPU attention output), so on a layer-split it may copy one
  more activation per boundary (GLM-4.5-Air, 2 RPC, -c 16384: 448.05 MiB against the server's
  416.05 on RPC1).  ``compute_buffers`` projects the server.
* Not verifiable without the hardware, modelled from the source: CUDA op offload of host weights
  (:data:`OP_OFFLOAD_MIN_BATCH`: each offloaded op with a host weight starts a split whose copy is
  freed after use, so the peak holds one weight copy, rows padded to 512 elements), and the f16
  copies of non-f16 K/V that CUDA's tile/MMA flash attention adds to the FA node
  (``ggml_cuda_flash_attn_ext_get_alloc_size``).  Vulkan and Metal reorder split graphs
  (``graph_optimize``), which is not modelled.
"""

from __future__ import annotations

from offload_planner.core.compute.allocator import (
    DynAllocator,
    GraphAllocator,
    cuda_fa_alloc_size,
    peak_label,
)
from offload_planner.core.compute.archs import ARCH_GRAPHS
from offload_planner.core.compute.buffers import (
    MEMO,
    SIMULATION_LOCK,
    BufferMemo,
    compute_buffers,
    explain,
    one_shot,
    placement_key,
    simulate_buffers,
)
from offload_planner.core.compute.ggml import (
    CPU,
    F16,
    F32,
    OUTPUT,
    Graph,
    T,
    dup_op,
    flash_attn_ext,
    input_tensor,
    mul_mat,
    nbytes,
)
from offload_planner.core.compute.incremental import record_at_first_sight
from offload_planner.core.compute.reserve import Reserve, reserve
from offload_planner.core.compute.scheduler import OP_OFFLOAD_MIN_BATCH, Backend, Scheduler
from offload_planner.core.compute.simulate import (
    Simulation,
    backends_for,
    full_offload,
    graph_builder,
    model_gpus,
    reserve_shapes,
    simulate,
    term_estimate,
)

__all__ = [
    "ARCH_GRAPHS", "CPU", "F16", "F32", "MEMO", "OP_OFFLOAD_MIN_BATCH", "OUTPUT", "SIMULATION_LOCK",
    "Backend",
    "BufferMemo",
    "DynAllocator", "Graph", "GraphAllocator", "Reserve", "Scheduler", "Simulation", "T", "backends_for",
    "compute_buffers", "cuda_fa_alloc_size", "dup_op", "explain", "flash_attn_ext", "full_offload",
    "graph_builder", "input_tensor", "model_gpus", "mul_mat", "nbytes", "one_shot", "peak_label",
    "placement_key",
    "record_at_first_sight", "reserve", "reserve_shapes", "simulate", "simulate_buffers", "term_estimate",
]
