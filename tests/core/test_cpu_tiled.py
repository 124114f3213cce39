"""The pinned build's tiled CPU matmul (ggml-cpu/tiled/, llama.cpp PR 27851) in the prompt estimate:
which weights it takes (K-quants and i-quants outside a repack buffer, batches of 8 rows or more, an
x86 CPU whose instruction set is known), at what rate per instruction set (efficiency.TILED_GAINS),
and that the 2025 builds' dialect and ik_llama.cpp's keep their kernels."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as Q
from tests.support.quant_mixes import uniform_mix

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.dialects import IK, LLAMA_CPP, LLAMA_CPP_2025, Dialect
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.speed.cpu_isa import GAINS, CpuInfo, Isa
from offload_planner.core.speed.efficiency import TILED_GAINS, TILED_MIN_ROWS, cpu_pp_cost
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import hardware_for
from offload_planner.core.speed.result import SpeedEstimate
from offload_planner.core.synth import BIG_MODELS, write_model

VNNI = GAINS[Isa.AVX512_VNNI].value
ZEN4 = CpuInfo("AMD EPYC 9654 96-Core Processor", Isa.AVX512_VNNI, None, "/proc/cpuinfo")
HASWELL = CpuInfo("Intel(R) Xeon(R) CPU E5-2680 v3", Isa.AVX2, None, "/proc/cpuinfo")


def test_tiled_cost_follows_the_source() -> None:
    """tiled.cpp: Q6_K and the i-quants in a plain CPU buffer, 8 rows or more, x86 with AVX2 or
    AVX512-VNNI; a repacked Q4_K keeps its GEMM; the 2025 builds and ik keep their kernels."""
    assert TILED_GAINS[Isa.AVX512_VNNI] == pytest.approx(1.85 * VNNI, abs=0.01)  # 265 / 143 GFLOPS here
    assert TILED_GAINS[Isa.AVX2] == TILED_GAINS[Isa.AVX512] == 1.12  # PR 27851's AVX2 q4_K: 1.427 / 1.273
    for routed in (False, True):
        pinned = cpu_pp_cost("q6_K", LLAMA_CPP, VNNI, routed, False, Isa.AVX512_VNNI)
        assert pinned == pytest.approx(VNNI / TILED_GAINS[Isa.AVX512_VNNI])  # 0.54 of the GEMM's cost
        # vec_dot row by row (and mul_mat_id's per-row vec_dot): the AVX2 figure
        assert cpu_pp_cost("q6_K", LLAMA_CPP_2025, VNNI, routed, False, Isa.AVX512_VNNI) == VNNI
    assert cpu_pp_cost("q6_K", LLAMA_CPP, 1.0, False, False, Isa.AVX2) == pytest.approx(1 / 1.12)
    # fewer rows than the kernel takes, a CPU not known to be x86, a repacked weight: the old kernels
    few = TILED_MIN_ROWS - 1
    assert cpu_pp_cost("q6_K", LLAMA_CPP, VNNI, False, False, Isa.AVX512_VNNI, rows=few) == VNNI
    assert cpu_pp_cost("q6_K", LLAMA_CPP, 1.0, False, False, None) == 1.0
    assert cpu_pp_cost("q4_K", LLAMA_CPP, VNNI, False, True, Isa.AVX512_VNNI) == 1.0
    assert cpu_pp_cost("q4_K", LLAMA_CPP, VNNI, False, False, Isa.AVX512_VNNI) < 1.0  # -nr: tiled
    assert cpu_pp_cost("q8_0", LLAMA_CPP, VNNI, False, False, Isa.AVX512_VNNI) == 1.0  # tinyBLAS
    # the lattice i-quants leave their slow vec_dot
    assert cpu_pp_cost("iq3_s", LLAMA_CPP, VNNI, False, False, Isa.AVX512_VNNI) < 1.0
    assert cpu_pp_cost("iq3_s", LLAMA_CPP_2025, VNNI, False, False, Isa.AVX512_VNNI) > VNNI
    assert cpu_pp_cost("q6_K", IK, VNNI, False, False, Isa.AVX512_VNNI) == 1.0
    # the development set's older mainline records: the pinned rules, the earlier kernels
    before = LLAMA_CPP.before_tiled_cpu()
    assert before == "llama.cpp" and not before.cpu_tiled_matmul and LLAMA_CPP.cpu_tiled_matmul
    assert cpu_pp_cost("q6_K", before, VNNI, False, False, Isa.AVX512_VNNI) == VNNI
    assert Dialect("llama.cpp") is LLAMA_CPP  # the variant is not registered



@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Model]:
    out = {}
    root = tmp_path_factory.mktemp("tiled")
    dense = BIG_MODELS["Llama-3.1-70B-Q4_K_M"]  # 8 of its layers: a dense model's matrices
    moe = BIG_MODELS["Qwen3-30B-A3B-Q4_K_M"]
    for t in (Q.Q6_K, Q.Q4_K):
        spec = dense.__class__(**{**dense.__dict__, "name": f"llama-{t.name}", "n_layer": 8,
                                  "quant": uniform_mix(t, 18)})
        [path] = write_model(spec, root / f"dense-{t.name}.gguf", header_only=True)
        out[f"dense-{t.name}"] = open_model(str(path))
    spec = moe.__class__(**{**moe.__dict__, "name": "qwen-Q6_K", "quant": uniform_mix(Q.Q6_K, 18)})
    [path] = write_model(spec, root / "moe-Q6_K.gguf", header_only=True)
    out["moe-Q6_K"] = open_model(str(path))
    return out


def _cpu_only(model: Model, cpu: CpuInfo | None, dialect: Dialect, *extra: str) -> SpeedEstimate:
    ds = DeviceSet(parse_device_decl("CPU=512GiB,bw=60GB/s,cores=16"), ())
    plan = plan_from_args(model, ds, parse_server_args(["-c", "4096", "-t", "16", *extra], dialect=dialect),
                          dialect)
    return estimate(plan, hardware_for(ds, threads=16, cpu=cpu), prompt=512)


def _ratio(model: Model, cpu: CpuInfo | None, *extra: str) -> tuple[float, float]:
    """(pp, tg) of the pinned dialect over the 2025 builds' on the same plan and CPU."""
    new, old = _cpu_only(model, cpu, LLAMA_CPP, *extra), _cpu_only(model, cpu, LLAMA_CPP_2025, *extra)
    return new.pp_tps / old.pp_tps, new.tg_tps / old.tg_tps


