"""Compute figures that depend on the kernels: the default thread count (llama.cpp's physical cores,
``common_cpu_get_num_math``), mainline's slow CPU matrix path for the lattice i-quants (no repacked
or tinyBLAS GEMM for IQ1_S..IQ3_S), a GPU's efficiency by the rows a matrix multiplies; on real GGUF
headers written by the project's synth."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import DeviceKind, DeviceSet, parse_device_decl
from offload_planner.core.dialects.base import Dialect
from offload_planner.core.errors import PlannerError
from offload_planner.core.ggml_types import type_by_name
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.speed.cpu_isa import GAINS, Isa
from offload_planner.core.speed.efficiency import (
    CPU_GEMM_TYPES,
    GPU_ROWS_EXPONENT,
    GPU_ROWS_MAX_GAIN,
    IQUANT_CPU_COMPUTE,
    TILED_GAINS,
    defaults_for,
    gpu_rows_factor,
    gpu_rows_max_gain,
)
from offload_planner.core.speed.estimate import estimate, ubatch_sweep
from offload_planner.core.speed.hardware import (
    DEFAULT_CPU_GHZ,
    DEFAULT_CPU_TFLOPS_PER_THREAD,
    Source,
    Threads,
    hardware_for,
)
from offload_planner.core.synth import SMALL_MODELS, QuantMix, write_model


def _cpu_only(decl: str = "CPU=64GiB,bw=100GB/s") -> DeviceSet:
    return DeviceSet(parse_device_decl(decl), ())


def test_cpu_compute_defaults_to_the_physical_cores() -> None:
    """Without -t llama.cpp computes with the physical cores: the declared ``cores=``, else this
    machine's (``Threads``); -t wins over both."""
    per = DEFAULT_CPU_TFLOPS_PER_THREAD
    declared = hardware_for(_cpu_only("CPU=64GiB,bw=100GB/s,cores=16"))
    assert declared["CPU"].tflops.value == pytest.approx(16 * per)
    assert "16 physical cores" in declared["CPU"].tflops.note
    assert hardware_for(_cpu_only("CPU=64GiB,bw=100GB/s,cores=16"), threads=4)["CPU"].tflops.value == \
        pytest.approx(4 * per)
    here = hardware_for(_cpu_only("CPU=64GiB"), cores=Threads(6, 6, False, {}, ("CPU",)))
    assert here["CPU"].tflops.value == pytest.approx(6 * per)
    # -t 56 on 28 declared cores: the sibling threads add no compute (common_cpu_get_num_math)
    smt = hardware_for(_cpu_only("CPU=64GiB,bw=100GB/s,cores=28"), threads=56)["CPU"]
    assert smt.tflops.value == pytest.approx(28 * per) and smt.threads == 56


def _uniform(t: Q) -> QuantMix:
    return QuantMix(name=f"uniform-{t.name}", ftype=15, embd=t, output=t, attn=t, attn_v=t, ffn=t,
                    ffn_down=t, shexp=t, shexp_down=t, exps=t, exps_down=t, nextn=t)


@pytest.mark.parametrize("dialect", ["llama.cpp", "ik_llama.cpp"])
def test_lattice_iquants_cost_mainline_more_cpu_compute(tmp_path: Path, dialect: str) -> None:
    """IQ3_S and Q3_K have the same bits per weight (same bytes read), but mainline multiplies IQ3_S
    on the CPU through its vec_dot (0.18 x peak, ik_llama.cpp PR 518's measurement) where the default
    applies to Q3_K; ik_llama.cpp's kernels cover both alike."""
    devices = _cpu_only("CPU=64GiB,bw=100GB/s,cores=8")
    est = {}
    for t in (Q.IQ3_S, Q.Q3_K):
        spec = replace(SMALL_MODELS["llama"], quant=_uniform(t))
        [path] = write_model(spec, tmp_path / f"{t.name}.gguf", header_only=True)
        parsed = parse_server_args(["-c", "1024"], dialect=dialect)
        plan = plan_from_args(open_model(str(path)), devices, parsed, dialect)
        est[t] = estimate(plan, hardware_for(devices), prompt=512)
    ratio = est[Q.Q3_K].pp_tps / est[Q.IQ3_S].pp_tps
    if dialect == "llama.cpp":  # 8 cores x 0.1 x 0.18 TFLOPS: a token of IQ3_S computes longer than it reads
        assert est[Q.IQ3_S].tg_tps < 0.9 * est[Q.Q3_K].tg_tps
    else:
        assert est[Q.IQ3_S].tg_tps == pytest.approx(est[Q.Q3_K].tg_tps)  # same bytes
    if dialect == "llama.cpp":
        slower = defaults_for(plan.dialect).cpu_compute.value / IQUANT_CPU_COMPUTE.value
        assert 1.3 < ratio <= slower + 1e-9  # attention (same for both) dilutes the weights' share
    else:
        assert ratio == pytest.approx(1.0)


