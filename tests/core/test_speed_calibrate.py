"""Calibration from one measured run: the re-estimate with the calibrated efficiencies reproduces
the measured rates where one part dominates, and leaves what it cannot isolate alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import build_device_set, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.speed.calibrate import calibrate
from offload_planner.core.speed.efficiency import DEFAULT, calibrated
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import Source, hardware_for

QWEN = Path(__file__).resolve().parents[2] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf"


def _plan(args: list[str], decls: list[str], rpc: list[str] | None = None):  # type: ignore[no-untyped-def]
    devices = build_device_set(cpu=parse_device_decl("CPU=128GiB,bw=80GB/s"), detected=[],
                               rpc_endpoints=rpc or [], declared=[parse_device_decl(d) for d in decls])
    return plan_from_args(open_model(QWEN), devices, parse_server_args(args), "llama.cpp")


@pytest.mark.parametrize("factor", [0.4, 0.8, 1.5])
def test_cpu_only_calibration_reproduces_the_measurement(factor: float) -> None:
    again = _round_trip(["-ngl", "0", "-c", "4096"], {"threads": 16}, factor,
                        {"cpu_bandwidth", "cpu_compute"})
    assert again.calibrated
    assert any(a.figure.source is Source.CALIBRATED for a in again.assumptions)


def test_gpu_bottleneck_calibrates_gpu_bandwidth() -> None:
    plan = _plan(["-ngl", "999", "-c", "4096"], ["CUDA0=24GiB,bw=100GB/s"])
    hw = hardware_for(plan.devices, threads=16)
    est = estimate(plan, hw, prompt=512, eff=DEFAULT)
    cal = calibrate(est, hw, DEFAULT, tg_tps=est.tg_tps * 0.7, pp_tps=None)
    assert list(cal.values) == ["gpu_bandwidth"]
    assert cal.values["gpu_bandwidth"] < DEFAULT.gpu_bandwidth.value


def test_rpc_bottleneck_is_not_calibrated() -> None:
    plan = _plan(["-ngl", "999", "-c", "4096"], ["RPC0=64GiB,bw=5GB/s"], rpc=["127.0.0.1:50052"])
    hw = hardware_for(plan.devices, threads=16)
    est = estimate(plan, hw, prompt=512, eff=DEFAULT)
    cal = calibrate(est, hw, DEFAULT, tg_tps=est.tg_tps * 0.5, pp_tps=None)
    assert cal.values == {}
    assert any("RPC" in n for n in cal.notes)


def test_a_measurement_faster_than_the_other_parts_allow_is_refused() -> None:
    plan = _plan(["-ngl", "0", "-c", "4096"], [])
    hw = hardware_for(plan.devices, threads=16)
    est = estimate(plan, hw, prompt=512, eff=DEFAULT)
    cal = calibrate(est, hw, DEFAULT, tg_tps=est.tg_tps * 1000, pp_tps=None)
    assert cal.values == {}
    assert cal.notes


@pytest.mark.parametrize("factor", [0.4, 0.8, 1.5])
def test_calibration_with_tb_reproduces_the_measurement(factor: float) -> None:
    """``-t 1 -tb 16``: a token's reads are bound by one thread's bandwidth, a prompt's micro-batches
    (``-tb``'s 16 threads) by the RAM's: tg calibrates the per-thread figure, which the prompt's reads
    do not use, and the re-estimate reproduces both measured rates."""
    _round_trip(["-ngl", "0", "-c", "4096", "-t", "1", "-tb", "16"], {"threads": 1, "threads_batch": 16},
                factor, {"cpu_thread_bandwidth", "cpu_compute"})


def _round_trip(args: list[str], threads: dict[str, int], factor: float, figures: set[str]):  # type: ignore[no-untyped-def]
    """Calibrate the CPU-only plan of ``args`` on ``factor`` x its own estimate (both rates): the
    ``figures`` it calibrates, and the re-estimate, which reproduces both measured rates."""
    plan = _plan(args, [])
    hw = hardware_for(plan.devices, **threads)  # type: ignore[arg-type]
    est = estimate(plan, hw, prompt=512, eff=DEFAULT)
    tg, pp = est.tg_tps * factor, est.pp_tps * factor
    cal = calibrate(est, hw, DEFAULT, tg_tps=tg, pp_tps=pp)
    assert set(cal.values) == figures, cal.notes
    again = estimate(plan, hw, prompt=512, eff=calibrated(cal.values, "test"))
    assert again.tg_tps == pytest.approx(tg, rel=2e-3)
    assert again.pp_tps == pytest.approx(pp, rel=2e-2)  # pp: compute + reads per CPU micro-batch
    return again


def test_the_notes_name_each_efficiency_as_plan_assumptions_do() -> None:
    """`launch --bench` printed "calibration: tg (bottleneck CPU): cpu_thread_bandwidth 10 -> 6.75 GB/s
    per thread" (the field's name); each note names it in words, as plan's assumptions do ("CPU compute
    efficiency"), and the values keep the field names (the stored keys, the JSON)."""
    plan = _plan(["-ngl", "0", "-c", "4096", "-t", "1", "-tb", "16"], [])
    hw = hardware_for(plan.devices, threads=1, threads_batch=16)
    est = estimate(plan, hw, prompt=512, eff=DEFAULT)
    cal = calibrate(est, hw, DEFAULT, tg_tps=est.tg_tps * 0.5, pp_tps=est.pp_tps * 0.5)
    assert set(cal.values) == {"cpu_thread_bandwidth", "cpu_compute"}
    assert cal.notes == [
        "tg (bottleneck CPU): CPU bandwidth a thread (the -t limit) 10 -> "
        f"{cal.values['cpu_thread_bandwidth']:.3g} GB/s per thread",
        f"pp (bottleneck CPU): CPU compute efficiency 0.5 -> {cal.values['cpu_compute']:.3g} x peak",
    ], cal.notes
    gpu = _plan(["-ngl", "999", "-c", "4096"], ["CUDA0=24GiB,bw=100GB/s"])
    hw = hardware_for(gpu.devices, threads=16)
    est = estimate(gpu, hw, prompt=512, eff=DEFAULT)
    far = calibrate(est, hw, DEFAULT, tg_tps=est.tg_tps / 100, pp_tps=None)
    assert len(far.notes) == 1, far.notes
    assert far.notes[0].startswith("tg (bottleneck CUDA0): GPU bandwidth efficiency would go from 0.75 to ")
    assert far.notes[0].endswith(" x peak, more than 25x; not stored"), far.notes
