"""The host CPU's instruction set, and what it is worth to llama.cpp's CPU matrix multiplication.

Read from ``/proc/cpuinfo`` on Linux (its ``model name`` and ``flags``; :func:`parse_proc_cpuinfo`) or
from ``sysctl`` on macOS (``machdep.cpu.brand_string`` and the ``machdep.cpu.*features`` lines of an
Intel Mac; :func:`parse_sysctl`); elsewhere, or when neither says, the instruction set is not known
and the CPU keeps the AVX2 figure (:data:`offload_planner.core.speed.hardware.DEFAULT_CPU_TFLOPS_PER_THREAD`),
said so.  Nothing here reads a file: ``backend.speed_store.this_cpu`` does.

What mainline llama.cpp's CPU backend (ggml-cpu, build 11434) multiplies each weight type with on
x86, and which of these instruction sets it uses:

- ``Q4_0``, ``IQ4_NL``, ``MXFP4``: repacked 8x8 GEMM/GEMV (``repack.cpp``
  ``ggml_repack_get_optimal_repack_type``: with AVX2); the GEMM has an AVX-512 (BW+DQ) path and its
  int8 dot products (``mul_sum_us8_pairs_acc_int32x16``) use ``vpdpbusd`` with AVX512-VNNI, else
  ``vpmaddubsw`` + ``vpmaddwd`` (``arch/x86/repack.cpp``).
- ``Q4_K`` and (with AVX-512) ``Q2_K``: repacked 8x8 GEMM with an AVX-512 (BW+DQ) path; its dot
  products are ``vpmaddubsw`` in both paths (no VNNI).
- ``Q8_0`` (and ``Q4_0``/``Q5_0``/``IQ4_NL`` unrepacked), ``F16``, ``BF16``, ``F32``: llamafile's
  tinyBLAS (``llamafile/sgemm.cpp``): 256-bit integer tiles with ``vpdpbusd`` under AVX512-VNNI
  (``updot``), 512-bit float tiles with AVX512F, ``vdpbf16ps`` with AVX512-BF16.
- ``Q3_K``, ``Q5_K``, ``Q6_K``, ``IQ4_XS`` and the lattice i-quants (``IQ1_S`` ... ``IQ3_S``): no x86
  repack; each row through the type's ``ggml_vec_dot_*`` (``arch/x86/quants.c``), 256-bit AVX2 code
  whatever the CPU.  The i-quants' cost (:data:`efficiency.SLOW_CPU_TYPES`) therefore does not
  scale with the instruction set (``efficiency.cpu_cost``).
- Routed experts (``GGML_OP_MUL_MAT_ID``), whatever their type: never a GEMM; one GEMV per routed
  token for a repacked type (``repack.cpp`` ``forward_mul_mat_id``), ``ggml_vec_dot_*`` per row
  otherwise (``ggml-cpu.c`` ``ggml_compute_forward_mul_mat_id_one_chunk``): AVX2 code, so a prompt's
  experts do not scale with the instruction set either (``efficiency.cpu_pp_cost``).
- Before both of the last two, in the pinned build (not in the 2025 builds nor ik_llama.cpp): the
  tiled matmul (``tiled/tiled.cpp``, llama.cpp PR 27851) takes ``Q2_K`` ... ``Q6_K``, ``IQ4_XS`` and
  the lattice i-quants outside a repack buffer, for ``mul_mat`` and per expert for ``mul_mat_id``, by
  8 rows or more: a 16x16 microkernel with ``vpdpbusd`` under AVX512-VNNI (+VL, DQ), else AVX2 code
  (``efficiency.TILED_GAINS``; ``Dialect.cpu_tiled_matmul``).
- AMX (``amx/amx.cpp``, only in a build with ``GGML_AMX_INT8``: the ``sapphirerapids`` variant of
  ``GGML_CPU_ALL_VARIANTS``, or a native build on such a CPU): ``Q4_0``, ``Q4_1``, ``Q8_0``, ``Q4_K``,
  ``Q5_K``, ``Q6_K``, ``IQ4_XS`` (``qtype_has_amx_kernels``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class Isa(StrEnum):
    """The instruction-set tiers whose llama.cpp CPU throughput differs, lowest first."""

    AVX2 = "avx2"  # AVX2 + FMA (Haswell, Zen 1-3): the default figure's reference
    AVX512 = "avx512"  # AVX512F/BW without VNNI (Skylake-SP/X)
    AVX512_VNNI = "avx512_vnni"  # with AVX512-VNNI (Cascade/Ice Lake, Zen 4, Zen 5)
    AMX = "amx"  # with AMX-INT8 tiles (Sapphire/Emerald/Granite Rapids)


@dataclass(frozen=True)
class IsaGain:
    """Compute of one core of a tier against an AVX2 core at the same clock, and why."""

    value: float
    why: str


#: Derivation (mainline llama.cpp, CPU only, prompt processing of 512 tokens, each CPU at its vendor
#: base clock, this estimator's own figure with the AVX2 default; measured / estimated):
#:
#: AVX2 CPUs:
#:   Ryzen-5975WX (32 threads, 3.6 GHz), LLaMA-3.1-8B, "llama.cpp" column: Q4_0 pp512
#:   "139.09 ± 0.62", Q8_0 "162.21 ± 0.42" (https://github.com/ikawrakow/ik_llama.cpp/pull/54):
#:   1.16 and 1.37; Threadripper PRO 5995WX (64 threads, 2.7 GHz), Mistral-7B-Instruct-v0.3 Q4_0
#:   pp 512 "210.26 ± 0.32" (https://github.com/ggml-org/llama.cpp/pull/8908): 1.12.  Median 1.16;
#:   this project's earlier 2-core AVX2 machine: 1.1-1.2 (README, "Measured speed").
#: AVX-512 with VNNI (Zen 4):
#:   Ryzen-7950X (16 threads, 4.5 GHz), LLaMA-3.1-8B: "the fastest mainline `llama.cpp` quant on
#:   this CPU is `Q4_0`, and I get **170 t/s**" (https://github.com/ikawrakow/ik_llama.cpp/pull/533,
#:   2025-06): 2.26.
#: So an AVX-512-VNNI core computes 2.26 / 1.16 = 1.95 of an AVX2 core at the same clock.  Checks:
#: the same 7950X in 2024 (before mainline's AVX-512 GEMMs), Q4_0 "123.46 ± 0.09", Q8_0
#: "141.30 ± 0.86" (ik_llama.cpp PR 54): 1.64 and 1.89, i.e. 1.41-1.63 of the AVX2 median; mainline's
#: AVX-512 Q4_K GEMM on 6 threads, LLaMA-2-7B Q4_K_M "pp 512 | 84.00 ± 0.15" against "66.83 ± 0.10"
#: for the AVX2 GEMM on the same CPU (https://github.com/ggml-org/llama.cpp/pull/12829; the CPU is not
#: named there; the same author's AVX-512 machine in llama.cpp PR 9921 is an "AMD Raphael 7600X",
#: 6 cores, 4.7 GHz): 2.50, i.e. 2.16 of the AVX2 median.
#:
#: Without VNNI: 1.26, the gain of mainline's AVX-512 GEMM over its AVX2 one on the same CPU
#: (PR 12829 above: 84.00 / 66.83 = 1.257); no public CPU-only measurement of a VNNI-less AVX-512
#: CPU was found.  AMX: kept at the VNNI figure; the public figures disagree (a prompt "2x faster
#: compared to no AMX supported commit", gemma-2b Q4_0 on an AMX Xeon,
#: https://github.com/ggml-org/llama.cpp/pull/8998; ollama measured its AMX build 8.6% slower on
#: Sapphire Rapids and 19.4% faster on Emerald Rapids, https://github.com/ollama/ollama/pull/9203).
GAINS: dict[Isa, IsaGain] = {
    Isa.AVX2: IsaGain(1.0, "the AVX2 figure"),
    Isa.AVX512: IsaGain(1.26, "mainline's AVX-512 GEMM over its AVX2 one on one CPU, llama.cpp PR 12829"),
    Isa.AVX512_VNNI: IsaGain(1.95, "mainline pp512 on a Ryzen-7950X (ik_llama.cpp PR 533) against "
                                   "AVX2 Threadrippers (ik_llama.cpp PR 54, llama.cpp PR 8908)"),
    Isa.AMX: IsaGain(1.95, "AMX kept at the AVX-512 VNNI figure (public figures disagree: "
                           "llama.cpp PR 8998, ollama PR 9203)"),
}

ISA_NAMES = {t.value: t for t in Isa}


def parse_isa(text: str) -> Isa:
    """A declared tier (``isa=avx512_vnni``); ValueError names the known ones."""
    t = ISA_NAMES.get(text.strip().lower().replace("-", "_"))
    if t is None:
        raise ValueError(f"unknown instruction set {text!r} (known: {', '.join(ISA_NAMES)})")
    return t


def isa_of(flags: Iterable[str]) -> Isa | None:
    """The tier of a CPU with these feature flags (``/proc/cpuinfo`` spelling, lower case): None below
    AVX2 (or not x86: ARM's ``Features`` name none of these)."""
    f = {x.lower() for x in flags}
    if "amx_int8" in f and "amx_tile" in f:
        return Isa.AMX
    if "avx512_vnni" in f and "avx512bw" in f:
        return Isa.AVX512_VNNI
    if "avx512f" in f and "avx512bw" in f:
        return Isa.AVX512
    if "avx2" in f and "fma" in f:
        return Isa.AVX2
    return None


@dataclass(frozen=True)
class CpuInfo:
    """What the operating system says about the host CPU."""

    model: str  # "AMD EPYC 9654 96-Core Processor", "" when not said
    isa: Isa | None  # None: below AVX2, not x86, or not known
    ghz: float | None  # the base clock the model name states ("... @ 2.30GHz"), else None
    source: str  # where it was read: "/proc/cpuinfo", "sysctl"

    @property
    def gain(self) -> float:
        return GAINS[self.isa].value if self.isa is not None else 1.0

    def describe(self) -> str:
        if self.source.startswith("not read"):
            return f"the CPU's instruction set {self.source}"
        tier = self.isa.value if self.isa else "no AVX2 (or not x86)"
        return f"{self.model or 'the CPU'}: {tier} per {self.source}"


_CLOCK_RE = re.compile(r"@\s*(\d+(?:\.\d+)?)\s*GHz", re.IGNORECASE)


def clock_in_name(model: str) -> float | None:
    """The base clock Intel writes into its model names (``Intel(R) Xeon(R) Platinum 8336C CPU @
    2.30GHz``); AMD's names carry none."""
    m = _CLOCK_RE.search(model)
    v = float(m.group(1)) if m else 0.0
    return v if 0.0 < v <= 10.0 else None


def _first(lines: list[str], key: str) -> str | None:
    """The value of ``key``; a byte-order mark before it (U+FEFF, not whitespace to ``str.strip``)
    hid the key."""
    for line in lines:
        k, sep, v = line.partition(":")
        if sep and k.replace("\ufeff", "").strip().lower() == key:
            return v.strip()
    return None


#: A model name is a line of text; at most this many characters of it are kept
MAX_MODEL_CHARS = 200


def clean_model(text: str) -> str:
    """A CPU model name as it can be printed: control and other unprintable characters escaped
    (``\x1b``: an escape sequence in /proc/cpuinfo or a VM's brand string was printed raw to the
    terminal), at most :data:`MAX_MODEL_CHARS` characters."""
    out = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text[:MAX_MODEL_CHARS])
    return out.strip() + ("..." if len(text) > MAX_MODEL_CHARS else "")


