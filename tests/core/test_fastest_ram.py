"""The fastest plan respects the host's RAM like any device: the CPU's capacity (declared, else this
machine's) minus its margin bounds what stays there (mmap'd weights by the bytes read, pinned host
buffers, host compute).  Where nothing fits, one sentence names the device and by how much.
Qwen3-30B-A3B (17 GiB, header-only) with one 12 GiB GPU: about 8 GiB of experts stay on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.plan import Plan
from offload_planner.core.speed.candidate import DEFAULT_MARGIN
from offload_planner.core.speed.fastest import fastest_plan
from offload_planner.core.speed.hardware import hardware_for
from offload_planner.core.units import GiB

RES = Path(__file__).resolve().parents[2] / "resources"
QWEN = RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf"
GPU = "CUDA0=12GiB,bw=936GB/s"


@pytest.fixture(scope="module")
def qwen() -> Model:
    return open_model(str(QWEN))


def _devices(cpu: str) -> DeviceSet:
    return DeviceSet(parse_device_decl(f"CPU={cpu}"), (parse_device_decl(GPU),))


def _used(plan: Plan, device: str) -> int:
    return plan.projection().device(device).resident()  # fresh, not the search's own


def test_ram_decides_between_plans_the_gpu_holds(qwen: Model) -> None:
    """With 8.6 GiB of RAM the balanced answer at -ub 4096 (8.8 GiB left on the CPU: larger pinned
    host compute buffers) is over; a smaller -ub that fits is chosen, and --cpu-moe (16.5 GiB on the
    CPU) is a baseline that does not fit."""
    ds = _devices("8.6GiB")
    r = fastest_plan(qwen, ds, ["-c", "16384"], hardware_for(ds, threads=16), goal="balanced")
    assert r.best is not None and r.best.verified
    assert _used(r.best.plan, "CPU") <= 8.6 * GiB
    assert _used(r.best.plan, "CUDA0") + DEFAULT_MARGIN <= 12 * GiB
    assert r.best.plan.context.n_ubatch < 4096
    roomy = _devices("256GiB")
    free = fastest_plan(qwen, roomy, ["-c", "16384"], hardware_for(roomy, threads=16), goal="balanced")
    assert free.best is not None and free.best.plan.context.n_ubatch == 4096  # RAM alone decided
    assert _used(free.best.plan, "CPU") > 8.6 * GiB
    cpu_moe = next(c for c in r.candidates if c.label == "--cpu-moe")
    assert not cpu_moe.fits and cpu_moe.host_over > 7 * GiB and not cpu_moe.over


def test_nothing_fits_names_the_host_and_by_how_much(qwen: Model) -> None:
    ds = _devices("6GiB")
    r = fastest_plan(qwen, ds, ["-c", "16384"], hardware_for(ds, threads=16), goal="balanced")
    assert r.best is None
    assert r.why.startswith("CPU (RAM) over by 2.0 GiB (8.0 GiB projected > 6.0 GiB) in the closest plan")


def test_the_hosts_margin_counts(qwen: Model) -> None:
    """16 GiB of RAM with a 10 GiB margin hold what 6 GiB hold: nothing here."""
    ds = _devices("16GiB,margin=10GiB")
    r = fastest_plan(qwen, ds, ["-c", "16384"], hardware_for(ds, threads=16), goal="balanced")
    assert r.best is None
    assert r.why.startswith("CPU (RAM) over by 2.0 GiB (8.0 GiB projected + 10.0 GiB margin > 16.0 GiB)")


def test_from_an_open_plan_too(qwen: Model) -> None:
    from offload_planner.core.cmdline import parse_server_args
    from offload_planner.core.plan import plan_from_args
    from offload_planner.core.speed.fastest import fastest_from_plan

    for cpu, fits in (("6GiB", False), ("9.5GiB", True)):
        ds = _devices(cpu)
        plan = plan_from_args(qwen, ds, parse_server_args(["-c", "16384"]))
        r = fastest_from_plan(plan, hardware_for(ds, threads=16), goal="tg")
        assert (r.best is not None) is fits, cpu
        if r.best is not None:
            assert _used(r.best.plan, "CPU") <= 9.5 * GiB
        else:
            assert r.why.startswith("CPU (RAM) over by ")


def test_fit_cli_says_which_device_and_by_how_much(capsys: pytest.CaptureFixture[str]) -> None:
    from offload_planner.cli import main

    argv = ["fit", str(QWEN), "--no-detect", "--device", GPU, "--device", "CPU=6GiB,bw=100GB/s"]
    assert main([*argv, "--", "-c", "16384"]) == 1
    out = capsys.readouterr().out
    assert "nothing fits these devices: CPU (RAM) over by 2.0 GiB (8.0 GiB projected > 6.0 GiB)" in out
    assert "over: CPU" in out  # the candidates' rows name the host too
    assert main([*argv, "--json", "--", "-c", "16384"]) == 1
    j = json.loads(capsys.readouterr().out)
    assert j["best"] is None and j["why"].startswith("CPU (RAM) over by 2.0 GiB")
    assert all("CPU" in c["over"] for c in j["candidates"])
