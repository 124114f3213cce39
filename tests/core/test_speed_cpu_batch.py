"""A pass of a few tokens on ggml's CPU backend (core.speed.cpu_batch): every weight read once, each
token's product through the kernel ggml-cpu multiplies it with.

The kernel choice is the pinned source's (ggml-cpu.c ``ggml_compute_forward_mul_mat``, repack.cpp
``forward_mul_mat_one_chunk``, llamafile/sgemm.cpp ``llamafile_sgemm``, tiled/tiled.cpp
``ggml_tiled_min_batch``).  The all-slots figure is checked against the real llama-server on this
project's machine (``tests/data/speed/cpu_batch_measured.json``, measured with
``bench/speed_slots.py``): the estimate, given the run's own RAM figures and calibrated to its one
request as ``launch --bench`` would, against the measured total of N requests over one request.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.dialects import LLAMA_CPP, LLAMA_CPP_2025
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.speed.calibrate import calibrate
from offload_planner.core.speed.cpu_batch import gemm_columns, narrow_columns
from offload_planner.core.speed.cpu_isa import CpuInfo, Isa
from offload_planner.core.speed.efficiency import DEFAULT, calibrated, for_host
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import Figure, Source, hardware_for
from offload_planner.core.speed.slots import with_slots
from offload_planner.core.synth import write_model
from offload_planner.core.synth.catalog import BENCH_MODELS

DATA = Path(__file__).resolve().parents[1] / "data" / "speed" / "cpu_batch_measured.json"
GiB = 1024**3


def test_columns_through_a_gemm_follow_ggml_cpu() -> None:
    vnni, avx2 = Isa.AVX512_VNNI, Isa.AVX2

    def cols(type_name: str, repacked: bool, isa: Isa | None, bs: list[int]) -> list[tuple[float, float]]:
        return [gemm_columns(type_name, LLAMA_CPP, repacked, isa, b) for b in bs]

    # a repacked Q4_K: one gemv per column below 4 (repack.cpp ``if (nrows > 3) gemm``); the AVX-512 GEMM
    # runs 16 columns at a time at the prompt's rate (the groups of 4 left over: a narrower loop)
    assert cols("q4_K", True, vnni, [1, 3, 4, 8, 15, 16, 20]) == [
        (0, 0), (0, 0), (0, 0), (0, 0), (0, 0), (16, 16), (16, 16)]
    assert cols("q4_K", True, avx2, [3, 4, 7, 8]) == [(0, 0), (4, 4), (4, 4), (8, 8)]
    # ... those left over in groups of 4 go through its narrower loop, the rest through gemv
    narrow = [narrow_columns("q4_K", LLAMA_CPP, True, vnni, b) for b in (3, 4, 7, 8, 16, 21)]
    assert narrow == [0, 4, 4, 8, 0, 4]
    assert narrow_columns("q4_K", LLAMA_CPP, True, avx2, 8) == 0  # AVX2: the 4-column loop is the GEMM
    # Q6_K in a plain buffer: vec_dot per column until the tiled matmul takes 8 rows (in whole 16x16
    # microtiles); not in the 2025 builds, nor where the instruction set is not known
    assert cols("q6_K", False, vnni, [1, 7, 8, 16, 17]) == [(0, 0), (0, 0), (8, 16), (16, 16), (17, 32)]
    assert gemm_columns("q6_K", LLAMA_CPP_2025, False, vnni, 16) == (0, 0)
    assert gemm_columns("q6_K", LLAMA_CPP, False, None, 16) == (0, 0)
    # tinyBLAS from two columns (sgemm.cpp: ``if (n < 2) return false``)
    assert cols("q8_0", False, vnni, [1, 2, 3]) == [(0, 0), (2, 2), (3, 3)]
    # a routed expert: through the tiled matmul only, by the rows routed to it
    assert gemm_columns("q6_K", LLAMA_CPP, False, vnni, 2.0, routed=True, rows=1.1) == (0, 0)
    assert gemm_columns("q6_K", LLAMA_CPP, False, vnni, 12.0, routed=True, rows=9.0) == (12.0, 12.0)
    assert gemm_columns("q4_K", LLAMA_CPP, True, vnni, 12.0, routed=True, rows=9.0) == (0, 0)


def _records() -> list[dict[str, Any]]:
    return list(json.loads(DATA.read_text())["runs"])


@pytest.fixture(scope="module")
def bench_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """bench/speed_slots.py's models, their headers and tensor lists (the estimate reads no weight)."""
    root = tmp_path_factory.mktemp("bench")
    names = {run.get("model", "bench-llama-2g") for run in _records()}
    return {n: write_model(BENCH_MODELS[n], root / f"{n}.gguf", header_only=True)[0] for n in names}


def _estimated_ratios(model: Path, run: dict[str, Any]) -> dict[int, float]:
    cpu = CpuInfo(run["cpu"], Isa(run["isa"]), None, "recorded")
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 23 * GiB, 23 * GiB), ())
    probe = Figure(run["ram_gbs"], "GB/s", Source.MEASURED, "the run's RAM probe")
    one = Figure(run["thread_gbs"], "GB/s", Source.MEASURED, "the run's one-thread copy")
    hw = hardware_for(devices, threads=run["threads"], probe=probe, cpu=cpu, thread_bw={"CPU": one})
    eff = for_host(DEFAULT, cpu.gain, "recorded")
    m = open_model(model)
    out = {}
    for n in (int(k) for k in run["ratio"]):
        plan = plan_from_args(m, devices, parse_server_args([*run["args"].split(), "-np", str(n)]))
        cal = calibrate(estimate(plan, hw, eff=eff), hw, eff, tg_tps=run["one_request_tps"])
        e = calibrated(cal.values, "the run's one request", eff) if cal.values else eff
        est = with_slots(estimate(plan, hw, eff=e), plan, hw, e)
        out[n] = est.slots.tg_tps_total / est.tg_tps if est.slots is not None else 1.0
    return out


@pytest.mark.parametrize("run", _records(), ids=lambda r: str(r["id"]))
def test_all_slots_ratio_follows_the_measured_llama_server(bench_models: dict[str, Path],
                                                           run: dict[str, Any]) -> None:
    est = _estimated_ratios(bench_models[run.get("model", "bench-llama-2g")], run)
    for n, meas in run["ratio"].items():
        off = est[int(n)] / meas["median"]
        assert abs(math.log(off)) <= math.log(run["tolerance"]), (n, est[int(n)], meas)
