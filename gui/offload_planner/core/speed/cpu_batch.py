"""What the weights' products of a pass of ``b`` tokens (a few: all slots generating, a speculative
verify batch, a draft's pass over it) cost on ggml's CPU backend, beyond reading the weights.

The pinned build's CPU kernels (build 11434, ``ggml/src/ggml-cpu``) read each weight once a pass,
whatever ``b``, and compute every token's product, so the CPU's part of a pass is the larger of its
reads over its bandwidth and the sum of its products (devices' reads and products overlap as a
plain token's do); what differs with ``b`` is the kernel each product goes through:

- One column at a time, a one-token kernel per token (``ggml_vec_dot_*`` in
  ``ggml_compute_forward_mul_mat_one_chunk``: 16 weight rows at a time, ``blck_0``, each multiplied
  by every one of the chunk's up to 16 columns, ``blck_1``, while they sit in the cache; the repacked
  types' ``gemv`` for the columns left over from the GEMM's groups of 4, ``repack.cpp``
  ``forward_mul_mat_one_chunk``: ``if (nrows > 3) gemm(... nrows - (nrows % 4) ...)``, then ``gemv``
  per remaining column over the same chunk of rows; a routed expert's rows, one ``gemv`` or
  ``vec_dot`` per token routed to it).  The first column pays the reads; every further one costs what
  the kernel takes over the bytes from the cache: the rate a thread multiplies a plain token's weights
  at (:func:`rates.thread_bandwidth`, measured from these very kernels' on-CPU time), times the threads.
  So a batch of ``b`` costs ``b`` times that kernel time, and where a plain token is bound by this
  rate rather than the RAM (few threads), extra tokens are nearly as dear as the first.
- A GEMM over the columns at the prompt's compute (:func:`efficiency.cpu_pp_cost`, as a prompt's
  micro-batch prices it), only over the column groups the GEMM's main loop takes: llamafile's tinyBLAS
  for :data:`efficiency.CPU_TINYBLAS_TYPES` from 2 columns (``llamafile_sgemm``: ``if (n < 2) return
  false``); the repacked GEMM's 16-column groups with AVX-512, 4-column ones on AVX2
  (:data:`GEMM_TILE`); the tiled matmul for :data:`efficiency.TILED_TYPES` outside a repack buffer from
  :data:`efficiency.TILED_MIN_ROWS` columns (``ggml_tiled_min_batch``), by whole 16x16 microtiles.

Measured on this project's 2-vCPU AVX-512 EPYC with the real llama-server (``bench/speed_slots.py``,
bench-llama-2g, Q4_K_M: its Q4_K repacked, its Q6_K through vec_dot below 8 columns and tiled from 8;
tests/data/speed/cpu_batch_measured.json): N requests at once over one request generated 1.02-1.07x
at N = 2, 1.19-1.24x at 4, 1.03-1.05x at 8 and 1.76x at 16 tokens per CPU second; this prices them
(calibrated to the run's one request) at 1.00x, 1.11x, 0.94-0.95x and 1.43x.  Two figures of that
machine's kernels (perf, :data:`NARROW_GEMM_GAIN`, :data:`TILED_UNPACK_COLUMNS`) price the repacked
GEMM's 4-column loop and the tiled matmul's unpacking of every weight once a pass.

ik_llama.cpp's own kernels (``fast_cpu_kernels``) are not read here: a batch of more than one token
costs its FLOPs at its prompt compute, as before.  A GPU's pass is not priced here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from offload_planner.core.dialects import Dialect
from offload_planner.core.speed.cpu_isa import Isa
from offload_planner.core.speed.efficiency import (
    CPU_REPACK_GEMM_TYPES,
    CPU_TINYBLAS_TYPES,
    TILED_MIN_ROWS,
    Efficiencies,
    cpu_cost,
    cpu_pp_cost,
    tiled_cost,
)
from offload_planner.core.speed.hardware import DeviceSpeed
from offload_planner.core.speed.rates import compute_tflops, thread_bandwidth

#: the repacked GEMM multiplies the columns in groups of this many (repack.cpp ``forward_mul_mat_one_chunk``:
#: ``gemm`` over ``nrows - (nrows % 4)``, ``gemv`` for the rest) ...
REPACK_GEMM_GROUP = 4
#: ... and with AVX-512 (BW+DQ) its main loop takes 16 columns at a time, the groups of 4 left over in a
#: second, narrower loop (arch/x86/repack.cpp ``ggml_gemm_q4_K_8x8_q8_K``: ``int anr = nr - nr % 16``,
#: ``for (; y < anr / 4; y += 4)`` under ``__AVX512BW__ && __AVX512DQ__``, then ``for (; y < nr / 4; y++)``):
#: only the 16-column groups run at the prompt's rate there (the 4-column loop is the main one on AVX2).
#: The tiled matmul computes whole 16x16 microtiles (tiled.cpp ``tiled_run_microtile``, ``TILED_MICRO``),
#: so 8 to 15 columns cost 16.
GEMM_TILE = 16
#: llamafile's tinyBLAS takes a product from this many columns (sgemm.cpp ``llamafile_sgemm``, x86)
TINYBLAS_MIN_COLUMNS = 2

#: The repacked GEMM's 4-column loop (the AVX-512 GEMM's columns outside its 16-column groups) against
#: the one-token ``gemv``, per column: perf's on-CPU time on this project's machine (2-vCPU AMD EPYC,
#: Zen 4, pinned build, bench-llama-2g at -t 1 in llama-server): ``ggml_gemv_q4_K_8x8_q8_K`` 79.6 ms a
#: token for 48 tokens one at a time, ``ggml_gemm_q4_K_8x8_q8_K`` 69 ms a column for 4 requests at once
#: (192 columns, less their 32-token prompt): 1.15.  One CPU's figure (the AVX-512 tier's): on AVX2
#: the 4-column loop is the GEMM's main one, priced at the prompt's rate.
NARROW_GEMM_GAIN = 1.15

#: The tiled matmul unpacks and repacks each weight into its tile format once a pass, whatever the
#: columns (tiled.cpp ``tiled_unpack_src0`` and ``tiled_repack_src0`` in the narrow path's loop over
#: 16-row weight groups): priced as this many one-token columns of the weight.  perf's on-CPU time on
#: this project's machine (as :data:`NARROW_GEMM_GAIN`), 8 requests at once (48 passes of 8 tokens
#: through the tiled Q6_K): ``tiled_unpack_src0`` + ``tiled_repack_src0`` 22.1% of 45.16 s, about 208 ms a
#: pass, where ``ggml_vec_dot_q6_K_q8_K`` took 21.6 ms a token one at a time: 9.6 columns' worth.  A
#: prompt's micro-batch of hundreds of tokens spreads it thin (not counted there).
TILED_UNPACK_COLUMNS = 9.6

#: the instruction sets whose repacked GEMM runs 16 columns at a time (AVX-512 BW+DQ)
WIDE_GEMM_ISAS = frozenset({Isa.AVX512, Isa.AVX512_VNNI, Isa.AMX})

#: (ggml type name, in a CPU_REPACK buffer, a routed expert) -> [bytes, matrix elements]
Key = tuple[str, bool, bool]


@dataclass
class CpuWeights:
    """A pass's weight matrices on one device, by the kernel that multiplies them."""

    parts: dict[Key, list[float]] = field(default_factory=dict)

    def add(self, key: Key, nbytes: float, elements: float) -> None:
        got = self.parts.setdefault(key, [0.0, 0.0])
        got[0] += nbytes
        got[1] += elements


