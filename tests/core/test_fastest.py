"""The fastest plan that fits: on real header-only models it fits every GPU with its margin (checked
on a fresh projection of the chosen plan), keeps the user's -ot rules, moves and -c, and is never
slower in estimate than the baselines that fit (--cpu-moe, the best --n-cpu-moe, llama.cpp's --fit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.speed.fastest import DEFAULT_MARGIN, fastest_plan, score
from offload_planner.core.speed.hardware import hardware_for
from offload_planner.core.units import GiB

RES = Path(__file__).resolve().parents[2] / "resources"


@pytest.fixture(scope="module")
def qwen() -> Model:
    return open_model(str(RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf"))


def _devices(*gpus: str) -> DeviceSet:
    return DeviceSet(parse_device_decl("CPU=256GiB,ram=4xDDR5-5600"),
                     tuple(parse_device_decl(f"CUDA{i}={g}") for i, g in enumerate(gpus)))


def _assert_fits(plan, devices: DeviceSet) -> None:  # type: ignore[no-untyped-def]
    proj = plan.projection()  # fresh, not the search's own
    for g in devices.gpus:
        margin = g.margin or DEFAULT_MARGIN
        assert proj.device(g.name).resident() + margin <= (g.capacity or 0), g.name


@pytest.mark.parametrize("goal", ["tg", "pp", "balanced"])
def test_fastest_fits_and_beats_every_fitting_baseline(qwen: Model, goal: str) -> None:
    ds = _devices("12GiB,bw=936GB/s,pcie=4x16,tflops=142")
    r = fastest_plan(qwen, ds, ["-c", "16384"], hardware_for(ds, threads=16), goal=goal, prompt=4096)
    assert r.best is not None
    _assert_fits(r.best.plan, ds)
    for c in r.candidates:
        if c.fits:
            assert score(r.best.estimate, goal) >= score(c.estimate, goal), c.label
    cpu_moe = next(c for c in r.candidates if c.label == "--cpu-moe")
    assert r.best.estimate.tg_tps > cpu_moe.estimate.tg_tps  # 12 GiB holds many expert layers
    assert r.best.plan.context.n_ctx == 16384
    if goal == "tg":
        assert r.best.plan.context.n_ubatch == 512  # no reason to grow the compute buffer


def test_user_rules_and_moves_are_kept(qwen: Model) -> None:
    ds = _devices("rtx4090")
    pinned = [t.name for t in qwen.tensors if t.layer == 5 and t.role.is_routed_expert]
    moved = [t.name for t in qwen.tensors if t.layer == 7 and t.role.is_routed_expert]
    r = fastest_plan(qwen, ds, ["-c", "8192", "-ot", r"blk\.5\.ffn_.*_exps=CPU"], hardware_for(ds),
                     goal="tg", moves=dict.fromkeys(moved, "CPU"))
    assert r.best is not None and r.best.label.startswith("fastest")
    devs = r.best.plan.placement().tensor_devices()
    assert {devs[n] for n in pinned} == {"CPU"}
    assert {devs[n] for n in moved} == {"CPU"}
    others = [t.name for t in qwen.tensors if t.layer == 6 and t.role.is_routed_expert]
    assert {devs[n] for n in others} == {"CUDA0"}  # a 24 GiB card takes the rest of this 17 GiB model


def test_margin_is_respected(qwen: Model) -> None:
    ds = DeviceSet(parse_device_decl("CPU=256GiB"), (parse_device_decl("CUDA0=16GiB,margin=5GiB"),))
    r = fastest_plan(qwen, ds, ["-c", "8192"], hardware_for(ds), goal="tg")
    assert r.best is not None
    assert r.best.plan.projection().device("CUDA0").resident() <= 11 * GiB


def test_spreads_over_two_gpus_and_each_fits() -> None:
    m = open_model(str(RES / "DeepSeek-V3-Q4_K_M.header.gguf"))
    ds = _devices("rtx3090", "rtx3090")
    r = fastest_plan(m, ds, ["-c", "8192"], hardware_for(ds, threads=32), goal="tg")
    assert r.best is not None
    _assert_fits(r.best.plan, ds)
    devs = r.best.plan.placement().tensor_devices()
    on = {d for n, d in devs.items() if "_exps" in n}
    assert {"CUDA0", "CUDA1", "CPU"} <= on


def test_nothing_fits_is_said(qwen: Model) -> None:
    ds = DeviceSet(parse_device_decl("CPU=256GiB"), (parse_device_decl("CUDA0=1GiB"),))
    r = fastest_plan(qwen, ds, ["-c", "8192"], hardware_for(ds), goal="tg")
    assert r.best is None
    assert r.notes and "does not fit" in r.notes[0]


def test_unknown_goal_is_refused(qwen: Model) -> None:
    ds = _devices("rtx3090")
    with pytest.raises(ValueError, match="--goal"):
        fastest_plan(qwen, ds, [], hardware_for(ds), goal="fast")


def test_from_an_open_plan_keeps_its_moves_and_fits(qwen: Model) -> None:
    from offload_planner.core.cmdline import parse_server_args
    from offload_planner.core.plan import plan_from_args
    from offload_planner.core.speed.estimate import estimate
    from offload_planner.core.speed.fastest import fastest_from_plan

    ds = _devices("12GiB,bw=936GB/s")
    hw = hardware_for(ds)
    base = plan_from_args(qwen, ds, parse_server_args(["-c", "8192", "-ot", r"blk\.1\.ffn_.*_exps=CPU",
                                                       "--cpu-moe"]))
    pinned = [t.name for t in qwen.tensors if t.layer == 1 and t.role.is_routed_expert]
    kept = {t.name: "CPU" for t in qwen.tensors if t.layer == 3 and t.role.is_routed_expert}
    plan = base.with_moves(kept)
    r = fastest_from_plan(plan, hw, goal="balanced")
    assert r.best is not None
    _assert_fits(r.best.plan, ds)
    devs = r.best.plan.placement().tensor_devices()
    assert {devs[n] for n in kept} == {"CPU"}
    assert {devs[n] for n in pinned} == {"CPU"}
    assert r.best.estimate.tg_tps > 1.5 * estimate(plan, hw).tg_tps
