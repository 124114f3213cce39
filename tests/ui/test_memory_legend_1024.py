"""At the window's minimum size (1024x640) with three devices (two GPUs and the CPU) the Memory
pane's legend was cut off: drawn below the pane's bottom (its second line, then its first).  Now the
gaps between the device rows shrink (16 px down to 6) to leave a line for the legend, and a legend
longer than the room left ends its last line with "… N more", its tooltip naming every entry."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from PySide6.QtCore import QEvent
from PySide6.QtGui import QHelpEvent
from PySide6.QtWidgets import QApplication, QToolTip
from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait

from offload_planner.ui.memory_view import MemoryView
from offload_planner.ui.settings import Settings


@contextmanager
def _memory_pane(qtbot: QtBot, settings: Settings, demo_path: Path, w: int, h: int) -> Iterator[MemoryView]:
    """The Memory pane of a w x h window with two 24 GiB GPUs on the demo model, painted."""
    win = make_window(qtbot, settings, system_info("CUDA0=24GiB", "CUDA1=24GiB"))
    try:
        win.resize(w, h)
        open_and_wait(qtbot, win, demo_path)
        qtbot.wait(50)
        view = win.memory_view
        if os.environ.get("LEGEND_PNG"):  # to look at: LEGEND_PNG=/tmp/legend.png
            view.grab().save(os.environ["LEGEND_PNG"])
        view.repaint()
        yield view
    finally:
        win.close()


def test_two_gpus_and_cpu_legend_inside_the_pane_at_1024x640(
    qtbot: QtBot, settings: Settings, demo_path: Path
) -> None:
    with _memory_pane(qtbot, settings, demo_path, 1024, 640) as view:
        drawn = view.legend_drawn()
        assert len(view._rows()) == 3 and drawn
        assert all(r.bottom() <= view.height() for r in drawn), ([r.bottom() for r in drawn], view.height())
        labels = [label for label, _k in view.legend_items()]
        hidden = view.legend_hidden()
        assert hidden and hidden == labels[len(labels) - len(hidden):]  # this pane is short of room
        assert len(drawn) == len(labels) - len(hidden) + 1  # the entries shown and "… N more"
        assert view.next_step_rect() is None or view.next_step_rect().bottom() <= view.height()
        # the rows are whole: the last one's breakdown line ends above the legend
        last_row = view.bar_rect(len(view._rows()) - 1)
        assert last_row.bottom() < min(r.top() for r in drawn)
        QToolTip.hideText()
        at = drawn[-1].center().toPoint()
        QApplication.sendEvent(view, QHelpEvent(QEvent.Type.ToolTip, at, view.mapToGlobal(at)))
        tip = QToolTip.text()
        assert tip.startswith("Legend: ") and all(label in tip for label in labels), tip


def test_a_tall_pane_keeps_the_whole_legend_and_its_gaps(
    qtbot: QtBot, settings: Settings, demo_path: Path
) -> None:
    with _memory_pane(qtbot, settings, demo_path, 1600, 1000) as view:
        assert view.legend_hidden() == [] and len(view.legend_drawn()) == len(view.legend_items())
        assert view._row_gap() == 16
        assert all(r.bottom() <= view.height() for r in view.legend_drawn())
