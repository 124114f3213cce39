"""What the window projects for a plan with moves is what llama-server would allocate for the
command the window exports: the exported argv, parsed and run through the engine, gives the same
bytes per device and buffer kind (two GPUs, so pipeline parallelism is in play)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from offload_planner.core import presets
from offload_planner.core.analysis import analyse, analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.placement import CPU
from offload_planner.core.plan import plan_from_args
from offload_planner.core.units import GiB

KINDS = ("model", "kv", "compute", "output")


@pytest.mark.parametrize("what", ["all experts to CPU", "layers 10-20 experts to CPU", "layer 5 to CUDA1"])
def test_projection_with_moves_equals_the_exported_command(demo_path: Path, what: str) -> None:
    model = open_model(demo_path)
    devices = DeviceSet(
        Device("CPU", DeviceKind.CPU, 512 * GiB, 512 * GiB),
        (parse_device_decl("CUDA0=24GiB"), parse_device_decl("CUDA1=24GiB")),
    )
    plan = plan_from_args(model, devices, argparse.Namespace(ctx_size=16384))
    placement = plan.placement()
    if what == "all experts to CPU":
        moves = presets.routed_experts_to(plan, placement, CPU)
    elif what.startswith("layers 10-20"):
        moves = presets.layers_to(plan, placement, 10, 20, CPU, experts_only=True)
    else:
        moves = presets.layers_to(plan, placement, 5, 5, "CUDA1")
    moved = plan.with_moves(dict(moves))
    shown = analyse(moved)
    assert shown.projection is not None and not shown.error
    parsed = parse_server_args(shown.command)
    assert not parsed.errors, parsed.errors
    actual = analyse_command(model, devices, parsed.args).projection
    for dm in shown.projection.devices:
        ref = actual.device(dm.device.name)
        for kind in KINDS:
            assert dm.total(kind) == ref.total(kind), (dm.device.name, kind)
