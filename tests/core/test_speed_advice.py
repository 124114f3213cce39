"""core.speed.advice.experts_text: which GPU holds which layers' routed experts, in words, on a real
plan of the bundled Qwen3-30B header (48 layers, three expert tensors a layer)."""

from __future__ import annotations

import argparse
from pathlib import Path

from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.placement import CPU
from offload_planner.core.plan import plan_from_args
from offload_planner.core.speed.advice import experts_text, layer_spans

QWEN = Path(__file__).resolve().parents[2] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf"


def test_whole_layers_and_single_tensors_by_gpu() -> None:
    model = open_model(QWEN)
    gpus = (parse_device_decl("CUDA0=24GiB"), parse_device_decl("CUDA1=24GiB"))
    devices = DeviceSet(parse_device_decl("CPU=64GiB"), gpus)
    plan = plan_from_args(model, devices, argparse.Namespace(ctx_size=4096))
    experts = [t for t in model.tensors if t.role.is_routed_expert]
    moves = {t.name: CPU for t in experts}
    moves |= {t.name: "CUDA0" for t in experts if t.layer in (0, 1, 2, 5)}
    moves |= {t.name: "CUDA1" for t in experts if t.layer == 46 and "down" not in t.name}
    moves |= {t.name: "CUDA1" for t in experts if t.layer == 47 and "down" in t.name}
    plan = plan.with_moves(moves)
    assert experts_text(plan, plan.placement()) == (
        "routed experts by device: CUDA0 4 layers (0-2, 5), CUDA1 3 tensors of 2 layers (46-47), CPU the "
        "other 42 layers")
    one = plan.with_moves({t.name: CPU for t in experts if t.layer != 5} | {
        t.name: "CUDA1" for t in experts if t.layer == 9})
    assert experts_text(one, one.placement()) == (
        "routed experts by device: CUDA0 layer 5, CUDA1 layer 9, CPU the other 46 layers")
    none = plan.with_moves(dict.fromkeys((t.name for t in experts), CPU))
    assert experts_text(none, none.placement()) == ""  # nothing on a GPU: nothing to say
    assert layer_spans([5, 0, 1, 2, 9, 10]) == "0-2, 5, 9-10"
