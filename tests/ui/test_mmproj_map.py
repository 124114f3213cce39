"""The window with a --mmproj projector: its tensors are rows of their own in the tensor map, on the
device clip.cpp loads them on, not movable one by one (--no-mmproj-offload moves the whole
projector to the CPU), and the memory bars count its buffers."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import wait_projected

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.device_figures import DeviceFigures
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.mmproj import read_projector
from offload_planner.core.plan import plan_from_args
from offload_planner.core.synth import SMALL_MODELS, write_model
from offload_planner.core.synth.mmproj import SMALL_MMPROJ, write_mmproj
from offload_planner.ui.main_window import MainWindow

GiB = 1024**3
DEVICES = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB),
                    (Device("RPC0", DeviceKind.RPC, 8 * GiB, 8 * GiB, endpoint="127.0.0.1:5000"),))


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("mm_ui")
    return (write_model(SMALL_MODELS["gemma3"], root / "text.gguf")[0],
            write_mmproj(SMALL_MMPROJ["gemma3"], root / "mmproj.gguf"))


def _plan(paths: tuple[Path, Path], *extra: str):  # type: ignore[no-untyped-def]
    argv = ["--rpc", "127.0.0.1:5000", "-c", "2048", "-mm", str(paths[1]), *extra]
    return plan_from_args(open_model(paths[0]), DEVICES, parse_server_args(argv))


def _projector_cells(window: MainWindow) -> dict[str, list[tuple[str | None, bool, str]]]:
    grid = window.doc.grid
    assert grid is not None
    out: dict[str, list[tuple[str | None, bool, str]]] = {}
    for (r, _c), cell in grid.cells.items():
        for item in cell.items:
            if grid.rows[r].key.startswith("mm."):
                out.setdefault(grid.rows[r].label, []).append((item.device, item.movable, item.name))
    return out


def test_projector_rows_follow_no_mmproj_offload(
    qtbot: QtBot, window: MainWindow, paths: tuple[Path, Path]
) -> None:
    window.doc.reset(_plan(paths))
    wait_projected(qtbot, window)
    cells = _projector_cells(window)
    spec = SMALL_MMPROJ["gemma3"]
    grid = window.doc.grid
    assert grid is not None
    mm_rows = [r.label for r in grid.rows if r.key.startswith("mm.")]
    assert mm_rows == ["mm in", *[f"mm {i}" for i in range(spec.n_layer)], "mm out"] == sorted(
        cells, key=mm_rows.index)
    assert grid.rows[-len(mm_rows) - 1].key == "output"  # below the model's rows
    items = [i for row in cells.values() for i in row]
    assert sorted(n for _, _, n in items) == sorted(t.name for t in read_projector(paths[1]).tensors)
    assert {(d, m) for d, m, _ in items} == {("RPC0", False)}
    # a drag or a selection of everything never moves a projector tensor
    assert not any(n.startswith(("v.", "mm.")) for n in grid.names(grid.cells))
    reason = next(c for c in grid.cells.values() if c.items and c.items[0].name.startswith("v.")
                  ).not_movable_reason
    assert "--no-mmproj-offload" in reason
    # the bars count the projector on RPC0 and the CPU (its raw warmup image)
    a = window.doc.analysis
    assert a is not None and a.projection is not None
    figs = {dm.device.name: dict(DeviceFigures.of(dm).by_kind) for dm in a.projection.devices}
    assert figs["RPC0"]["mmproj"] > read_projector(paths[1]).weight_bytes
    assert figs["CPU"]["mmproj"] == 224 * 224 * 3 * 4
    # the whole projector moves with the flag, as llama.cpp moves it
    window.doc.replace_plan(_plan(paths, "--no-mmproj-offload"), "--no-mmproj-offload")
    wait_projected(qtbot, window)
    items = [i for row in _projector_cells(window).values() for i in row]
    assert {(d, m) for d, m, _ in items} == {("CPU", False)}
    a = window.doc.analysis
    assert a is not None and a.projection is not None
    assert dict(DeviceFigures.of(a.projection.device("RPC0")).by_kind)["mmproj"] == 0


def test_split_attention_columns_take_the_projector(paths: tuple[Path, Path]) -> None:
    from offload_planner.core.tensor_grid import build_grid, layout, plan_projector_placed

    plan = _plan(paths)
    items = plan_projector_placed(plan)
    for split in (False, True):
        grid = build_grid(plan.model, plan.placement(), plan.base_placement(),
                          rows_columns=layout(plan.model, split_attention=split), projector=items)
        col_of = {i.name: grid.columns[c].key for (_r, c), cell in grid.cells.items() for i in cell.items}
        assert col_of["v.blk.0.attn_q.weight"] == ("attn:attn_q" if split else "attn")
        assert col_of["v.blk.0.attn_out.weight"] == ("other" if split else "attn")  # text: attn_output
        assert col_of["v.blk.1.ffn_up.weight"] == "ffn"
        assert col_of["mm.input_projection.weight"] == "other"
        n_items = sum(len(cell.items) for cell in grid.cells.values())
        assert n_items == len(plan.placement().items) + len(items)


def test_the_windows_fit_preset_counts_the_projector(paths: tuple[Path, Path]) -> None:
    """Presets ▸ What llama.cpp's --fit would run: the same targets as the command's fit, which
    the integration test checks against llama-server."""
    from offload_planner.core.fit import fit_for_args
    from offload_planner.core.presets import llama_fit

    argv = ["--rpc", "127.0.0.1:5000", "-c", "2048", "-mm", str(paths[1]), "--no-mmproj-offload"]
    parsed = parse_server_args(argv)
    plan = plan_from_args(open_model(paths[0]), DEVICES, parsed)
    _, result = llama_fit(plan)
    ref = fit_for_args(plan.model, DEVICES, parsed, plan.placement_options, plan.context,
                       free_bytes=[8 * GiB])
    assert ref is not None

    def targets(log: list[str]) -> list[str]:
        return [line for line in log if "target of" in line]

    assert targets(result.log) == targets(ref.log)
    plain = llama_fit(plan_from_args(plan.model, DEVICES, parse_server_args(argv[:4])))[1]
    # registry index 0 is the CPU: the projector's 2.8 MiB there raise RPC0's target
    assert targets(plain.log) == ["  - RPC0: 12 used, 8179 free vs. target of 1024"]
    assert targets(result.log) == ["  - RPC0: 12 used, 8179 free vs. target of 1026"]
