"""The tensor map's extras: the hover tooltip says what moving a cell would change on each device, and
the attention column can split into one column per tensor kind (View menu)."""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import QEvent, QPoint, Qt
from PySide6.QtGui import QAction, QHelpEvent
from PySide6.QtWidgets import QApplication, QMenu, QToolTip
from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import open_and_wait, wait_projected

from offload_planner.core.device_figures import DeviceFigures
from offload_planner.core.move_preview import move_deltas
from offload_planner.core.placement import CPU
from offload_planner.core.roles import Role
from offload_planner.core.tensor_grid import tensor_kind
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.settings import SPLIT_ATTENTION


def _hover_tip(qtbot: QtBot, window: MainWindow, row: int, col: int) -> str:
    view = window.map_view
    idx = view.model().index(row, col)
    view.scrollTo(idx)
    pos = view.visualRect(idx).center()
    vp = view.viewport()
    QApplication.sendEvent(vp, QHelpEvent(QEvent.Type.ToolTip, pos, vp.mapToGlobal(pos)))
    qtbot.waitUntil(lambda: QToolTip.isVisible())
    return QToolTip.text()


def _weights(window: MainWindow) -> dict[str, int]:
    a = window.doc.analysis
    assert a is not None and a.projection is not None
    return {dm.device.name: dict(DeviceFigures.of(dm).by_kind)["model"] for dm in a.projection.devices}


def test_hover_says_what_moving_the_cell_would_change(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    open_and_wait(qtbot, window, demo_path)
    grid = window.doc.grid
    assert grid is not None
    row, col = grid.row_of_layer(7), grid.column_index("exps_down")
    assert row is not None and col is not None
    tip = _hover_tip(qtbot, window, row, col)
    assert "blk.7.ffn_down_exps.weight" in tip and "Moving it would change" in tip
    assert "compute buffers not included" in tip and "(here now)" in tip
    names = grid.cell(row, col).movable_names
    t0 = time.perf_counter()
    deltas = {m.target: m for m in move_deltas(window.doc.plan, names)}
    assert time.perf_counter() - t0 < 0.5, "a tooltip must not run the projection"
    to_cpu = deltas[CPU]
    assert to_cpu.delta > 0 and dict(to_cpu.others)["CUDA0"] < 0
    # the preview is exactly what the full projection says once the move is made
    before = _weights(window)
    window.doc.move(names, CPU)
    wait_projected(qtbot, window)
    after = _weights(window)
    assert after[CPU] - before[CPU] == to_cpu.delta
    assert after["CUDA0"] - before["CUDA0"] == dict(to_cpu.others)["CUDA0"]
    QToolTip.hideText()
    tip = _hover_tip(qtbot, window, row, col)
    assert "◆ moved from llama.cpp's default placement, by you or a preset" in tip and "CUDA0" in tip




def _view_action(window: MainWindow, text: str) -> QAction:
    view = next(a.menu() for a in window.menuBar().actions() if a.text() == "&View")
    assert isinstance(view, QMenu)
    return next(a for a in view.actions() if a.text() == text)


def test_split_attention_into_its_tensors(qtbot: QtBot, window: MainWindow, demo_path: Path) -> None:
    open_and_wait(qtbot, window, demo_path)
    model = window.map_view.model()
    heads = [model.headerData(c, Qt.Orientation.Horizontal) for c in range(model.columnCount())]
    assert "attn" in heads
    act = _view_action(window, "Split attention into its tensors")
    act.trigger()
    assert window.doc.split_attention
    heads = [model.headerData(c, Qt.Orientation.Horizontal) for c in range(model.columnCount())]
    assert "attn" not in heads
    grid = window.doc.grid
    assert grid is not None
    keys = [c.key for c in grid.columns if c.key.startswith("attn:")]
    kinds = {tensor_kind(t.name) for t in window.doc.plan.model.tensors if t.role is Role.ATTENTION}
    assert {k.removeprefix("attn:") for k in keys} == kinds
    assert {"attn:attn_q_a", "attn:attn_q_b", "attn:attn_kv_a_mqa", "attn:attn_output"} <= set(keys)
    assert heads.index("q_a") < heads.index("o") < heads.index("norms")
    qtbot.wait(50)
    hh = window.map_view.horizontalHeader()
    for c, label in enumerate(heads):  # more columns: the map scrolls sideways, no label is clipped
        assert hh.sectionSize(c) > hh.fontMetrics().horizontalAdvance(str(label)), label
    # one column, one tensor per layer: select it in every layer (header click) and move it
    col = grid.column_index("attn:attn_kv_a_mqa")
    assert col is not None
    pos = QPoint(hh.sectionViewportPosition(col) + hh.sectionSize(col) // 2, hh.height() // 2)
    qtbot.mouseClick(hh.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    names = window.map_view.selected_names()
    assert names and all(tensor_kind(n) == "attn_kv_a_mqa" for n in names)
    assert len(names) == window.doc.plan.model.summary.n_layer
    qtbot.keyClick(window.map_view, Qt.Key.Key_0)
    assert all(window.doc.placement.device_of(n) == CPU for n in names)
    assert window.doc.placement.device_of("blk.3.attn_q_a.weight") != CPU
    wait_projected(qtbot, window)
    # back to one column: the moved tensors show as a mixed cell
    act.trigger()
    grid = window.doc.grid
    assert grid is not None and grid.column_index("attn:attn_q_a") is None
    attn = grid.cell(grid.row_of_layer(3) or 0, grid.column_index("attn") or 0)
    assert {d for d, _ in attn.device_bytes} == {CPU, "CUDA0"} and attn.moved
    window.doc.undo_stack.undo()
    assert window.doc.placement.device_of("blk.3.attn_kv_a_mqa.weight") == "CUDA0"


def test_split_attention_is_remembered(qtbot: QtBot, window: MainWindow, demo_path: Path) -> None:
    _view_action(window, "Split attention into its tensors").setChecked(True)
    window.save_settings()
    assert window.settings.get(SPLIT_ATTENTION) is True
    open_and_wait(qtbot, window, demo_path)
    grid = window.doc.grid
    assert grid is not None and grid.column_index("attn:attn_q_b") is not None
