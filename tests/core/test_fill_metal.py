"""The Fill preset on a GPU that maps the model file (Metal with mmap: one ``MTL0_Mapped`` buffer per file,
the span from the first to the last of MTL0's tensors, ggml-metal.cpp:750 ``last - first``; session 10's
metal2/metal3).  Fill chose expert layers by their sizes against the room besides MTL0's experts, which
the span does not follow: an expert inside the span of MTL0's other tensors costs nothing there and frees
nothing when moved off, and one below the span's start costs every byte between.  On Qwen3-30B it sent
every expert of a plan over by its attention span to the CPU and left the plan over (slower, no smaller),
moved 39 layers' experts off a fitting ``-ngl 40`` plan for nothing (fill from the first layer: layer 0
widens the span to the whole file), and took 5 of the 48 layers the span of ``--cpu-moe`` holds anyway.

Fill now weighs each layer by what it adds to the span and never leaves a plan the projection calls over
on MTL0 (the device's row, the capacity rule, and a Mac's one memory, ``unified_over``): where the span
of MTL0's other tensors alone is over, it moves nothing."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.device_figures import DeviceFigures, over_capacity
from offload_planner.core.devices import Device, DeviceKind, build_device_set, parse_device_decl
from offload_planner.core.dialects import Dialect
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.mapped_span import unified_over
from offload_planner.core.model import Model
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.presets import fill_with_experts
from offload_planner.core.units import GiB

QWEN = Path(__file__).resolve().parents[2] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf"
MAINLINE = Dialect("llama.cpp")


@pytest.fixture(scope="module")
def qwen() -> Model:
    return open_model(QWEN)


def _plan(model: Model, gib: int, args: str) -> Plan:
    cpu = Device("CPU", DeviceKind.CPU, 32 * GiB, 32 * GiB)
    mtl0 = parse_device_decl(f"MTL0=m2max,{gib}GiB")
    ds = build_device_set(cpu=cpu, detected=[], rpc_endpoints=[], declared=[mtl0])
    return plan_from_args(model, ds, parse_server_args(["-c", "8192", *args.split()], dialect=MAINLINE),
                          MAINLINE)


def _expert_layers_on(plan: Plan, device: str) -> set[int]:
    return {p.tensor.layer for p in plan.placement().items
            if p.tensor.role.is_routed_expert and p.device == device and p.tensor.layer is not None}


@pytest.mark.parametrize(("gib", "args", "from_first"), list(itertools.product(
    (12, 16, 20), ("-ngl 999", "-ngl 999 --cpu-moe", "-ngl 25", "-ngl 40"), (True, False))))
def test_fill_never_leaves_mtl0_over(qwen: Model, gib: int, args: str, from_first: bool) -> None:
    plan = _plan(qwen, gib, args)
    before = plan.projection()
    moves = fill_with_experts(plan, plan.placement(), before, "MTL0", from_first=from_first)
    after = plan.with_moves(moves).projection()
    if over_capacity(before):  # the span of MTL0's attention alone is over: nothing to gain by moves
        assert moves == {}
    assert not moves or not over_capacity(after)
    assert unified_over(after) <= unified_over(before)
    # what the span holds anyway stays: Fill never moves an expert off MTL0 for nothing
    if not over_capacity(before):
        assert _expert_layers_on(plan, "MTL0") <= _expert_layers_on(plan.with_moves(moves), "MTL0")


def test_fill_takes_the_experts_inside_the_span_for_free(qwen: Model) -> None:
    plan = _plan(qwen, 20, "-ngl 999 --cpu-moe")
    before = plan.projection()
    moves = fill_with_experts(plan, plan.placement(), before, "MTL0")
    after = plan.with_moves(moves)
    assert _expert_layers_on(after, "MTL0") == set(range(48))
    mtl0 = DeviceFigures.of(after.projection().device("MTL0"))
    assert mtl0.over == 0 and mtl0.used <= DeviceFigures.of(before.device("MTL0")).used


def test_fill_from_the_last_layer_widens_the_span_downwards(qwen: Model) -> None:
    """-ngl 25 (blk.24 to the output on MTL0) on 16 GiB: the layers below the span's start are taken from
    the top while what they add to the span fits; the plan is within MTL0's capacity."""
    plan = _plan(qwen, 16, "-ngl 25")
    before = plan.projection()
    moves = fill_with_experts(plan, plan.placement(), before, "MTL0", from_first=False)
    got = _expert_layers_on(plan.with_moves(moves), "MTL0")
    assert got == set(range(min(got), 48)) and min(got) < 24
    assert not over_capacity(plan.with_moves(moves).projection())