def test_gpu_rows_factor_bounds() -> None:
    assert gpu_rows_factor(512) == pytest.approx(1.0)
    assert gpu_rows_factor(128) == pytest.approx(0.25**GPU_ROWS_EXPONENT)
    assert gpu_rows_factor(1) == gpu_rows_factor(16) < gpu_rows_factor(64)  # below 16 rows the reads bound
    assert gpu_rows_factor(10**6) == GPU_ROWS_MAX_GAIN


def _dense_ubatch_sweep(tmp_path: Path, gpu: str, dialect: str) -> dict[int, float]:
    """pp of a dense model on one GPU, compute-bound, by -ub (``gpu``: its declaration)."""
    devices = DeviceSet(parse_device_decl("CPU=64GiB,bw=100GB/s"), (parse_device_decl(gpu),))
    spec = replace(SMALL_MODELS["llama"], quant=_uniform(Q.Q4_K), n_embd=2048, n_head=16, n_head_kv=4,
                   n_ff=8192)  # wide enough that the weights, not attention, take the compute
    path = tmp_path / "dense.gguf"
    if not path.exists():
        write_model(spec, path, header_only=True)
    plan = plan_from_args(open_model(str(path)), devices,
                          parse_server_args(["-ngl", "99", "-c", "16384"], dialect=dialect), dialect)
    return dict(ubatch_sweep(plan, hardware_for(devices), [512, 2048, 4096, 8192], prompt=8192))


@pytest.mark.parametrize(("gpu", "dialect"), [("CUDA0=80GiB,bw=2000GB/s,tflops=1", "ik_llama.cpp"),
                                              ("ROCm0=80GiB,bw=2000GB/s,tflops=1", "llama.cpp")])
def test_dense_gpu_prompt_gains_with_ubatch_until_the_cap(tmp_path: Path, gpu: str, dialect: str) -> None:
    """A dense model on one GPU, compute-bound: -ub 512 -> 2048 gains up to 4 ** exponent in the
    weights' compute; past the capped efficiency (4096 rows and more) a larger -ub gains nothing
    (ik_llama.cpp on CUDA, where the gain was measured, and mainline on a GPU other than CUDA)."""
    sweep = _dense_ubatch_sweep(tmp_path, gpu, dialect)
    assert 1.2 < sweep[2048] / sweep[512] <= 4**GPU_ROWS_EXPONENT + 1e-9
    assert sweep[8192] / sweep[4096] == pytest.approx(1.0, abs=0.05)


def test_mainline_cuda_prompt_gains_nothing_past_512_rows(tmp_path: Path) -> None:
    """Mainline's CUDA MMQ multiplies in tiles of at most 128 tokens (efficiency.gpu_rows_max_gain): the
    same dense model on a CUDA GPU is as fast at -ub 2048 and 8192 as at 512 (attention aside), where
    ik_llama.cpp's estimate gains."""
    sweep = _dense_ubatch_sweep(tmp_path, "CUDA0=80GiB,bw=2000GB/s,tflops=1", "llama.cpp")
    assert sweep[2048] / sweep[512] == pytest.approx(1.0, abs=0.02)
    assert sweep[8192] / sweep[512] == pytest.approx(1.0, abs=0.02)
    assert gpu_rows_max_gain(Dialect("llama.cpp"), DeviceKind.CUDA) == 1.0
    assert gpu_rows_max_gain(Dialect("ik_llama.cpp"), DeviceKind.CUDA) == GPU_ROWS_MAX_GAIN
    assert gpu_rows_max_gain(Dialect("llama.cpp"), DeviceKind.ROCM) == GPU_ROWS_MAX_GAIN