def gemm_columns(type_name: str, dialect: Dialect, repacked: bool, isa: Isa | None, b: float,
                 routed: bool = False, rows: float = 0.0) -> tuple[float, float]:
    """How many of a weight's ``b`` columns go through a GEMM at the prompt's rate (the rest one at a
    time, at the one-token kernel's), and how many columns' work that GEMM does (the tiled matmul's
    whole microtiles).  A dense weight's by its kernel; a routed expert's (``mul_mat_id``) only through
    the tiled matmul, by the ``rows`` routed to an expert it hits."""
    if not dialect.cpu_gemm:
        return 0.0, 0.0  # builds before llamafile's sgemm: vec_dot row by row
    tiled = tiled_cost(type_name, dialect, isa, 1.0, repacked) is not None
    if routed or (tiled and b >= TILED_MIN_ROWS):
        if not (tiled and (rows if routed else b) >= TILED_MIN_ROWS):
            return 0.0, 0.0
        return b, b if routed else GEMM_TILE * math.ceil(b / GEMM_TILE)
    if repacked and type_name in CPU_REPACK_GEMM_TYPES:
        group = GEMM_TILE if isa in WIDE_GEMM_ISAS else REPACK_GEMM_GROUP
        return b - b % group, b - b % group
    if type_name in CPU_TINYBLAS_TYPES and b >= TINYBLAS_MIN_COLUMNS:
        return b, b
    return 0.0, 0.0


