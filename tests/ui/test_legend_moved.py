"""The moved mark means "moved from llama.cpp's default placement", by hand or by a preset: the legend
said "moved by you" beside tensors that Presets ▸ Fastest plan moved (leftovers4). Now the legend says
"moved", its tooltip says by whom, and so does a moved cell's tooltip."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, QPoint, Qt
from PySide6.QtGui import QHelpEvent
from PySide6.QtWidgets import QApplication, QToolTip
from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.settings import Settings

MEANING = "moved from llama.cpp's default placement, by you or a preset"


def _legend_tip(qtbot: QtBot, win: MainWindow, kind: str) -> str:
    legend = win.legend
    box = next(b for k, _label, b in legend.layout_entries(legend.width()) if k == kind)
    pos = QPoint(int(box.center().x()), int(box.center().y()))
    QToolTip.hideText()
    QApplication.sendEvent(legend, QHelpEvent(QEvent.Type.ToolTip, pos, legend.mapToGlobal(pos)))
    qtbot.waitUntil(QToolTip.isVisible)
    return QToolTip.text()


def test_cells_the_fastest_plan_moved_are_not_said_moved_by_you(
    qtbot: QtBot, settings: Settings, demo_path: Path
) -> None:
    win = make_window(qtbot, settings, system_info("CUDA0=24GiB", "CUDA1=24GiB", cpu_gib=512))
    try:
        open_and_wait(qtbot, win, demo_path)
        assert ("moved", "moved") in win.legend.entries()
        assert _legend_tip(qtbot, win, "moved") == MEANING.capitalize()
        assert win.presets_menu.fastest()  # no move by hand: every mark is the preset's
        wait_projected(qtbot, win, 120_000)
        grid = win.doc.grid
        assert grid is not None
        moved = next(k for k, cell in grid.cells.items() if cell.moved)
        model = win.map_view.model()
        tip = str(model.data(model.index(*moved), Qt.ItemDataRole.ToolTipRole))
        assert f"◆ {MEANING}" in tip and "by you<" not in tip and "moved by you" not in tip
        labels = [label for _k, label in win.legend.entries()]
        assert "moved" in labels and not any("by you" in label for label in labels)
    finally:
        win.close()


def test_not_movable_says_which_tensors_and_why(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    """The hatch's entry "not movable" had no tooltip: a GLM-4.5-style model's NextN block is hatched
    and a newcomer could not tell why (newcomer7)."""
    from offload_planner.core.synth import SMALL_MODELS, write_model

    path = write_model(SMALL_MODELS["glm4moe"], tmp_path / "glm4moe.gguf")[0]
    open_and_wait(qtbot, window, path)
    tip = _legend_tip(qtbot, window, "fixed")
    assert tip.startswith("Hatched: tensors this command does not let you move") and "NextN/MTP" in tip
    grid = window.doc.grid
    assert grid is not None
    fixed = next(k for k, cell in grid.cells.items() if cell.items and not cell.movable)
    model = window.map_view.model()
    cell_tip = str(model.data(model.index(*fixed), Qt.ItemDataRole.ToolTipRole))
    assert "not movable: NextN/MTP block: not loaded without MTP" in cell_tip
