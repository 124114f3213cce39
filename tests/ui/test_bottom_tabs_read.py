"""The bottom tabs at 1280x800 read for someone who has not launched anything yet: Telemetry and Speed
say what they show and how to fill them (not empty plots with made-up axes), the idle Launch tab
has no empty progress bar that reads as a text field and shows more than one row of its table, and
the telemetry plots, once samples arrive, sit side by side (stacked, the third was not on screen) in
the colours the rest of the window gives each device."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QPoint
from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.backend.telemetry import GpuSample, Sample
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.palette import device_color
from offload_planner.ui.settings import Settings

RES = Path(__file__).resolve().parents[2] / "resources"


def test_telemetry_says_how_to_fill_it_then_plots_side_by_side(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    open_and_wait(qtbot, window, demo_path)
    tele = window.telemetry
    window.tabs.setCurrentWidget(tele)
    qtbot.wait(20)
    assert tele.idle.isVisible() and not tele.graphics.isVisible()
    assert "Launch" in tele.idle.text() and "GiB" in tele.idle.text()
    tele.set_projection({"CUDA0": 14 << 30, "CPU": 300 << 30})
    for i in range(8):
        tele.add_sample(Sample(i * 0.5, (GpuSample("CUDA0", (i + 1) << 30, 24 << 30, 40),), rss=(i + 1) << 30,
                               ram_used=(i + 8) << 30, ram_total=512 << 30))
    qtbot.wait(20)
    assert tele.graphics.isVisible() and not tele.idle.isVisible()
    plots = (tele.gpu_plot, tele.ram_plot, tele.util_plot)
    boxes = [p.vb.sceneBoundingRect() for p in plots]
    assert all(b.top() == boxes[0].top() for b in boxes)  # one row
    assert boxes[0].right() <= boxes[1].left() and boxes[1].right() <= boxes[2].left()
    view_h = tele.graphics.viewport().height()
    for b in boxes:  # stacked in the bottom tab, each had about 30 px and the third none
        assert b.height() >= 60 and b.bottom() <= view_h, (b, view_h)
    for p in plots:  # each plot names what it shows, with its unit
        assert p.getAxis("left").labelText
    pen = tele._curves["mem:CUDA0"].opts["pen"]
    assert pen.color() == device_color(window.doc.plan.devices, "CUDA0")  # the map's CUDA0 blue
    tele.clear()  # a new launch: the hint until its first sample
    assert tele.idle.isVisibleTo(tele) and not tele.graphics.isVisibleTo(tele)


def test_speed_tab_explains_the_button_then_plots(qtbot: QtBot, settings: Settings, demo_path: Path) -> None:
    win = make_window(qtbot, settings, system_info("CUDA0=24GiB", "CUDA1=24GiB"))
    try:
        open_and_wait(qtbot, win, RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
        plot = win.ubatch_plot
        win.tabs.setCurrentWidget(plot)
        qtbot.wait(20)
        assert plot.idle.isVisible() and not plot.graphics.isVisible()
        hint = plot.idle.text()
        assert plot.button.text() in hint and "t/s" in hint and "GiB" in hint
        assert plot.idle.height() >= plot.idle.heightForWidth(plot.idle.width())  # not cut off
        plot.button.click()
        qtbot.waitUntil(lambda: bool(plot.points), timeout=120_000)
        qtbot.wait(50)
        assert plot.graphics.isVisible() and not plot.idle.isVisible()
        for side in ("left", "right"):  # each axis title no longer than its axis is tall
            axis = plot.plot.getAxis(side)
            # drawn rotated: its width runs up the axis (less the text item's own margins)
            text_len = axis.label.boundingRect().width() - 2 * axis.label.document().documentMargin()
            assert text_len <= axis.size().height(), (side, axis.labelText, text_len, axis.size().height())
        open_and_wait(qtbot, win, demo_path)  # another model: its own trade-off, not the last one's
        assert plot.idle.isVisible() and not plot.graphics.isVisible() and not plot.points
    finally:
        win.close()


def test_idle_launch_tab_has_a_hint_not_an_empty_bar(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    open_and_wait(qtbot, window, demo_path)
    panel = window.launcher
    window.tabs.setCurrentWidget(window.launch_scroll)
    qtbot.wait(20)
    assert (window.width(), window.height()) == (1280, 800)
    assert not panel.progress.isVisible()
    assert panel.idle_hint.isVisible() and "Launch starts llama-server" in panel.idle_hint.text()
    assert not panel.notes.isVisible()  # no notice yet: no empty line for one
    # the projected figures are the tab's point before a launch: at least two rows of the table in view
    table = panel.table
    port = window.launch_scroll.viewport()
    top = table.viewport().mapTo(port, QPoint(0, 0)).y()
    shown = min(port.height(), top + table.viewport().height()) - max(top, 0)
    assert shown >= 2 * table.rowHeight(0), (shown, table.rowHeight(0))
    # every figure column says its unit; the last one says what its marks and notes are
    headers = [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())]
    assert all(h.endswith(" MiB") for h in headers[3:6]), headers
    assert headers[-1], headers


def test_rules_table_headers_say_what_they_count(qtbot: QtBot, window: MainWindow, demo_path: Path) -> None:
    open_and_wait(qtbot, window, demo_path)
    assert window.command_pane.apply_command_text("llama-server -m m.gguf -ngl 999 --cpu-moe")
    wait_projected(qtbot, window)
    rules = window.command_pane.rules
    assert rules.isVisible() and rules.topLevelItemCount() == 1  # --cpu-moe's rule
    header = rules.headerItem()
    tips = [header.toolTip(c) for c in range(rules.columnCount())]
    assert all(tips), tips
    assert "moves" in tips[0] and "override-tensor" in tips[0]
    assert "shadowed" in tips[3] and "matches nothing" in tips[3]
