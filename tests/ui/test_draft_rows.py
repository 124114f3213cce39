"""A pasted command with a draft model (``-md``): the tensor map shows the draft's tensors as rows of
their own below the main model, on the devices its own flags give them, the memory bars count the
draft context, and moving a draft cell writes an ``-otd`` rule (how llama.cpp lets it move)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import open_and_wait, wait_projected

from offload_planner.core.device_figures import DeviceFigures
from offload_planner.core.extra_context import DRAFT
from offload_planner.core.memory import DeviceMemory
from offload_planner.core.placement import CPU
from offload_planner.core.tensor_grid import DRAFT_PREFIX
from offload_planner.ui.main_window import MainWindow


def test_draft_model_has_its_own_rows(qtbot: QtBot, window: MainWindow,
                                      small_models: dict[str, Path]) -> None:
    open_and_wait(qtbot, window, small_models["llama"])
    doc = window.doc
    grid = doc.grid
    assert grid is not None
    n_main_rows = len(grid.rows)
    assert not any(r.key.startswith(DRAFT_PREFIX) for r in grid.rows)

    draft = small_models["llama-draft"]
    assert window.command_pane.apply_command_text(f"llama-server -m llama.gguf -c 2048 -md {draft} -ngld 2")
    wait_projected(qtbot, window)
    grid = doc.grid
    assert grid is not None
    draft_rows = [i for i, r in enumerate(grid.rows) if r.key.startswith(DRAFT_PREFIX)]
    assert [grid.rows[i].label for i in draft_rows] == ["draft embd", "draft 0", "draft 1", "draft out"]
    assert draft_rows[0] == n_main_rows  # below the main model's rows
    assert window.map_view.model().rowCount() == len(grid.rows)
    assert window.map_view.model().headerData(draft_rows[1], Qt.Orientation.Vertical) == "draft 0"
    # -ngld 2 offloads the output layer and layer 1; layer 0 and the input layer stay on the CPU
    devices = {grid.rows[r].label: {i.device for c in range(len(grid.columns)) for i in grid.cell(r, c).items}
               for r in draft_rows}
    assert devices == {"draft embd": {CPU}, "draft 0": {CPU}, "draft 1": {"CUDA0"}, "draft out": {"CUDA0"}}
    assert all(i.name.startswith("draft:") for r in draft_rows for c in range(len(grid.columns))
               for i in grid.cell(r, c).items)
    # main-model names are still found in the main rows
    pos = grid.position_of("blk.0.attn_q.weight")
    assert pos is not None and pos[0] < n_main_rows

    proj = doc.analysis.projection  # type: ignore[union-attr]
    assert [e.key for e in proj.extras] == [DRAFT]
    gpu = proj.device("CUDA0")
    main_only = DeviceMemory(gpu.device, [b for b in gpu.buffers if not b.owner])
    extra = proj.extras[0].by_device()["CUDA0"]
    assert DeviceFigures.of(gpu).used == DeviceFigures.of(main_only).used + extra


def test_moving_a_draft_cell_writes_an_otd_rule(qtbot: QtBot, window: MainWindow,
                                                small_models: dict[str, Path]) -> None:
    from offload_planner.core.analysis import analyse_command
    from offload_planner.core.cmdline import parse_server_args
    from offload_planner.core.plan import plan_command

    open_and_wait(qtbot, window, small_models["llama"])
    doc = window.doc
    draft = small_models["llama-draft"]
    assert window.command_pane.apply_command_text(
        f"llama-server -m llama.gguf -c 2048 -md {draft} -ngld 2 -otd blk.1.ffn=CPU")
    wait_projected(qtbot, window)
    grid = doc.grid
    assert grid is not None
    row = next(i for i, r in enumerate(grid.rows) if r.key == "draft:blk.0")
    names = grid.names([(row, c) for c in range(len(grid.columns))])
    assert names and all(n.startswith("draft:blk.0.") for n in names)
    assert doc.describe_tensors(names).startswith(f"{len(names)} tensors")
    steps = doc.undo_stack.count()
    assert doc.move(names, "CUDA0")
    wait_projected(qtbot, window)
    assert doc.undo_stack.count() == steps + 1
    grid = doc.grid
    assert grid is not None
    cells = [grid.cell(row, c) for c in range(len(grid.columns))]
    assert {i.device for c in cells for i in c.items} == {"CUDA0"} and all(c.moved for c in cells if c.items)
    # the exported command carries the rules ahead of the user's (one -otd: no repeated flag)
    cmd = plan_command(doc.plan)
    assert cmd.count("-otd") == 1
    otd = cmd[cmd.index("-otd") + 1]
    assert otd.endswith(",blk.1.ffn=CPU") and r"^blk\.0\.attn_q\.weight$=CUDA0" in otd
    # and it projects what the window shows
    again = analyse_command(doc.plan.model, doc.plan.devices, parse_server_args(cmd))
    assert again.projection.device("CUDA0").total() == doc.analysis.projection.device("CUDA0").total()  # type: ignore[union-attr]
    doc.undo_stack.undo()
    wait_projected(qtbot, window)
    grid = doc.grid
    assert grid is not None
    assert {i.device for c in range(len(grid.columns)) for i in grid.cell(row, c).items} == {CPU}
