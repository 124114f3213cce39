"""The tensor map's grid and the preset moves, on plain core objects (no Qt)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from offload_planner.core import presets
from offload_planner.core.devices import Device, DeviceKind, DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import alloc_size, pad
from offload_planner.core.placement import CPU
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.roles import Role
from offload_planner.core.tensor_grid import build_grid, layout
from offload_planner.core.units import GiB


def _demo_plan(demo_path: Path, gpu: str = "CUDA0=24GiB") -> Plan:
    model = open_model(demo_path)
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 512 * GiB, 512 * GiB), (parse_device_decl(gpu),))
    return plan_from_args(model, devices, argparse.Namespace(ctx_size=8192))


def test_layout_of_deepseek(demo_path: Path) -> None:
    plan = _demo_plan(demo_path)
    rows, cols = layout(plan.model)
    assert len(rows) == 61 + 2 and rows[0].key == "embd" and rows[-1].key == "output"
    assert [c.key for c in cols] == [
        "embd",
        "attn",
        "router",
        "ffn",
        "shexp",
        "exps_up",
        "exps_gate",
        "exps_down",
        "norms",
    ]
    grid = build_grid(plan.model, plan.placement(), plan.base_placement())
    assert sum(len(c.items) for c in grid.cells.values()) == len(plan.placement().items)
    dense = grid.cell(grid.row_of_layer(0) or 0, grid.column_index("ffn") or 0)
    assert dense.items and all(i.placed.tensor.role is Role.FFN_DENSE for i in dense.items)
    assert not grid.cell(grid.row_of_layer(0) or 0, grid.column_index("exps_up") or 0).items
    assert max(grid.column_max) > 0


def test_moved_and_not_movable_marks(demo_path: Path) -> None:
    plan = _demo_plan(demo_path)
    moved = plan.with_moves({"blk.5.ffn_up_exps.weight": CPU})
    grid = build_grid(
        moved.model,
        moved.placement(),
        moved.base_placement(),
        [(t.name, (t.name != "blk.5.attn_q_a.weight", "test reason")) for t in moved.model.tensors],
    )
    r = grid.row_of_layer(5)
    assert r is not None
    up = grid.cell(r, grid.column_index("exps_up") or 0)
    assert up.moved and up.device_bytes == ((CPU, up.nbytes),)
    attn = grid.cell(r, grid.column_index("attn") or 0)
    assert attn.movable and not attn.moved  # one of its tensors is movable
    assert attn.not_movable_reason == "test reason"
    assert "blk.5.attn_q_a.weight" not in attn.movable_names


def test_all_routed_experts_to_cpu(demo_path: Path) -> None:
    plan = _demo_plan(demo_path)
    moves = presets.routed_experts_to(plan, plan.placement(), CPU)
    assert len(moves) == 58 * 3 and set(moves.values()) == {CPU}
    after = plan.with_moves(moves)
    assert presets.routed_experts_to(after, after.placement(), CPU) == {}


def test_fill_gpu_with_expert_layers_from_either_end(demo_path: Path) -> None:
    plan = _demo_plan(demo_path, "CUDA0=96GiB")
    on_cpu = plan.with_moves(presets.routed_experts_to(plan, plan.placement(), CPU))
    proj = on_cpu.projection()
    dev = on_cpu.devices.gpus[0]
    for from_first in (True, False):
        moves = presets.fill_with_experts(on_cpu, on_cpu.placement(), proj, "CUDA0", from_first=from_first)
        layers = sorted({on_cpu.model.tensor(n).layer for n in moves})
        assert layers, "some expert layers fit"
        assert all(isinstance(x, int) for x in layers)
        ints = [x for x in layers if x is not None]
        assert ints == list(range(ints[0], ints[-1] + 1)), "one contiguous run of layers"
        assert (ints[0] == 3) if from_first else (ints[-1] == 60)
        added = sum(pad(alloc_size(on_cpu.model.tensor(n), dev), dev.alignment) for n in moves)
        assert proj.device("CUDA0").total() + added <= (dev.capacity or 0) - dev.margin
        # the next layer in order would not fit
        nxt = ints[-1] + 1 if from_first else ints[0] - 1
        cost = sum(
            pad(alloc_size(t, dev), dev.alignment)
            for t in on_cpu.model.tensors
            if t.layer == nxt and t.role.is_routed_expert
        )
        assert proj.device("CUDA0").total() + added + cost > (dev.capacity or 0) - dev.margin


def test_fill_spills_expert_layers_that_do_not_fit(demo_path: Path) -> None:
    plan = _demo_plan(demo_path, "CUDA0=600GiB")
    small = replace(
        plan, devices=DeviceSet(plan.devices.cpu, (replace(plan.devices.gpus[0], total=40 * GiB),))
    )
    moves = presets.fill_with_experts(small, small.placement(), small.projection(), "CUDA0")
    assert CPU in moves.values(), "experts that no longer fit go to the CPU"


def test_layers_to_device_and_back_to_default(demo_path: Path) -> None:
    plan = _demo_plan(demo_path)
    moves = presets.layers_to(plan, plan.placement(), 20, 10, CPU)
    layers = {plan.model.tensor(n).layer for n in moves}
    assert layers == set(range(10, 21))
    experts = presets.layers_to(plan, plan.placement(), 10, 20, CPU, experts_only=True)
    assert len(experts) == 33
    moved = plan.with_moves(moves)
    back = presets.back_to_default(moved)
    assert set(back) == set(moves) and set(back.values()) == {None}
    assert moved.with_moves(back).moves == {}


def test_over_capacity_warning_names_the_preset_that_fixes_it(demo_path: Path) -> None:
    """The default command puts DeepSeek-V3 (377 GiB) on a 24 GiB GPU: the warning names the fill
    preset, and applying it leaves no device over capacity."""
    from offload_planner.ui.projector import window_analysis as analyse

    plan = _demo_plan(demo_path)
    before = analyse(plan)
    (warning,) = [w for w in before.warnings if w.startswith("CUDA0 is over capacity")]
    assert "Presets ▸ Fill CUDA0 with routed experts" in warning
    moves = presets.fill_with_experts(plan, plan.placement(), plan.projection(), "CUDA0")
    after = analyse(plan.with_moves(moves))
    assert not [w for w in after.warnings if "over capacity" in w], after.warnings


def test_llama_fit_preset_runs_what_the_default_fit_would(demo_path: Path) -> None:
    """DeepSeek-V3 on one 24 GiB GPU: llama.cpp's --fit keeps a 1 GiB margin, puts the attention of
    every layer on the GPU and as many expert layers as fit (the search itself is compared with
    llama-fit-params in tests/integration/test_fit_vs_llama.py)."""
    plan = _demo_plan(demo_path)
    fitted, result = presets.llama_fit(plan)
    assert result.status == "success" and result.changed
    proj = fitted.projection()
    cuda0 = proj.device("CUDA0")
    # the 1 GiB margin, give or take what the dry run counts differently from the server
    assert cuda0.resident() <= 24 * GiB - 1024**3 + 256 * 1024**2
    on_gpu = {p.tensor.layer for p in fitted.placement().items
              if p.device == "CUDA0" and p.tensor.role.is_routed_expert}
    assert 0 < len(on_gpu) < 58
    attn = {p.device for p in fitted.placement().items if p.tensor.role is Role.ATTENTION}
    assert attn == {"CUDA0"}
    again, _ = presets.llama_fit(fitted)
    assert again.placement().tensor_devices() == fitted.placement().tensor_devices(), "a fixed point"


def test_over_capacity_warning_on_a_mac_where_nothing_fits_names_no_preset(demo_path: Path) -> None:
    """DeepSeek-V3 (379 GiB with its context) on a 64 GiB Mac: what Fill would send to the CPU lands
    in the same RAM, so Fill moves nothing; the MTL0 line suggested it anyway. It now says what helps,
    in the Memory pane's words (ui.nothing_fits); with more RAM the line names Fill again."""
    from offload_planner.ui.projector import window_analysis as analyse

    model = open_model(demo_path)

    def mac(gib: int, gpu_gib: int) -> Plan:
        cpu = Device("CPU", DeviceKind.CPU, gib * GiB, gib * GiB)
        devices = DeviceSet(cpu, (parse_device_decl(f"MTL0=m2max,{gpu_gib}GiB"),))
        return plan_from_args(model, devices, argparse.Namespace(ctx_size=8192))

    plan = mac(64, 64)
    assert presets.fill_with_experts(plan, plan.placement(), plan.projection(), "MTL0") == {}
    (warning,) = [w for w in analyse(plan).warnings if w.startswith("MTL0 is over capacity")]
    assert "Fill MTL0 with routed experts" not in warning, warning
    assert ": no placement fits: CPU + MTL0 share one RAM and together take more than it, by " in warning
    assert ("so Presets ▸ Fill, Fastest plan or moving layers cannot help. What helps: a smaller quant"
            in warning)
    roomy = mac(512, 192)  # 512 GiB of RAM take the experts: Fill is the way out again
    (warning,) = [w for w in analyse(roomy).warnings if w.startswith("MTL0 is over capacity")]
    assert warning.endswith(": Presets ▸ Fill MTL0 with routed experts keeps as many expert layers there "
                            "as fit and sends the rest to the CPU"), warning
