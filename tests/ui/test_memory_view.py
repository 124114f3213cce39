"""The memory view: actual markers from a launch turn hollow and grey ("before your last edit") once
the plan is edited (a move, an option, an undo) and solid again when a launch reports; the breakdown
line under each bar abbreviates its labels to fit the default window width, the tooltip keeps them
whole."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, QPoint, QRectF
from PySide6.QtGui import QColor, QFont, QFontMetrics, QHelpEvent, QImage, QPalette
from PySide6.QtWidgets import QApplication, QToolTip
from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import open_and_wait, wait_projected

from offload_planner.core.device_figures import BUFFER_KINDS, DeviceFigures
from offload_planner.core.placement import CPU
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.memory_view import (
    BREAKDOWN_FORMS,
    STALE_ACTUAL_COLOR,
    MemoryView,
    breakdown_forms,
    fit_breakdown,
    gib,
)
from offload_planner.ui.palette import ACTUAL_COLOR

MOVED = "blk.7.ffn_down_exps.weight"

# --- helpers -----------------------------------------------------------------------------------


def _actuals(window: MainWindow) -> dict[str, int]:
    a = window.doc.analysis
    assert a is not None and a.projection is not None
    return {dm.device.name: dm.total() + (64 << 20) for dm in a.projection.devices}


def _pixel(img: QImage, x: float, y: float) -> QColor:
    dpr = img.devicePixelRatio()
    return QColor(img.pixel(QPoint(int(x * dpr), int(y * dpr))))


def _marker_colours(view: MemoryView, row: int) -> tuple[QColor, QColor]:
    """The colours of the actual marker of ``row``: on its top edge and in its middle."""
    r = view.actual_rect(row)
    assert r is not None and r.height() >= 3
    img = view.grab().toImage()
    x = r.left() + r.width() / 2
    return _pixel(img, x, r.top()), _pixel(img, x, r.top() + r.height() / 2)


def _tooltip(qtbot: QtBot, view: MemoryView, row: int) -> str:
    r = view.actual_rect(row)
    assert r is not None
    QToolTip.hideText()
    qtbot.waitUntil(lambda: not QToolTip.isVisible())
    pos = QPoint(int(r.center().x()), int(r.top()) - 4)
    QApplication.sendEvent(view, QHelpEvent(QEvent.Type.ToolTip, pos, view.mapToGlobal(pos)))
    qtbot.waitUntil(QToolTip.isVisible)
    return QToolTip.text()


def _assert_current(qtbot: QtBot, view: MemoryView) -> None:
    assert not view.actuals_stale
    edge, middle = _marker_colours(view, 0)
    assert edge == ACTUAL_COLOR and middle == ACTUAL_COLOR
    tip = _tooltip(qtbot, view, 0)
    assert "actual at the last launch" in tip and "before your last edit" not in tip
    assert "projected the same way" in tip


def _assert_stale(qtbot: QtBot, view: MemoryView) -> None:
    assert view.actuals_stale
    edge, middle = _marker_colours(view, 0)
    assert edge == STALE_ACTUAL_COLOR  # hollow and grey
    assert middle == view.palette().color(QPalette.ColorRole.Base) and middle != ACTUAL_COLOR
    tip = _tooltip(qtbot, view, 0)
    assert "actual at the last launch (before your last edit)" in tip
    assert "projected the same way" not in tip  # no difference against another command's projection


# --- stale actual markers ----------------------------------------------------------------------


def test_actual_markers_go_stale_on_edits_and_fresh_on_new_actuals(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    open_and_wait(qtbot, window, demo_path)
    view, doc = window.memory_view, window.doc
    actuals = _actuals(window)
    view.set_actuals(actuals)
    _assert_current(qtbot, view)

    doc.move([MOVED], CPU)  # a move
    assert view.actuals_stale  # at once, before the projection is done
    wait_projected(qtbot, window)
    assert view.actuals == actuals  # kept, only marked
    _assert_stale(qtbot, view)

    view.set_actuals(actuals)  # a new launch reports
    _assert_current(qtbot, view)

    doc.set_option("context.n_ctx", 2048, "context size")  # an option
    wait_projected(qtbot, window)
    _assert_stale(qtbot, view)
    view.set_actuals(actuals)
    doc.undo_stack.undo()  # an undo is an edit too
    wait_projected(qtbot, window)
    _assert_stale(qtbot, view)

    window.doc.reset(doc.plan)  # a new plan or model drops them
    assert view.actuals == {} and not view.actuals_stale


def test_actuals_of_a_plan_edited_during_the_launch_are_stale_at_once(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    open_and_wait(qtbot, window, demo_path)
    view, doc = window.memory_view, window.doc
    launched = doc.plan
    doc.move([MOVED], CPU)
    wait_projected(qtbot, window)
    view.set_actuals(_actuals(window), launched)
    _assert_stale(qtbot, view)
    view.set_actuals(_actuals(window), doc.plan)
    _assert_current(qtbot, view)


# --- the breakdown line ------------------------------------------------------------------------


def test_breakdown_fits_each_row_at_the_default_window_size(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    open_and_wait(qtbot, window, demo_path)
    view = window.memory_view
    assert window.size().width() == 1280 and view.width() < 400  # the default layout
    a = window.doc.analysis
    assert a is not None and a.projection is not None
    fm = view.fontMetrics()
    for i, dm in enumerate(a.projection.devices):
        drawn = view.breakdown(i)
        assert drawn is not None
        text, rect = drawn
        assert "…" not in text, f"{dm.device.name}: elided {text!r}"
        assert fm.horizontalAdvance(text) <= rect.width(), f"{dm.device.name}: {text!r} overflows {rect}"
        assert rect.left() >= 0 and rect.right() <= view.width()
        f = DeviceFigures.of(dm)
        assert text in breakdown_forms(f)  # every non-empty kind with its figure
        assert all(gib(n) in text for _k, n in f.by_kind if n)
        tip = _tooltip_of_row(qtbot, view, i)
        for (_k, n), (_, label) in zip(f.by_kind, BUFFER_KINDS, strict=True):
            if n:
                assert f"{label} {gib(n)}" in tip  # the tooltip keeps the whole labels
    assert view.abbreviated()  # 24 GiB over on CUDA0: whole labels do not fit beside the status


def test_breakdown_keeps_whole_labels_when_there_is_room(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    open_and_wait(qtbot, window, demo_path)
    window.h_split.setSizes([200, 200, 880])
    qtbot.waitUntil(lambda: window.memory_view.width() > 800)
    view = window.memory_view
    a = window.doc.analysis
    assert a is not None and a.projection is not None
    for i, dm in enumerate(a.projection.devices):
        drawn = view.breakdown(i)
        assert drawn is not None and drawn[0] == breakdown_forms(DeviceFigures.of(dm))[0]
    assert not view.abbreviated()


def test_fit_breakdown_shortens_step_by_step() -> None:
    f = DeviceFigures("CUDA0", "", (("model", 20 << 30), ("kv", 2 << 30), ("compute", 1 << 29),
                                    ("output", 1 << 20)), 23 << 30, 24 << 30, 0, 0)
    forms = breakdown_forms(f)
    assert forms[0] == "weights 20.0  KV cache 2.0  compute 0.5  output 1 MiB"
    assert forms[2] == "W 20.0  KV 2.0  C 0.5  O 1 MiB" and forms[3] == "W 20.0 KV 2.0 C 0.5 O 1 MiB"
    fm = QFontMetrics(QFont())
    widths = [fm.horizontalAdvance(t) for t in forms]
    assert widths == sorted(widths, reverse=True) and len(set(widths)) == len(forms)
    for i, w in enumerate(widths):
        assert fit_breakdown(f, fm, w) == (forms[i], i)
        assert fit_breakdown(f, fm, w - 1)[1] == i + 1
    text, form = fit_breakdown(f, fm, widths[-1] // 2)
    assert form == len(BREAKDOWN_FORMS) and text.endswith("…")
    assert fm.horizontalAdvance(text) <= widths[-1] // 2


def _tooltip_of_row(qtbot: QtBot, view: MemoryView, row: int) -> str:
    drawn = view.breakdown(row)
    assert drawn is not None
    r: QRectF = drawn[1]
    QToolTip.hideText()
    qtbot.waitUntil(lambda: not QToolTip.isVisible())
    pos = QPoint(int(r.left()) + 4, int(r.center().y()))
    QApplication.sendEvent(view, QHelpEvent(QEvent.Type.ToolTip, pos, view.mapToGlobal(pos)))
    qtbot.waitUntil(QToolTip.isVisible)
    return QToolTip.text()