def narrow_columns(type_name: str, dialect: Dialect, repacked: bool, isa: Isa | None, b: float,
                   routed: bool = False) -> float:
    """How many of the columns :func:`gemm_columns` leaves to one-column kernels go through the
    repacked AVX-512 GEMM's narrower 4-column loop instead (priced at the one-token kernel's rate times
    :data:`NARROW_GEMM_GAIN`)."""
    if routed or not dialect.cpu_gemm or not repacked or type_name not in CPU_REPACK_GEMM_TYPES:
        return 0.0
    if isa not in WIDE_GEMM_ISAS:
        return 0.0
    left = b % GEMM_TILE
    return left - left % REPACK_GEMM_GROUP


def one_column_seconds(dev: DeviceSpeed, eff: Efficiencies) -> float | None:
    """Seconds a byte of weights takes through a one-token kernel on ``dev``'s threads (None when its
    threads are not known: then no thread rate bounds a plain token either, and such a column costs
    its FLOPs at the device's compute, as every column did before this was read from ggml-cpu)."""
    if not dev.threads:
        return None
    gbs = dev.threads * thread_bandwidth(dev, eff).value * dev.share
    return 1.0 / (gbs * 1e9) if gbs > 0 else None


def products_seconds(w: CpuWeights, dev: DeviceSpeed, eff: Efficiencies, dialect: Dialect, b: float,
                     frac: float, hit: float) -> float:
    """Seconds the products of a pass of ``b`` tokens take on ``dev``'s CPU threads (its reads
    aside): each weight's columns through a GEMM at its FLOPs, the others one at a time at the
    one-token kernel's rate; a routed expert multiplies the ``b x frac / hit`` tokens routed to it when
    hit, ``b x frac`` tokens' worth of all of them.  ``frac``: ``n_expert_used / n_expert``; ``hit``: the
    share of the experts at least one token routes to."""
    per_byte = one_column_seconds(dev, eff)
    tflops = compute_tflops(dev, eff) * 1e12
    fast = dialect.fast_cpu_kernels
    total = 0.0
    for (type_name, repacked, routed), (nbytes, elements) in w.parts.items():
        cols = b * frac if routed else b
        rows = b * frac / hit if routed and hit > 0 else b
        if fast:
            gemm = work = cols if b > 1 else 0.0
        else:
            gemm, work = gemm_columns(type_name, dialect, repacked, dev.isa, cols, routed, rows)
        if gemm:
            cost = cpu_pp_cost(type_name, dialect, dev.isa_gain, routed, repacked, dev.isa, rows=rows)
            total += 2.0 * elements * work * cost / tflops
            if not fast and per_byte is not None and tiled_cost(type_name, dialect, dev.isa, 1.0,
                                                               repacked) is not None:
                total += nbytes * (hit if routed else 1.0) * TILED_UNPACK_COLUMNS * per_byte
        one = cols - gemm
        if one > 0:
            slow = cpu_cost(type_name, dialect, dev.isa_gain)
            narrow = 0.0 if fast else narrow_columns(type_name, dialect, repacked, dev.isa, cols, routed)
            one -= narrow * (1.0 - 1.0 / NARROW_GEMM_GAIN)
            t = nbytes * one * per_byte if per_byte is not None else 2.0 * elements * one / tflops
            if slow > 1.0:  # the lattice i-quants' vec_dot: their FLOPs, as a plain token's (tg.token_extras)
                t = max(t, 2.0 * elements * one * slow / tflops)
            total += t
    return total
