"""µbatch -ub above Batch -b in Options: llama.cpp cuts -ub to -b (n_ubatch = min(n_batch, n_ubatch)), so
the box showed 4096 and the plan ran 2048: the Speed tab names "-ub 4096" as the fastest (its sweep sets
-b with it, as Fastest plan does), the newcomer sets µbatch -ub to 4096 as its hint says, and got the
-ub 2048 estimate (pp 42.4 t/s where the tab said 66) under a box reading 4096, with no note.  Now -b
follows in the same undo step (and -ub follows a -b set below it), and the status bar says so."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QComboBox
from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.settings import Settings


def _type(qtbot: QtBot, win: MainWindow, box: QComboBox, text: str) -> None:
    edit = box.lineEdit()
    assert edit is not None
    edit.setText(text)
    edit.editingFinished.emit()  # what Enter or leaving the box does
    wait_projected(qtbot, win)


def test_ub_above_b_raises_b_in_one_undo_step(qtbot: QtBot, settings: Settings, demo_path: Path) -> None:
    win = make_window(qtbot, settings, system_info())
    try:
        open_and_wait(qtbot, win, demo_path)
        c = win.doc.plan.context
        assert (c.n_batch, c.n_ubatch) == (2048, 512)
        _type(qtbot, win, win.options_panel.ubatch, "4096")
        c = win.doc.plan.context
        assert (c.n_batch, c.n_ubatch) == (4096, 4096)
        argv = win.command_pane.argv()
        assert argv[argv.index("-b") + 1] == argv[argv.index("-ub") + 1] == "4096"
        assert win.options_panel.batch.currentText() == "4096"
        assert win.statusBar().currentMessage() == (
            "Batch -b raised to 4096 with it: llama.cpp computes at most -b tokens at once (a -ub above -b "
            "is cut to -b)")
        win.act_undo.trigger()  # one step back: both as they were
        wait_projected(qtbot, win)
        c = win.doc.plan.context
        assert (c.n_batch, c.n_ubatch) == (2048, 512)
        _type(qtbot, win, win.options_panel.batch, "256")  # -b under -ub: -ub follows it down
        c = win.doc.plan.context
        assert (c.n_batch, c.n_ubatch) == (256, 256)
        assert win.options_panel.ubatch.currentText() == "256"
        assert win.statusBar().currentMessage().startswith("µbatch -ub lowered to 256 with it: ")
        _type(qtbot, win, win.options_panel.ubatch, "128")  # within -b: as before, -b untouched
        c = win.doc.plan.context
        assert (c.n_batch, c.n_ubatch) == (256, 128)
    finally:
        win.close()