def parse_proc_cpuinfo(text: str) -> CpuInfo:
    """Linux ``/proc/cpuinfo``: the first processor's ``model name`` and ``flags`` (x86; ARM lists
    ``Features`` and no tier applies)."""
    lines = text.splitlines()
    model = clean_model(_first(lines, "model name") or "")
    flags = (_first(lines, "flags") or "").split()
    return CpuInfo(model, isa_of(flags), clock_in_name(model), "/proc/cpuinfo")


def parse_sysctl(text: str) -> CpuInfo:
    """macOS ``sysctl machdep.cpu`` output: ``machdep.cpu.brand_string`` and the upper-case feature
    lists (``machdep.cpu.features``, ``machdep.cpu.leaf7_features``) of an Intel Mac, spelled as Linux
    spells them (``AVX512F`` -> ``avx512f``, ``AVX512VNNI`` -> ``avx512_vnni``, ``AVX2``, ``FMA``);
    Apple silicon lists none of them (no tier)."""
    lines = text.splitlines()
    model = clean_model(_first(lines, "machdep.cpu.brand_string") or "")
    raw = " ".join(v for k in ("machdep.cpu.features", "machdep.cpu.leaf7_features")
                   if (v := _first(lines, k)))
    spelled = {"AVX512VNNI": "avx512_vnni", "AVX512BW": "avx512bw", "AVX512F": "avx512f",
               "AVX2": "avx2", "FMA": "fma", "AMX_INT8": "amx_int8", "AMX_TILE": "amx_tile"}
    flags = [spelled.get(w.upper(), w.lower()) for w in raw.split()]
    return CpuInfo(model, isa_of(flags), clock_in_name(model), "sysctl")
