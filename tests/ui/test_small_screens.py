"""The window fits screens smaller than its 1280x800 design size (1920x1080 at 150 % is 1280x720
logical pixels; a 1366x768 laptop leaves about 700 under its panels): it can be made that small,
opens no larger than the screen, and at 1280x720 the tensor map keeps its columns and most of its
height while the left column scrolls instead of squeezing the Options fields."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QPoint, QRect
from PySide6.QtWidgets import QWidget
from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import open_and_wait

from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.memory_view import BREAKDOWN_FORMS
from offload_planner.ui.settings import Settings


def _rect_in(w: QWidget, ancestor: QWidget) -> QRect:
    return QRect(w.mapTo(ancestor, QPoint(0, 0)), w.size())


def test_window_opens_no_larger_than_the_screen(qtbot: QtBot, settings: Settings) -> None:
    win = MainWindow(settings, system_info("CUDA0=24GiB"))  # no saved geometry
    win.confirm_close = False
    qtbot.addWidget(win)
    screen = win.screen()
    assert screen is not None
    room = screen.availableGeometry()
    # the offscreen platform's screen is 800x800: narrower than 1280, not narrower than 1024
    assert win.width() == max(1024, min(1280, room.width()))
    assert win.height() == max(640, min(800, room.height()))
    win.resize(1024, 640)
    assert (win.width(), win.height()) == (1024, 640)  # the minimum was 1280x800


def test_1280x720_keeps_the_map_and_scrolls_the_left_column(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    window.resize(1280, 720)
    open_and_wait(qtbot, window, demo_path)
    qtbot.wait(50)
    assert (window.width(), window.height()) == (1280, 720)
    view = window.map_view
    assert view.height() >= 320
    hh = view.horizontalHeader()
    n = view.model().columnCount()
    assert all(hh.sectionViewportPosition(c) + hh.sectionSize(c) <= view.viewport().width() for c in range(n))
    o = window.options_panel
    for w in (o.ctx, o.batch, o.ubatch, o.ngl, o.type_k, o.type_v, o.slots):
        assert w.height() >= w.sizeHint().height(), w.toolTip()
    bar = window.left_scroll.verticalScrollBar()
    assert bar.maximum() > 0  # what does not fit is reached by scrolling, not cut off
    bar.setValue(bar.maximum())
    qtbot.wait(20)
    port = window.left_scroll.viewport()
    for w in (o.unified, o.flash, o.kv_offload, o.mmap):
        assert port.rect().contains(_rect_in(w, port)), w.text()
    lines = window.memory_view._breakdown_lines()
    assert lines and all(line.form < len(BREAKDOWN_FORMS) for line in lines)
    assert window.tabs.height() >= 150  # the command stays readable


def test_every_memory_row_uses_the_same_labels(qtbot: QtBot, settings: Settings, demo_path: Path) -> None:
    """At 1024x700 with two GPUs over capacity the GPU rows had room for "weights 180.9 KV 1.1 compute
    0.7" and the CPU row, with its output buffer too, only for "W 0.5 C 0.3 O 2 MiB": one pane, two
    spellings.  Every row now takes the shortest form any row needs (the legend names the letters)."""
    win = MainWindow(settings, system_info("CUDA0=rtx3090", "CUDA1=rtx4090", cpu_gib=256))
    win.confirm_close = False
    qtbot.addWidget(win)
    win.resize(1024, 700)
    win.show()
    qtbot.waitExposed(win)
    open_and_wait(qtbot, win, demo_path)  # -ngl 999 -ts 31,31: both GPUs over, "+159.6 GiB over"
    qtbot.wait(50)
    view = win.memory_view
    lines = view._breakdown_lines()
    assert len(lines) == 3
    assert len({line.form for line in lines}) == 1, [line.text for line in lines]
    assert all(line.form < len(BREAKDOWN_FORMS) for line in lines)  # none elided
    assert [line.text.split()[0] for line in lines] == ["W", "W", "W"]
    assert view.abbreviated() and ("weights (W)", "model") in view.legend_items()
    win.close()