def test_sliding_window_layers_attend_their_window_at_depth(tmp_path: Path) -> None:
    """Prompt processing after a deep context: a sliding-window layer's queries attend at most its
    cache's cells, so gemma3 (5 of 6 layers sliding) slows down far less with depth than the same
    shape without the window."""
    devices = DeviceSet(parse_device_decl("CPU=64GiB,bw=100GB/s"),
                        (parse_device_decl("CUDA0=80GiB,bw=2000GB/s,tflops=1"),))
    slow = {}
    full = replace(SMALL_MODELS["gemma3"], sliding_window=0, sliding_window_pattern=None)
    for name, spec in (("swa", SMALL_MODELS["gemma3"]), ("full", full)):
        [path] = write_model(spec, tmp_path / f"{name}.gguf", header_only=True)
        plan = plan_from_args(open_model(str(path)), devices,
                              parse_server_args(["-ngl", "99", "-c", "40000", "-fa", "on"]))
        est = estimate(plan, hardware_for(devices), prompt=512, depth=32768)
        assert est.pp_tps_at_depth is not None
        slow[name] = est.pp_tps / est.pp_tps_at_depth
    assert 1.0 < slow["swa"] < slow["full"] / 2


def test_mla_attention_at_depth_is_compute_bound_on_the_cpu() -> None:
    """DeepSeek-V3's 128 heads share one 576-wide MLA cell: at 16k cells a token's attention is
    2 x 128 x (576 + 512) x 16384 FLOPs a layer, far more time on 32 CPU threads than reading the
    cells; the estimate adds that time (at ``cpu_attention`` x peak), not the bytes' time."""
    res = Path(__file__).resolve().parents[2] / "resources"
    model = open_model(str(res / "DeepSeek-V3-Q4_K_M.header.gguf"))
    devices = _cpu_only("CPU=1024GiB,bw=200GB/s")
    plan = plan_from_args(model, devices, parse_server_args(["-c", "32768", "-t", "32"]))
    hw = hardware_for(devices, threads=32)
    eff = defaults_for(plan.dialect)
    depth = 16384
    est = estimate(plan, hw, prompt=512, depth=depth)
    s = model.summary
    assert (s.n_head, s.head_dim_k, s.head_dim_v) == (128, 576, 512)
    flops = 2.0 * 128 * (576 + 512) * depth * (s.n_layer - s.n_nextn)
    attn_s = flops / (hw["CPU"].tflops.value * eff.cpu_attention.value * 1e12)
    assert est.tg_tps_at_depth is not None
    assert 1.0 / est.tg_tps_at_depth == pytest.approx(1.0 / est.tg_tps + attn_s, rel=1e-6)


def test_declared_clock_scales_a_cores_compute() -> None:
    """``ghz=`` (the CPU's base clock): a core computes ``ghz / DEFAULT_CPU_GHZ`` of the default
    per-core peak, said declared; no clock keeps the default; a clock that is no clock is refused."""
    base = hardware_for(_cpu_only("CPU=64GiB,bw=100GB/s,cores=16"))["CPU"].tflops
    slow = hardware_for(_cpu_only("CPU=64GiB,bw=100GB/s,cores=16,ghz=2.25"))["CPU"].tflops
    fast = hardware_for(_cpu_only("CPU=64GiB,bw=100GB/s,cores=16,ghz=4500MHz"))["CPU"].tflops
    assert base.source is Source.DEFAULT and slow.source is Source.DECLARED
    assert slow.value == pytest.approx(16 * DEFAULT_CPU_TFLOPS_PER_THREAD * 2.25 / DEFAULT_CPU_GHZ, rel=1e-3)
    assert fast.value == pytest.approx(base.value * 4.5 / DEFAULT_CPU_GHZ, rel=1e-3)
    assert "ghz=2.25" in slow.note
    for bad in ("0", "-1", "fast", "nan", "11"):
        with pytest.raises(PlannerError, match="clock"):
            parse_device_decl(f"CPU=64GiB,ghz={bad}")