def test_pinned_prompt_is_faster_where_the_tiled_kernel_runs(models: dict[str, Model]) -> None:
    """A dense Q6_K model's prompt on an AVX-512 VNNI CPU: 2025's vec_dot at the AVX2 figure, the
    pinned build's tiled kernel at 3.6 x it (the reads of each micro-batch and the attention are the
    same, so less than that); on AVX2 at most 1.12 x; a generated token (one row) the same."""
    pp, tg = _ratio(models["dense-Q6_K"], ZEN4)
    assert 2.5 < pp < TILED_GAINS[Isa.AVX512_VNNI] and tg == pytest.approx(1.0)
    pp, tg = _ratio(models["dense-Q6_K"], HASWELL)
    assert 1.05 < pp < 1.12 and tg == pytest.approx(1.0)
    # the instruction set not known (or not x86): the kernel is x86-only, the old kernels
    assert _ratio(models["dense-Q6_K"], None) == (pytest.approx(1.0), pytest.approx(1.0))


def test_repacked_q4_k_keeps_its_gemm(models: dict[str, Model]) -> None:
    """Q4_K in CPU_REPACK (the default on x86) keeps the repacked GEMM in both; with -nr its matrices are
    in a plain CPU buffer: vec_dot in 2025's builds, the tiled kernel in the pinned one."""
    pp, _ = _ratio(models["dense-Q4_K"], ZEN4)
    assert pp == pytest.approx(1.0)
    pp, _ = _ratio(models["dense-Q4_K"], ZEN4, "-nr")
    assert pp > 2.5


def test_routed_experts_take_it_when_enough_rows_reach_them(models: dict[str, Model]) -> None:
    """mul_mat_id decides per expert: at -ub 512 an expert of 128 (8 used) gets 32 rows on average, the
    tiled kernel's; at -ub 32, 2 rows: the experts keep their per-row vec_dot and only the always-active
    matrices (32 rows) gain."""
    pp_512, tg = _ratio(models["moe-Q6_K"], ZEN4, "-ub", "512")
    pp_32, _ = _ratio(models["moe-Q6_K"], ZEN4, "-ub", "32", "-b", "32")
    assert pp_512 > 2.0 and tg == pytest.approx(1.0)
    assert 1.0 < pp_32 < 0.75 * pp_512
