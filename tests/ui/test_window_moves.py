"""The window end to end with real widgets and real mouse and key events (offscreen).

The central scenario: on the DeepSeek-V3 demo header with one 24 GiB GPU, sweep-select the routed
experts of layers 10-20 with the mouse, drag them onto CPU in the Devices list; the projection,
the command line and the undo stack follow, and undo/redo restore both.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QPoint, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QWidget
from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import open_and_wait, wait_projected

from offload_planner.core.placement import CPU
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.tensor_map_view import TensorMapView

EXPERT_COLUMNS = ("exps_up", "exps_gate", "exps_down")


def _cell_center(view: TensorMapView, row: int, col: int) -> QPoint:
    idx = view.model().index(row, col)
    view.scrollTo(idx)
    return view.visualRect(idx).center()


def _click(widget: QWidget, pos: QPoint) -> None:
    """Press and release, a moment after the previous event."""
    QTest.qWait(50)
    QTest.mousePress(widget, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, pos)
    QTest.mouseRelease(widget, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, pos)


def _weights(win: MainWindow) -> dict[str, int]:
    a = win.doc.analysis
    assert a is not None and a.projection is not None
    return {d.device.name: d.weights for d in a.projection.devices}


def _expert_positions(win: MainWindow, first: int, last: int) -> tuple[tuple[int, int], tuple[int, int]]:
    grid = win.doc.grid
    assert grid is not None
    cols = [grid.column_index(k) for k in EXPERT_COLUMNS]
    assert None not in cols
    r0, r1 = grid.row_of_layer(first), grid.row_of_layer(last)
    assert r0 is not None and r1 is not None
    return (r0, min(c for c in cols if c is not None)), (r1, max(c for c in cols if c is not None))


def test_small_model_opens_with_its_layers_and_roles(
    qtbot: QtBot, window: MainWindow, qwen3moe_path: Path
) -> None:
    open_and_wait(qtbot, window, qwen3moe_path)
    grid = window.doc.grid
    assert grid is not None
    assert [r.label for r in grid.rows] == ["embd", "0", "1", "2", "3", "out"]
    keys = [c.key for c in grid.columns]
    assert {"attn", "router", "exps_up", "exps_gate", "exps_down", "norms"} <= set(keys)
    assert "shexp" not in keys  # Qwen3-MoE has no shared expert
    assert "qwen3moe" in window.summary.text() and "4 layers" in window.summary.text()
    assert window.map_view.model().rowCount() == 6
    assert "llama-server" in window.command_pane.text.toPlainText()
    assert str(qwen3moe_path) in window.command_pane.text.toPlainText()
    # tied embeddings: the output copy of token_embd sits on the output row and cannot be moved
    out_row = len(grid.rows) - 1
    embd_col = grid.column_index("embd")
    assert embd_col is not None
    cell = grid.cell(out_row, embd_col)
    assert any(i.placed.copy and not i.movable for i in cell.items)


def test_drag_experts_of_layers_10_to_20_onto_cpu_is_one_undo_step(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    open_and_wait(qtbot, window, demo_path)
    doc, view = window.doc, window.map_view
    before_weights = _weights(window)
    before_cmd = window.command_pane.text.toPlainText()
    assert "-ot" not in before_cmd
    assert doc.undo_stack.count() == 0

    # sweep-select: press on layer 10 / first expert column, move to layer 20 / last expert column
    (r0, c0), (r1, c1) = _expert_positions(window, 10, 20)
    vp = view.viewport()
    start = _cell_center(view, r0, c0)
    end = view.visualRect(view.model().index(r1, c1)).center()
    assert vp.rect().contains(start) and vp.rect().contains(end), "rows 10-20 fit the viewport"
    QTest.mousePress(vp, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, start)
    QTest.mouseMove(vp, (start + end) / 2)
    QTest.mouseMove(vp, end)
    QTest.mouseRelease(vp, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, end)
    assert sorted(view.selected_positions()) == [(r, c) for r in range(r0, r1 + 1) for c in range(c0, c1 + 1)]
    names = view.selected_names()
    assert len(names) == 11 * 3
    expert_bytes = sum(doc.plan.model.tensor(n).nbytes for n in names)

    # drag the selection onto "CPU" in the Devices list and drop it there
    grab = view.visualRect(view.model().index((r0 + r1) // 2, c0 + 1)).center()
    target = window.devices_panel.view.device_rect_center(CPU)
    QTest.mousePress(vp, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, grab)
    QTest.mouseMove(vp, grab + QPoint(12, 12))
    QTest.mouseMove(vp, vp.mapFromGlobal(target))
    QTest.mouseRelease(
        vp, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, vp.mapFromGlobal(target)
    )

    assert doc.undo_stack.count() == 1, "one drag of 33 tensors is one undo step"
    assert all(doc.placement.device_of(n) == CPU for n in names)
    wait_projected(qtbot, window)
    after_weights = _weights(window)
    assert after_weights["CUDA0"] < before_weights["CUDA0"] - expert_bytes * 0.99
    assert after_weights[CPU] > before_weights[CPU]
    after_cmd = window.command_pane.text.toPlainText()
    assert after_cmd != before_cmd
    assert "-ot" in after_cmd and "=CPU" in after_cmd and "1[0-9]|20" in after_cmd
    grid = doc.grid
    assert grid is not None and grid.cell(r0, c0).moved  # the corner mark

    doc.undo_stack.undo()
    wait_projected(qtbot, window)
    assert _weights(window) == before_weights
    assert window.command_pane.text.toPlainText() == before_cmd
    assert not doc.plan.moves

    doc.undo_stack.redo()
    wait_projected(qtbot, window)
    assert _weights(window) == after_weights
    assert window.command_pane.text.toPlainText() == after_cmd
    assert window.isWindowModified()


def test_keys_move_the_selection(qtbot: QtBot, window: MainWindow, demo_path: Path) -> None:
    open_and_wait(qtbot, window, demo_path)
    view, doc = window.map_view, window.doc
    (r0, c0), (_, c1) = _expert_positions(window, 30, 30)
    view.select_cells([(r0, c) for c in range(c0, c1 + 1)])
    view.setFocus()
    QTest.keyClick(view, Qt.Key.Key_0)
    names = view.selected_names()
    assert names and all(doc.placement.device_of(n) == CPU for n in names)
    QTest.keyClick(view, Qt.Key.Key_1)  # the first GPU: back where -ngl put it, so no move is left
    assert all(doc.placement.device_of(n) == "CUDA0" for n in names)
    assert not doc.plan.moves
    QTest.keyClick(view, Qt.Key.Key_2)  # there is no second GPU
    assert doc.undo_stack.count() == 2
    assert "no GPU 2" in window.statusBar().currentMessage()


def test_row_and_column_headers_select_layers_and_roles(
    qtbot: QtBot, window: MainWindow, qwen3moe_path: Path
) -> None:
    open_and_wait(qtbot, window, qwen3moe_path)
    view = window.map_view
    grid = window.doc.grid
    assert grid is not None
    col = grid.column_index("exps_down")
    assert col is not None
    hh = view.horizontalHeader()
    _click(
        hh.viewport(), QPoint(hh.sectionViewportPosition(col) + hh.sectionSize(col) // 2, hh.height() // 2)
    )
    assert {p[1] for p in view.selected_positions()} == {col}
    assert {p[0] for p in view.selected_positions()} == {grid.row_of_layer(i) for i in range(4)}
    vh = view.verticalHeader()
    row = grid.row_of_layer(2)
    assert row is not None
    _click(vh.viewport(), QPoint(vh.width() // 2, vh.sectionViewportPosition(row) + vh.sectionSize(row) // 2))
    assert {p[0] for p in view.selected_positions()} == {row}
    assert all(n.startswith("blk.2.") for n in view.selected_names())


def test_drop_on_a_memory_bar(qtbot: QtBot, window: MainWindow, qwen3moe_path: Path) -> None:
    open_and_wait(qtbot, window, qwen3moe_path)
    view, mem = window.map_view, window.memory_view
    grid = window.doc.grid
    assert grid is not None
    col = grid.column_index("exps_up")
    row = grid.row_of_layer(1)
    assert col is not None and row is not None
    view.select_cells([(row, col)])
    vp = view.viewport()
    p = view.visualRect(view.model().index(row, col)).center()
    bar = mem.mapToGlobal(mem._row_rect(1).center().toPoint())  # CPU: the second device
    assert mem.device_at(bar) == CPU
    QTest.mousePress(vp, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, p)
    QTest.mouseMove(vp, p + QPoint(10, 0))
    QTest.mouseMove(vp, vp.mapFromGlobal(bar))
    QTest.mouseRelease(vp, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, vp.mapFromGlobal(bar))
    assert window.doc.placement.device_of("blk.1.ffn_up_exps.weight") == CPU
    assert window.doc.undo_stack.count() == 1


def test_paste_command_rebuilds_the_map_and_lists_rules(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    open_and_wait(qtbot, window, demo_path)
    doc = window.doc
    text = (
        "llama-server -m DeepSeek-V3-Q4_K_M.gguf -ngl 999 -c 16384 \\\n"
        r'  -ot "blk\.(3|4)\.ffn_.*_exps=CUDA0,blk\.4\.ffn_up_exps=CPU,nomatch=CPU,exps=CPU"'
    )
    assert window.command_pane.apply_command_text(text)
    wait_projected(qtbot, window)
    assert doc.undo_stack.count() == 1
    assert doc.plan.context.n_ctx == 16384
    grid = doc.grid
    assert grid is not None
    up, down = grid.column_index("exps_up"), grid.column_index("exps_down")
    assert up is not None and down is not None
    dev = {(r, c): {i.device for i in grid.cell(r, c).items} for (r, c) in grid.cells}
    for layer in (3, 4):
        assert dev[(grid.row_of_layer(layer), down)] == {"CUDA0"}  # type: ignore[index]
    for layer in range(5, 61):
        assert dev[(grid.row_of_layer(layer), up)] == {CPU}  # type: ignore[index]
    rules = {
        window.command_pane.rules.topLevelItem(i).text(0): window.command_pane.rules.topLevelItem(i).text(3)
        for i in range(window.command_pane.rules.topLevelItemCount())
    }
    assert rules[r"blk\.(3|4)\.ffn_.*_exps=CUDA0"] == "ok"
    assert rules[r"blk\.4\.ffn_up_exps=CPU"] == "shadowed"
    assert rules["nomatch=CPU"] == "matches nothing"
    assert rules["exps=CPU"] == "ok"
    problems = [window.problems.item(i).text() for i in range(window.problems.count())]
    assert any("matches no tensor" in p for p in problems)
    assert any("shadowed" in p for p in problems)
    assert "16384" in window.command_pane.text.toPlainText()

    doc.undo_stack.undo()
    wait_projected(qtbot, window)
    assert doc.plan.context.n_ctx == 32768 and not doc.plan.placement_options.overrides


def _drag(widget: QWidget, start: QPoint, target_global: QPoint) -> None:
    QTest.qWait(50)
    QTest.mousePress(widget, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, start)
    QTest.mouseMove(widget, start + QPoint(12, 12))
    QTest.mouseMove(widget, widget.mapFromGlobal(target_global))
    QTest.mouseRelease(widget, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier,
                       widget.mapFromGlobal(target_global))


def test_dragging_a_role_header_moves_the_role_in_every_layer(
    qtbot: QtBot, window: MainWindow, qwen3moe_path: Path
) -> None:
    open_and_wait(qtbot, window, qwen3moe_path)
    view, doc = window.map_view, window.doc
    grid = doc.grid
    assert grid is not None
    col = grid.column_index("exps_down")
    assert col is not None
    hh = view.horizontalHeader()
    start = QPoint(hh.sectionViewportPosition(col) + hh.sectionSize(col) // 2, hh.height() // 2)
    _drag(hh.viewport(), start, window.devices_panel.view.device_rect_center(CPU))
    names = [f"blk.{i}.ffn_down_exps.weight" for i in range(4)]
    assert all(doc.placement.device_of(n) == CPU for n in names)
    assert doc.undo_stack.count() == 1 and set(doc.plan.moves) == set(names)


def test_dragging_a_layer_number_moves_the_layer(
    qtbot: QtBot, window: MainWindow, qwen3moe_path: Path
) -> None:
    open_and_wait(qtbot, window, qwen3moe_path)
    view, doc, mem = window.map_view, window.doc, window.memory_view
    grid = doc.grid
    assert grid is not None
    row = grid.row_of_layer(2)
    assert row is not None
    vh = view.verticalHeader()
    start = QPoint(vh.width() // 2, vh.sectionViewportPosition(row) + vh.sectionSize(row) // 2)
    _drag(vh.viewport(), start, mem.mapToGlobal(mem._row_rect(1).center().toPoint()))
    moved = set(doc.plan.moves)
    assert moved and all(n.startswith("blk.2.") for n in moved)
    assert all(doc.placement.device_of(n) == CPU for n in moved)
    assert doc.undo_stack.count() == 1


def test_the_drag_tooltip_counts_what_moves(qtbot: QtBot, window: MainWindow, qwen3moe_path: Path) -> None:
    open_and_wait(qtbot, window, qwen3moe_path)
    view, doc = window.map_view, window.doc
    grid = doc.grid
    assert grid is not None
    col = grid.column_index("exps_up")
    rows = [grid.row_of_layer(i) for i in range(3)]
    assert col is not None and None not in rows
    doc.move(["blk.1.ffn_up_exps.weight"], CPU)  # already on the CPU: the drag will not move it
    view.select_cells([(r, col) for r in rows if r is not None])
    vp = view.viewport()
    grab = view.visualRect(view.model().index(rows[0] or 0, col)).center()
    QTest.mousePress(vp, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, grab)
    QTest.mouseMove(vp, grab + QPoint(12, 12))
    QTest.mouseMove(vp, vp.mapFromGlobal(window.devices_panel.view.device_rect_center(CPU)))
    two = sum(doc.plan.model.tensor(f"blk.{i}.ffn_up_exps.weight").nbytes for i in (0, 2))
    from offload_planner.core.units import fmt_bytes

    assert view.drag_tip == f"Move 2 tensors ({fmt_bytes(two)}) to <b>CPU</b>"
    QTest.keyClick(view, Qt.Key.Key_Escape)
    view.select_cells([(rows[0] or 0, col)])
    QTest.mousePress(vp, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, grab)
    QTest.mouseMove(vp, grab + QPoint(12, 12))
    QTest.mouseMove(vp, vp.mapFromGlobal(window.devices_panel.view.device_rect_center(CPU)))
    assert view.drag_tip.startswith("Move 1 tensor (")
    QTest.keyClick(view, Qt.Key.Key_Escape)
    assert doc.undo_stack.count() == 1


def test_a_key_move_says_what_moved(qtbot: QtBot, window: MainWindow, demo_path: Path) -> None:
    """Keyboard only: 0 moved the selection with no word in the status bar (only the map's colours
    changed); it now says what moved, as the Undo entry names it, and how to take it back."""
    open_and_wait(qtbot, window, demo_path)
    view = window.map_view
    (r0, c0), (_, c1) = _expert_positions(window, 30, 30)
    view.select_cells([(r0, c) for c in range(c0, c1 + 1)])
    view.setFocus()
    QTest.keyClick(view, Qt.Key.Key_0)
    undo = window.doc.undo_stack.undoText()
    assert undo.startswith("Move 3 tensors (") and undo.endswith(") to CPU"), undo
    assert window.statusBar().currentMessage() == f"{undo} (Edit ▸ Undo takes it back)"
    QTest.keyClick(view, Qt.Key.Key_Delete)
    assert window.statusBar().currentMessage().startswith("Move 3 tensors (")
    assert "to the command's placement (Edit ▸ Undo takes it back)" in window.statusBar().currentMessage()