def _pp_gain(tmp_path: Path, arch: str, t: Q, dialect: str = "llama.cpp",
             args: tuple[str, ...] = ()) -> float:
    """Prompt processing on an AVX-512 VNNI CPU against an AVX2 one of the same cores and clock, the
    reads all but free (a declared 100 TB/s)."""
    spec = replace(SMALL_MODELS[arch], quant=_uniform(t))
    [path] = write_model(spec, tmp_path / f"{arch}-{t.name}.gguf", header_only=True)
    parsed = parse_server_args(["-c", "1024", *args], dialect=dialect)
    pp = {}
    for isa in ("avx2", "avx512_vnni"):
        devices = _cpu_only(f"CPU=64GiB,bw=100000GB/s,cores=8,isa={isa}")
        plan = plan_from_args(open_model(str(path)), devices, parsed, dialect)
        pp[isa] = estimate(plan, hardware_for(devices), prompt=512).pp_tps
    return pp["avx512_vnni"] / pp["avx2"]


def test_the_instruction_set_speeds_up_mainlines_gemms_only(tmp_path: Path) -> None:
    """(The 2025 builds, before the pinned build's tiled matmul: the next test.) Mainline's CPU backend
    multiplies a dense Q4_K matrix through its repacked GEMM (AVX-512 path:
    the instruction set's gain), a Q6_K one row by row through its AVX2 vec_dot, and routed experts of
    any type through mul_mat_id (one AVX2 GEMV per routed token, never the GEMM): a uniform Q4_K MoE
    gains less than the dense model, a Q6_K one little (its attention alone), nor Q4_K with
    ``--no-repack`` (no CPU_REPACK buffer: vec_dot; Q8_0 keeps tinyBLAS); ik_llama.cpp's kernels keep
    the gain."""
    gain = GAINS[Isa.AVX512_VNNI].value
    old = "llama.cpp-2025"
    assert _pp_gain(tmp_path, "llama", Q.Q4_K, old) == pytest.approx(gain, rel=1e-3)
    # --no-repack: no CPU_REPACK buffer, Q4_K has no tinyBLAS path: vec_dot; Q8_0 keeps tinyBLAS
    assert _pp_gain(tmp_path, "llama", Q.Q4_K, old, args=("--no-repack",)) < 1.2
    assert _pp_gain(tmp_path, "llama", Q.Q8_0, old, args=("--no-repack",)) == pytest.approx(gain, rel=1e-3)
    assert _pp_gain(tmp_path, "llama", Q.Q6_K, old) < 1.2  # the attention's share (it keeps the gain)
    moe = _pp_gain(tmp_path, "qwen3moe", Q.Q4_K, old)
    assert 1.05 < moe < 0.9 * gain
    assert _pp_gain(tmp_path, "qwen3moe", Q.Q4_K, "ik_llama.cpp") == pytest.approx(gain, rel=1e-3)


def test_the_pinned_builds_tiled_kernel_takes_the_vnni_gain(tmp_path: Path) -> None:
    """The pinned build multiplies Q6_K, and Q4_K with --no-repack, through its tiled kernel (ggml-cpu/
    tiled/, llama.cpp PR 27851): with VNNI 3.61 x the AVX2 figure, on AVX2 1.12 x (efficiency.TILED_GAINS),
    so an AVX-512 VNNI CPU gains their ratio (the reads all but free; the attention keeps the ISA's
    gain); the repacked Q4_K GEMM and tinyBLAS's Q8_0 as in the 2025 builds; a Q6_K MoE's routed experts
    (a 512-token prompt: 32 rows an expert of 128, 8 used) go through it too."""
    gain, tiled = GAINS[Isa.AVX512_VNNI].value, TILED_GAINS[Isa.AVX512_VNNI] / TILED_GAINS[Isa.AVX2]
    assert _pp_gain(tmp_path, "llama", Q.Q4_K) == pytest.approx(gain, rel=1e-3)
    assert _pp_gain(tmp_path, "llama", Q.Q8_0, args=("--no-repack",)) == pytest.approx(gain, rel=1e-3)
    assert gain < _pp_gain(tmp_path, "llama", Q.Q4_K, args=("--no-repack",)) <= tiled
    assert gain < _pp_gain(tmp_path, "llama", Q.Q6_K) <= tiled
    assert gain < _pp_gain(tmp_path, "qwen3moe", Q.Q6_K) <= tiled


def test_the_gemm_types_are_ggml_names() -> None:
    """:data:`CPU_GEMM_TYPES` spells the types as the GGUF reader names them (``q4_K``, not ``q4_k``)."""
    assert {type_by_name(n).name for n in CPU_GEMM_TYPES} == CPU_GEMM_TYPES
