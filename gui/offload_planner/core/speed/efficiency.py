"""Effective = peak x efficiency: the fractions of spec-sheet figures llama.cpp reaches.

Defaults are round figures, not fitted ("default, uncalibrated"), until measurements replace them:
``calibrated(...)`` takes the efficiencies measured on a machine (``launch --bench``) and marks them
calibrated.  ``tests/core/test_speed_public.py`` prints how these defaults fare against public
measurements.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from offload_planner.core.devices import DeviceKind
from offload_planner.core.dialects.base import Dialect
from offload_planner.core.speed.cpu_isa import GAINS, Isa
from offload_planner.core.speed.hardware import Figure, Source

UNCALIBRATED = "uncalibrated"


def _d(value: float, unit: str = "x peak") -> Figure:
    return Figure(value, unit, Source.DEFAULT, UNCALIBRATED)


_GPU_BW = _d(0.75)  # weights and KV streamed from VRAM during token generation
_CPU_BW = _d(0.65)  # of the declared / default RAM bandwidth
_PROBE_BW = _d(0.9)  # of the probe's measured copy bandwidth (already an effective figure)
_GPU_COMPUTE = _d(0.35)  # quantized matrix multiplication against the dense FP16 peak
_CPU_COMPUTE = _d(0.5)
_LINK = _d(0.8)  # PCIe / network payload against the line rate
#: One generated token's attention on the CPU at a depth: Kimi-K2 (MLA, 64 heads, 576 + 512 dims a
#: cell) on 128 threads of an EPYC 9965 with ik_llama.cpp (-mla 3 -fa, KV q8_0) went from 13.39 t/s
#: at N_KV 0 to 11.90 at N_KV 9216 (-ub 512) and from 13.03 to 12.07 at 8192 (-ub 4096)
#: (https://github.com/ikawrakow/ik_llama.cpp/pull/612, llama-sweep-bench): 9.35 ms for 78 GFLOPs
#: and 6.1 ms for 69 GFLOPs a token, 0.65 and 0.88 x 128 x 0.1 TFLOPS; the lower one, since it also
#: covers the KV reads.
#: ik_llama.cpp's figure (its own CPU flash attention): :data:`_FAST_CPU`.
_CPU_ATTN = Figure(0.65, "x peak", Source.DEFAULT,
                   "one token's attention on the CPU: ik_llama.cpp PR 612 (Kimi-K2, EPYC 9965, 128 threads)")
#: Mainline llama.cpp's: one generated token's attention on the CPU runs far below the peak, about
#: 50 ns a KV cell a head on one thread (the online softmax's exp, f16 conversions and a vec_dot and
#: a mad of 128 a cell, ggml-cpu ops.cpp ``ggml_compute_forward_flash_attn_ext_f16_one_chunk``).
#: From the one public mainline CPU sweep (https://github.com/ikawrakow/ik_llama.cpp/pull/518, build
#: 5635 (3069e3169), LLaMA-3.1-8B IQ3_S on a Ryzen-7950X, 16 threads: its cores):
#: "|   512 |    128 |      0 |   18.261 |    28.04 |    7.933 |    16.14 |" ... "|   512 |    128 |
#: 512 |   18.708 |    27.37 |    8.335 |    15.36 |", "1024 | ... |    8.547 |", "1536 | ... |    8.739 |",
#: "|   512 |    128 |   2048 |   19.670 |    26.03 |    8.912 |    14.36 |" (N_KV, T_TG s for 128 tokens):
#: the least-squares slope, 3.60 µs a token per KV cell, for 2 x 32 heads x (128 + 128) x 32 layers =
#: 0.524 MFLOPs a cell (core.speed.tg.attention_flops_at), is 145.5 GFLOPS, 0.032 of the 16 cores' peak
#: at its 4.5 GHz base clock with AVX-512 VNNI (16 x 0.1 x 1.95 x 4.5 / 3.125 = 4.49 TFLOPS); the KV
#: reads (f16, 8 KV heads: 131 kB a cell) are in that time, and at the record's bandwidth take less.
#: Checked on this project's 2-vCPU Zen 4 EPYC with the pinned build (11434): perf's on-CPU time of
#: ``ggml_compute_forward_flash_attn_ext``, ``ggml_vec_dot_f16`` and ``expf`` between a request of 256 + 2
#: tokens and one of 256 + 34 was 8.57 ms a token for 89 MFLOPs (bench-qwen3moe-2g, 32 heads x 128, 20
#: layers, -t 1): 0.053 of one thread's peak at the default clock, the same order (a newer build's kernel).
#: Attention on the CPU at the depth of a bench's prompt (256 cells) is then a quarter of that MoE
#: model's token on this machine, which the estimate at depth 0 did not have.
_MAINLINE_CPU_ATTN = Figure(0.032, "x peak", Source.DEFAULT,
                            "one token's attention on the CPU, mainline: ik_llama.cpp PR 518's mainline "
                            "sweep (LLaMA-3.1-8B, Ryzen-7950X, N_KV 0-2048: 145.5 GFLOPS)")
#: One thread's share of the RAM bandwidth when -t limits it: a round figure that matched the earlier
#: 2-core AVX2 machine.  On the 2-vCPU AVX-512 EPYC it caps bench-llama-2g's tg on the CPU and on two
#: loopback rpc-servers (1 thread each) at 0.55-0.59x of the measured; a single-thread copy there reads
#: 21-26 GB/s (numpy, loaded machine), but at 15-22.5 GB/s a thread the MoE model's CPU tg goes from
#: 0.97x to 1.46-1.48x (its tokens are not bound by their bytes alone): left as it is, not derived.
#: Public thread sweeps (a generated token's GB/s = model size x t/s, over the threads) put one x86
#: thread at 11-13 GB/s on AVX2 cores and far more on some AVX-512 ones, but through different kernels:
#: ik_llama.cpp, LLaMA-3.1-8B Q6_K (6.14 GiB) TG-128 (https://github.com/ikawrakow/ik_llama.cpp/pull/132):
#: Ryzen-7950X "| Zen4            | 1 |  5.12 ± 0.00   |", "|                      | 2 |  9.31 ± 0.00 |"
#: (33.7 and 30.7 GB/s a thread, ik's AVX-512 code), Ryzen-5975WX "| AVX2           | 2 | 4.04 ± 0.00    |",
#: "|                     | 4 | 7.57 ± 0.00    |" (13.3 and 12.5 GB/s a thread); mainline on an i3-1315U
#: "| llama 3B Q4_K - Medium         |   1.87 GiB |     3.21 B | CPU        |       2 |           tg128 |
#: 11.05 ± 0.08 |" (https://github.com/geerlingguy/sbc-reviews/issues/107: 11.1 GB/s a thread).
#: Checked on two mainline 2-thread AVX2 laptops (Llama-3.2-3B Q4_K_M, 1.87 GiB, written by the synth
#: with Llama-3.2-3B's config): the i3-1315U above, tg 11.06 estimated (the two threads' 20 GB/s) for
#: 11.05 measured; an i5-4278U with 2 x DDR3L-1600 (https://github.com/geerlingguy/ai-benchmarks/issues/53,
#: build 936918514 (10334)) "| llama 3B Q4_K - Medium         |   1.87 GiB |     3.21 B | CPU        |
#: 2 |           tg128 |          7.68 ± 0.03 |": 9.20 estimated (RAM-bound there), 1.20x.  Their pp512
#: ("28.67 ± 0.18", "17.70 ± 0.08") is estimated 0.24x and 0.84x: the i3-1315U's 1.2 GHz base clock (its
#: P-cores boost to 4.5 GHz) is far below what a mobile part runs at; core.speed.hardware reads base
#: clocks.  These two posts are not in tests/data (its schema takes llama.cpp / ik_llama.cpp threads).
#: Mainline's GEMVs and vec_dots are AVX2 code on every x86 CPU (arch/x86/repack.cpp
#: ``ggml_gemv_q4_K_8x8_q8_K``, arch/x86/quants.c), so ik's AVX-512 figure does not carry over, and no
#: public mainline sweep of an AVX-512 CPU at a few threads was found: the figure stays as the default.
#: Where the RAM probe ran (this machine's CPU and its loopback rpc-servers) one thread's measured copy
#: x ``probe_bandwidth`` replaces it (core.speed.rates.thread_bandwidth).  The MoE model's excess above
#: was its attention at the bench's depth, which the estimate at depth 0 did not price (``cpu_attention``).
_THREAD_BW = _d(10.0, "GB/s per thread")
#: Op offload's copy of a host weight that is not in a pinned (``<GPU>_Host``) buffer, against the
#: pinned rate: with mmap (the default) llama.cpp keeps CPU weights in the mapping, pageable
#: (llama-model-loader.cpp "avoid using a host buffer when using mmap", and its warning "tensor
#: overrides to CPU are used with mmap enabled - consider using --load-mode none for better
#: performance"), so cudaMemcpyAsync stages them through the driver's bounce buffer.  Measured on one
#: rig (2x RTX 3090, 40 expert layers on the host, 26k-token prompt): 166 t/s with the experts
#: mmap'd, 330 t/s with them in a pinned buffer (https://github.com/ggml-org/llama.cpp/pull/28223):
#: the copy at no more than half the pinned rate.
_PAGEABLE_COPY = Figure(0.5, "x pinned rate", Source.DEFAULT,
                        "op offload from pageable (mmap'd) host weights: llama.cpp PR 28223 (166 vs 330 t/s)")
_SPLIT_US = _d(20.0, "µs per graph split")  # synchronise + launch across devices
#: A GPU's fixed time per layer a generated token, beyond the layer's bytes: a layer is some 15-20
#: kernels (norms, seven matrix-vector products, RoPE, the KV store, attention, adds; ggml-cuda runs
#: one kernel per graph node, CUDA graphs or not), each with a floor of a few µs however few bytes
#: it reads.  It is what makes small models' tokens slower than their bytes on fast GPUs (LLaMA-7B
#: Q4_0 on an RTX 3090 Ti: 127.43 t/s, 0.48 of its bandwidth,
#: https://github.com/ggml-org/llama.cpp/pull/4812; Llama-3-8B Q4_K_M on an RX 7900 XTX 105.81 t/s,
#: https://github.com/ggml-org/llama.cpp/pull/26284).
#: 40 µs: the best of 0-80 µs on the odd half of the public development set
#: (tests/core/test_speed_public.py; tg median 1.22x -> 1.12x), checked on the even half (1.28x ->
#: 1.14x).  Fitted, not read from a source.
_GPU_LAYER_US = Figure(40.0, "µs per GPU layer a token", Source.DEFAULT,
                       "a GPU layer's kernels' fixed time a token (fitted on half of the public "
                       "measurements)")
#: What an RPC graph split costs beyond the network round trip and the server's own work on the graph
#: (both measured by the probe against the running server, backend.rpc_probe: 25 µs and 22 µs on
#: loopback on a 2-vCPU AVX-512 EPYC): the host's hand-over (llama-server's scheduler copying the
#: split's inputs, its CPU threads going idle and woken, the rpc-server's thread scheduled on the same
#: cores).  From this project's own measurement on a 2-core AVX2 machine (README, bench/speed_measured.py,
#: load 1.0-1.2): bench-qwen3moe-2g with the experts on the CPU and the rest on one loopback rpc-server
#: ran 9.54 t/s (104.8 ms a token) with 41 splits a token, where the reads took about 61 ms: about
#: 1.06 ms a split, of which this 1000 µs.  It is CPU work, so a faster core does it sooner: the figure
#: is divided by the host core's compute against the AVX2 figure (:func:`for_host`: its instruction set
#: and clock); on the AVX-512 EPYC the same bench then puts RPC tg within 0.8-1.0x (it read 0.72x
#: with 1000 µs).  An assumption checked on one machine, not a measurement of this one.
RPC_HOST_US = 1000.0
_RPC_US = _d(RPC_HOST_US, "µs per RPC graph split")
#: -nkvo: every GPU layer stops the GPU twice a token: the new K/V rows copied down, the CPU's
#: threads woken for the set_rows into the host cache (and, without flash attention, the attention
#: ops: llama-graph.cpp ``build_attn_mha`` pins their output to ``backend_cpu``), then back.
#: Beyond the two splits' own latency (``split_latency_us``), from the one public pair of
#: measurements (same build, model and card; https://github.com/ggml-org/llama.cpp/pull/4812, build
#: 1786 (no flash attention yet), RTX 3090 Ti, LLaMA-7B Q4_0, llama-bench tg128 127.43 t/s with the
#: KV cache on the GPU and 59.99 t/s with -nkvo):
#: (1/59.99 - 1/127.43) s / 32 layers = 276 µs a layer, less two 20 µs splits and the 0.1 MB of
#: activations: about 230 µs.  Fitted to that record, so its error is no independent evidence.
_HOST_ATTN_US = Figure(230.0, "µs per -nkvo layer", Source.DEFAULT,
                       "the CPU's round trip of a GPU layer with -nkvo, from llama.cpp PR 4812 "
                       "(LLaMA-7B, RTX 3090 Ti, tg128 127.43 vs 59.99 t/s)")


@dataclass(frozen=True)
class Efficiencies:
    gpu_bandwidth: Figure = _GPU_BW
    cpu_bandwidth: Figure = _CPU_BW
    probe_bandwidth: Figure = _PROBE_BW
    gpu_compute: Figure = _GPU_COMPUTE
    cpu_compute: Figure = _CPU_COMPUTE
    link: Figure = _LINK
    cpu_thread_bandwidth: Figure = _THREAD_BW
    split_latency_us: Figure = _SPLIT_US
    rpc_latency_us: Figure = _RPC_US
    cpu_attention: Figure = _MAINLINE_CPU_ATTN
    host_attention_us: Figure = _HOST_ATTN_US
    pageable_copy: Figure = _PAGEABLE_COPY
    gpu_layer_us: Figure = _GPU_LAYER_US

    def names(self) -> list[str]:
        return [f.name for f in fields(self)]


DEFAULT = Efficiencies()


def calibrated(values: Mapping[str, float], note: str, base: Efficiencies = DEFAULT) -> Efficiencies:
    """``base`` with the named efficiencies replaced by measured ones (``note`` says where from:
    machine and backend).  Unknown names raise ValueError."""
    known = set(base.names())
    bad = sorted(set(values) - known)
    if bad:
        raise ValueError(f"unknown efficiencies {bad} (known: {sorted(known)})")
    changes = {k: Figure(float(v), getattr(base, k).unit, Source.CALIBRATED, note) for k, v in values.items()}
    return replace(base, **changes)


#: ik_llama.cpp's CPU matrix kernels: on the same machine and model its CPU prompt processing ran
#: 295 t/s where mainline's ran 28 (https://github.com/ikawrakow/ik_llama.cpp/pull/518); over the
#: development set's CPU-only ik_llama.cpp records the estimate with mainline's default was short by
#: a median 4x (https://github.com/ikawrakow/ik_llama.cpp/pull/683, /pull/518, /issues/1752,
#: /pull/259, /pull/612): its default CPU compute efficiency is 4 x 0.5.  Re-checked with each
#: record's CPU at its vendor base clock (``ghz=``, core.speed.hardware.DEFAULT_CPU_GHZ) and a CPU
#: micro-batch's compute and reads added (pp._microbatch): the same five records (all at odd
#: positions of the set) then put the estimate a median 0.99x of the measured at 2.0 (at 1.77 with
#: the clocks alone, the reads overlapped).
#: Those five records' CPUs are all AVX-512 with VNNI (Ryzen-7950X and EPYC 9004/9005: Zen 4/5; Xeon
#: 6980P: AMX, which ik_llama.cpp does not use), and the 2.0 was fitted against the AVX2 figure; a CPU's
#: compute now carries its instruction set's gain (core.speed.cpu_isa.GAINS, 1.95 for AVX-512 VNNI), so
#: the same fit reads 2.0 / 1.95 of the ISA-scaled peak: unchanged on those CPUs, and on an AVX2 CPU
#: (or one whose instruction set is not known) 2.05 x mainline's default instead of 4 x (ik_llama.cpp
#: PR 54 measured ik on a Ryzen-5975WX, AVX2, at 1.53 and 1.34 x mainline for Q4_0 and Q8_0 pp512).
IK_FIT_GAIN = GAINS[Isa.AVX512_VNNI].value
IK_CPU_COMPUTE = Figure(2.0 / IK_FIT_GAIN, "x peak", Source.DEFAULT,
                        "ik_llama.cpp's CPU kernels, from public measurements (ik_llama.cpp PRs 518, 683, "
                        "259, 612, issue 1752; their CPUs at base clock, AVX-512 VNNI: 2.0 x the AVX2 "
                        f"figure / {IK_FIT_GAIN:g})")
_FAST_CPU = replace(DEFAULT, cpu_compute=IK_CPU_COMPUTE, cpu_attention=_CPU_ATTN)


#: Mainline llama.cpp's CPU matrix multiplication of the lattice i-quants (IQ1_S ... IQ3_S): no
#: repacked or tinyBLAS GEMM for them (ggml-cpu repack.cpp: ``ggml_repack_get_optimal_repack_type``
#: repacks Q4_0, Q4_K, IQ4_NL, MXFP4 on x86, Q2_K with AVX512; llamafile sgemm takes F32/F16/BF16, Q8_0,
#: Q4_0, Q5_0, IQ4_NL), so each row goes through the type's vec_dot with its grid look-ups.  Measured on
#: a Ryzen-7950X with LLaMA-3.1-8B (https://github.com/ikawrakow/ik_llama.cpp/pull/518, mainline
#: build 5635: IQ3_S "pp512" 28.04 t/s, 16 cores): 28.04 x 2 x 7.5e9 matrix weights = 0.42 TFLOPS of
#: the 16 cores' peak at the 7950X's 4.5 GHz base clock (16 x 0.144 TFLOPS,
#: core.speed.hardware.DEFAULT_CPU_GHZ), 0.18 x peak, where the same CPU ran mainline's fastest type,
#: Q4_0, at 170 t/s (https://github.com/ikawrakow/ik_llama.cpp/pull/533, build 5688).  ik_llama.cpp's
#: own kernels cover these types (``IK_CPU_COMPUTE``).
IQUANT_CPU_COMPUTE = Figure(0.18, "x peak", Source.DEFAULT,
                            "mainline CPU kernels of IQ1_S..IQ3_S (vec_dot, no GEMM): IQ3_S pp512 28.04 t/s "
                            "on a Ryzen-7950X at 4.5 GHz (ik_llama.cpp PR 518)")
SLOW_CPU_TYPES = frozenset({"iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s"})  # ggml names


def cpu_cost(type_name: str, dialect: Dialect, isa_gain: float = 1.0) -> float:
    """Compute cost of one weight of ``type_name`` on the CPU against the default's (1: the default
    efficiency applies): mainline's lattice i-quants cost ``cpu_compute / IQUANT_CPU_COMPUTE``, times
    the CPU's instruction-set gain (``DeviceSpeed.isa_gain``): their ``vec_dot`` is AVX2 code on every
    x86 CPU (core.speed.cpu_isa), so a faster instruction set does not speed them up (the 0.18 was
    measured against the AVX2 figure)."""
    if type_name in SLOW_CPU_TYPES and not Dialect(dialect).fast_cpu_kernels:
        return _CPU_COMPUTE.value / IQUANT_CPU_COMPUTE.value * isa_gain
    return 1.0


#: The weight types mainline llama.cpp's CPU backend multiplies a batch of tokens with through a GEMM on
#: x86, whose throughput the instruction set's gain (core.speed.cpu_isa.GAINS, measured on these GEMMs)
#: describes: llamafile's tinyBLAS (llamafile/sgemm.cpp ``llamafile_sgemm``: F32, BF16, F16, Q8_0, Q4_0,
#: Q5_0, IQ4_NL) and, for a weight in a ``CPU_REPACK`` buffer (not with ``--no-repack``), the repacked
#: GEMMs (ggml-cpu/repack.cpp ``ggml_repack_get_optimal_repack_type``: Q4_0, Q4_K, IQ4_NL, MXFP4 with
#: AVX2, Q2_K with AVX-512).  Every other weight is multiplied row by row through its type's
#: ``ggml_vec_dot_*`` (ggml-cpu.c ``ggml_compute_forward_mul_mat_one_chunk``), whose x86 code
#: (arch/x86/quants.c) is 256-bit AVX2 whatever the CPU.  ggml names.
CPU_TINYBLAS_TYPES = frozenset({"f32", "bf16", "f16", "q8_0", "q4_0", "q5_0", "iq4_nl"})
CPU_REPACK_GEMM_TYPES = frozenset({"q4_0", "q4_K", "iq4_nl", "mxfp4", "q2_K"})
CPU_GEMM_TYPES = CPU_TINYBLAS_TYPES | CPU_REPACK_GEMM_TYPES
REPACK_BUFT = "CPU_REPACK"
#: A batch's cost of the tinyBLAS types in builds before llamafile's sgemm (``Dialect.cpu_gemm`` off:
#: llama.cpp before PR 6414, merged 2024-04-16), against the GEMM's (1), where ``vec_dot`` multiplied
#: them row by row: the PR's own figures (https://github.com/ggml-org/llama.cpp/pull/6414, jart,
#: 2024-04-01): "For starters, Q4_0 and Q8_0 weights should go ~40% faster on CPU. The biggest benefits
#: are with data types like f16 / f32, which process prompts 2x faster".  The types it does not name
#: (and the types tinyBLAS never took) cost the AVX2 figure of ``vec_dot``, as in later builds.
PRE_SGEMM_COSTS: dict[str, float] = {"f32": 2.0, "f16": 2.0, "q8_0": 1.4, "q4_0": 1.4}


#: The pinned build's tiled matmul (ggml-cpu/tiled/tiled.cpp, llama.cpp PR 27851 "ggml-cpu: tiled mul_mat for
#: k-quants", opened 2026-08-28; not in the 2025 builds nor in ik_llama.cpp): ``ggml_tiled_supported``
#: takes these weight types (ggml names) when the weight is not in a repack buffer (``src0->extra ==
#: NULL``: a ``CPU_REPACK`` weight keeps its repacked GEMM) and the build is x86 with AVX, AVX2 or
#: AVX512-VNNI (elsewhere it returns false); ``ggml_tiled_min_batch``: 8 or more rows, the batch's tokens
#: for ``mul_mat`` (called first in ggml-cpu.c ``ggml_compute_forward_mul_mat``), the rows routed to the
#: expert for ``mul_mat_id`` (decided per expert in ``ggml_compute_forward_mul_mat_id``).  So a prompt's
#: Q6_K/Q5_K/Q3_K weights, its non-repacked Q4_K/Q2_K, IQ4_XS and the lattice i-quants, and its routed
#: experts of those types, leave ``vec_dot``; a generated token (1 row) does not.
TILED_TYPES = frozenset({"q6_K", "q5_K", "q4_K", "q3_K", "q2_K", "iq4_xs", "iq2_xxs", "iq2_xs", "iq2_s",
                         "iq3_xxs", "iq3_s", "iq1_s", "iq1_m"})
TILED_MIN_ROWS = 8
#: The tiled kernel's throughput against the AVX2 figure (the default CPU compute of an AVX2 core), per
#: instruction set, from its throughput against the repacked Q4_K GEMM measured on one CPU (the GEMM is
#: what ``GAINS`` describes: cost 1 at the tier's gain):
#:
#: - AVX512-VNNI (``tiled-kernel.cpp``: its 16x16 microkernel with ``vpdpbusd`` under AVX512VNNI+VL+DQ):
#:   1.85 x the repacked GEMM, this project's machine (2-vCPU AMD EPYC, Zen 4, AVX-512 VNNI/BF16, pinned
#:   build 11434, perf's on-CPU time over the products' FLOPs at -t 1): Q6_K through the tiled kernel
#:   265 GFLOPS a thread, the repacked Q4_K GEMM (``ggml_gemm_q4_K_8x8_q8_K``) 143; 265 / 143 = 1.85.
#:   The PR's author: "For tall src1 (prefills), this results in 3-7x performance gain (2x compared to
#:   repack) on my x86 machine using the optimized microkernel" (VNNI,
#:   https://github.com/ggml-org/llama.cpp/pull/27851).  x 1.95 (``GAINS``) = 3.61 x the AVX2 figure.
#: - AVX2 (and AVX-512 without VNNI, which takes the same AVX2 microkernel): "AVX2 numbers are a smaller
#:   (up to 2x) improvement over stock", 8192x8192 GEMMs on 8 threads, "q4_K  1.031  1.273  1.427" (std,
#:   repack, tiled TF; the same PR, 2026-08-28): 1.427 / 1.273 = 1.12 x the repacked GEMM, i.e. 1.12 x
#:   the AVX2 figure.  (Its other types ran 1.32-1.43 TF tiled, "q3_K 0.702 n/a 1.318", "q5_K 0.676 n/a
#:   1.411": one rate whatever the type, as its VNNI ``mul_mat_id`` table, q5_K 2.970 ... iq3_xxs 3.185 TF.)
#: - AMX: kept at the VNNI figure (a build for such a CPU has VNNI; the AMX buffer's types are not
#:   modelled).
#:
#: Against it, one public run on a CPU the excerpt does not name (4 threads, a build of the PR's branch,
#: "build: 9e31ebf (1)"): a Q6_K MoE, "bailingmoe3 7.9B.A1.3B Q6_K", pp512 "52.47 ± 0.03" with
#: GGML_CPU_TILED_MM=1 and "55.46 ± 0.05" with it off, "Looks like it doesn't help" (the same PR,
#: 2026-09-11).  This machine's bench-qwen3moe-2g (Q6_K expert down-projections) stays under its
#: measured pp with the figures above (README, "Measured speed"), so they are kept for experts too.
TILED_GAINS: dict[Isa, float] = {
    Isa.AVX2: 1.12,
    Isa.AVX512: 1.12,
    Isa.AVX512_VNNI: round(1.85 * GAINS[Isa.AVX512_VNNI].value, 2),
    Isa.AMX: round(1.85 * GAINS[Isa.AVX512_VNNI].value, 2),
}


def tiled_cost(type_name: str, dialect: Dialect, isa: Isa | None, isa_gain: float,
               repacked: bool) -> float | None:
    """Compute cost of one weight through the tiled matmul against the default's (1: the default
    efficiency at the CPU's instruction-set figure), or None when that kernel does not take it: a
    dialect without it, a CPU whose instruction set is not known (or not x86), a type it lacks, a weight
    in a repack buffer.  The batch's rows (:data:`TILED_MIN_ROWS`) are the caller's."""
    if not dialect.cpu_tiled_matmul or isa is None or repacked or type_name not in TILED_TYPES:
        return None
    return isa_gain / TILED_GAINS[isa]


def cpu_pp_cost(type_name: str, dialect: Dialect, isa_gain: float = 1.0, routed: bool = False,
                repacked: bool = True, isa: Isa | None = None, rows: float = float(TILED_MIN_ROWS)) -> float:
    """Compute cost of one weight of ``type_name`` in a prompt's micro-batch on the CPU against the
    default's (1: the default efficiency at the CPU's instruction-set figure applies).  Mainline
    llama.cpp takes the instruction set's gain only where a GEMM multiplies (:data:`CPU_TINYBLAS_TYPES`,
    and :data:`CPU_REPACK_GEMM_TYPES` when ``repacked``: in a ``CPU_REPACK`` buffer); a weight without
    one (vec_dot row by row, AVX2 code) and every routed expert cost ``isa_gain``,
    i.e. the AVX2 figure: ``mul_mat_id`` never takes the GEMM, it runs one GEMV per routed token for a
    repacked type (repack.cpp ``forward_mul_mat_id``: ``gemv<...>(..., 1, ...)`` in its loop over the
    expert's rows; the x86 GEMVs, arch/x86/repack.cpp ``ggml_gemv_q4_K_8x8_q8_K`` and the others, are
    AVX2 code) and ``vec_dot`` per row pair otherwise (ggml-cpu.c
    ``ggml_compute_forward_mul_mat_id_one_chunk``).  The lattice i-quants keep :func:`cpu_cost`;
    ik_llama.cpp's kernels (``fast_cpu_kernels``) have their own figure.  A dialect with the tiled
    matmul (``cpu_tiled_matmul``) multiplies :data:`TILED_TYPES` outside a repack buffer, by ``rows``
    (the batch's, or those routed to an expert) of :data:`TILED_MIN_ROWS` or more, at
    :func:`tiled_cost` (``isa``: the CPU's tier, None when not known).  A dialect without the CPU GEMMs
    (``cpu_gemm`` off: builds before llamafile's sgemm) multiplies every weight through ``vec_dot``: the
    tinyBLAS types at :data:`PRE_SGEMM_COSTS` (the PR's own speed-ups) or the AVX2 figure, whichever
    costs more, the rest at the AVX2 figure as in later builds."""
    d = dialect if isinstance(dialect, Dialect) else Dialect(dialect)  # an unregistered variant stays
    tiled = tiled_cost(type_name, d, isa, isa_gain, repacked) if rows >= TILED_MIN_ROWS else None
    if tiled is not None:
        return tiled
    if d.fast_cpu_kernels or type_name in SLOW_CPU_TYPES:
        return cpu_cost(type_name, d, isa_gain)
    if not d.cpu_gemm:  # every product through vec_dot (no tinyBLAS, no repack buffer yet)
        return isa_gain if routed else max(isa_gain, PRE_SGEMM_COSTS.get(type_name, isa_gain))
    gemm = type_name in CPU_TINYBLAS_TYPES or (repacked and type_name in CPU_REPACK_GEMM_TYPES)
    return isa_gain if routed or not gemm else 1.0


#: A GPU's matrix multiplication gets more of its peak the more rows (tokens) each weight matrix
#: multiplies: the default GPU compute efficiency holds at 512 rows (a dense model at -ub 512) and is
#: scaled by sqrt(rows / 512), between 16 rows (below them the reads bound the time) and twice the
#: default.  A routed expert multiplies the tokens routed to it, ``ubatch x n_expert_used / n_expert``
#: on average over the experts hit, so MoE prompt processing at a small -ub is far below the dense rate.
#: Public measurements: DeepSeek-R1 on 16 RTX 3090 ran pp512 at 216.01 t/s with -ub 512 (16 tokens an
#: expert) and pp4096 at 323.48 t/s with -ub 4096 (128 an expert), 1.5x faster despite 8x the attention
#: per token (https://github.com/ikawrakow/ik_llama.cpp/issues/263); Llama-2-70B on 4 RTX 3090 at
#: -ub 2048 ran 0.61 x the FP16 peak (https://github.com/ikawrakow/ik_llama.cpp/issues/1051) where
#: 7B models ran pp512 at 0.31-0.37 of it (https://github.com/ggml-org/llama.cpp/pull/4766, /pull/4812,
#: /pull/6017).
#: The exponent 0.35 makes the estimate's own ratio of those two DeepSeek-R1 runs (the attention of
#: the longer prompt included) the measured 1.50x.  On the public development set
#: (tests/core/test_speed_public.py) the pp median error went from 1.40x to 1.24x on the odd records
#: and from 1.74x to 1.49x on the even ones (0.5, the odd records' best, gave 1.14x and 1.56x).
#:
#: The gain above 512 rows came from ik_llama.cpp's runs (those two records); mainline llama.cpp's CUDA
#: backend has none (:func:`gpu_rows_max_gain`).
GPU_ROWS_REF = 512
GPU_ROWS_EXPONENT = 0.35
GPU_ROWS_MIN = 16
GPU_ROWS_MAX_GAIN = 2.0


#: Not modelled (tried in session 11): mainline's ``mul_mat_id`` picks the MMQ tile width from the whole
#: batch on NVIDIA (mmq.cu ``int64_t ncols_opt = ne12;``, the per-expert mean only on RDNA3/4) and runs
#: each expert's tokens in tiles of that width (mmq.cuh ``mul_mat_q``: ``col_diff`` from
#: ``expert_bounds``; ``mul_mat_q_process_tile`` loads and multiplies all J columns), so an expert with n
#: tokens costs ``ceil(n / J)`` full tiles.  Taking the smaller of that fill and the rows factor below
#: moved ll16991 (gpt-oss-20b, pp128 at -ub 2048, RTX PRO 6000: 16 tokens an expert) from 1.94x to 0.88x
#: and matched the GB10's Qwen3-30B runs being no slower at 1024 than at 512 tokens (dgx-spark.md: T_PP
#: 0.393 s and 0.387 s), but put its gpt-oss-120b at 512 tokens (16 an expert: "|   512 |     32 |    1
#: |    544 |    0.445 |  1151.80 |") at 0.49x, from 1.12x: the full-tile cost is not what that run shows.
def gpu_rows_max_gain(dialect: Dialect, kind: DeviceKind) -> float:
    """The most a GPU's matrix efficiency gains from rows above :data:`GPU_ROWS_REF`.

    None on a CUDA GPU in mainline llama.cpp: it multiplies every quantized weight type with MMQ on
    Turing and later (ggml-cuda/mmq.cu ``ggml_cuda_should_use_mmq``: ``if (turing_mma_available(cc))
    return true;``) in output tiles of at most 128 tokens (mmq.cuh ``mul_mat_q_switch_J``: ``for (int J =
    8; J <= 128 && ...``; I = 128 weight rows, mmq-config-ampere.cuh / -blackwell.cuh) spread over the
    SMs by stream-k (``launch_mul_mat_q``), so a matrix multiplied by more than 512 tokens has more
    tiles of the same shape, not better ones.  Measured so on llama.cpp's own DGX Spark (GB10) runs
    (benches/dgx-spark/dgx-spark.md, build 11fb327bf (7941), llama-batched-bench -ub 2048, one
    sequence): the dense Qwen2.5-Coder-7B Q8_0 "|   512 |     32 |    1 |    544 |    0.212 |  2420.12 |"
    against "|  4096 |     32 |    1 |   4128 |    1.831 |  2237.25 |" (2048-token micro-batches, slower
    by their attention alone), where the power law promised 1.62x.  The gain stays where it was
    measured: ik_llama.cpp (``Dialect.cuda_gains_past_512_rows``), and the other backends (ROCm may take
    hipBLAS for large batches, mmq.cu; Metal and Vulkan not checked)."""
    if kind is DeviceKind.CUDA and not dialect.cuda_gains_past_512_rows:
        return 1.0
    return GPU_ROWS_MAX_GAIN


def gpu_rows_factor(rows: float, max_gain: float = GPU_ROWS_MAX_GAIN) -> float:
    """The GPU compute efficiency of a matrix multiplied by ``rows`` tokens against the default's (at
    most ``max_gain``: :func:`gpu_rows_max_gain`)."""
    r = max(float(GPU_ROWS_MIN), rows)
    return float(min(max_gain, (r / GPU_ROWS_REF) ** GPU_ROWS_EXPONENT))


def for_host(eff: Efficiencies, core_speed: float, what: str) -> Efficiencies:
    """``eff`` with the host's work per RPC split scaled to its cores (``core_speed``: a core's compute
    against the AVX2 figure at its clock, ``what`` says why), unless measured or calibrated."""
    if eff.rpc_latency_us.source is not Source.DEFAULT or core_speed == 1.0 or not core_speed > 0:
        return eff
    us = round(RPC_HOST_US / core_speed, 1)
    return replace(eff, rpc_latency_us=Figure(us, eff.rpc_latency_us.unit, Source.DEFAULT,
                                              f"the host's work per split: {RPC_HOST_US:g} µs on an AVX2 "
                                              f"core (this project's bench) / {core_speed:.3g} ({what})"))


def defaults_for(dialect: Dialect) -> Efficiencies:
    """The default efficiencies of a backend (llama.cpp's unless the dialect's CPU kernels differ)."""
    return _FAST_CPU if Dialect(dialect).fast_cpu_kernels else DEFAULT
