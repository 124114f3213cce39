"""The Launch tab in the window: the backend path is remembered, and after a launch the memory view
marks each device's actual total next to its projected bar."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PySide6.QtCore import QEvent, QPoint, Qt
from PySide6.QtGui import QColor, QHelpEvent
from PySide6.QtWidgets import QApplication, QFileDialog, QToolTip
from pytestqt.qtbot import QtBot
from tests.ui.test_launcher_panel import _buffer_lines, _fake_server
from tests.ui.window_helpers import open_and_wait, wait_projected

from offload_planner.core.placement import CPU
from offload_planner.core.units import MiB
from offload_planner.ui import settings as keys
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.palette import ACTUAL_COLOR


def test_backend_path_is_stored_and_used(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exe = tmp_path / "llama-server"
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(exe), "")))
    window.tabs.setCurrentIndex(window.tabs.count() - 1)
    qtbot.mouseClick(window.launcher.browse_button, Qt.MouseButton.LeftButton)
    assert window.settings.get(keys.BACKEND_PATH) == str(exe)
    assert window.launcher.launch_config().executable == str(exe)
    edit = window.launcher.server_edit
    edit.setFocus()
    edit.selectAll()
    qtbot.keyClicks(edit, "/opt/llama/bin/llama-server")
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    assert window.settings.get(keys.BACKEND_PATH) == "/opt/llama/bin/llama-server"
    window.set_backend_path(str(exe))
    assert edit.text() == str(exe) and window.settings.get(keys.BACKEND_PATH) == str(exe)


def test_actual_totals_are_marked_in_the_memory_view(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, small_models: dict[str, Path]
) -> None:
    open_and_wait(qtbot, window, small_models["qwen3moe"])
    a = window.doc.analysis
    assert a is not None and a.projection is not None
    exe = _fake_server(tmp_path, _buffer_lines(a.projection, compute_scale=1.5))
    window.set_backend_path(str(exe))
    launcher = window.launcher
    launcher.port_spin.setValue(19000 + os.getpid() % 1000)
    window.tabs.setCurrentIndex(window.tabs.count() - 1)
    assert window.memory_view.actual_rect(0) is None
    with qtbot.waitSignal(launcher.actualsReady, timeout=20_000, check_params_cb=bool):
        qtbot.mouseClick(launcher.launch_button, Qt.MouseButton.LeftButton)
    actuals = window.memory_view.actuals
    assert set(actuals) == {"CUDA0", CPU}
    gpu = a.projection.device("CUDA0")
    assert actuals["CUDA0"] > gpu.total()  # compute logged 1.5x the projection
    assert abs(actuals["CUDA0"] - gpu.total() - gpu.compute // 2) < 0.02 * MiB
    # the thin bar: as long as the projected bar would be for the actual total, in its own colour
    r = window.memory_view.actual_rect(0)
    assert r is not None and r.height() >= 3
    img = window.memory_view.grab().toImage()
    dpr = img.devicePixelRatio()
    probe = QPoint(int((r.left() + r.width() / 2) * dpr), int(r.center().y() * dpr))
    assert QColor(img.pixel(probe)) == ACTUAL_COLOR
    view = window.memory_view
    pos = QPoint(int(r.center().x()), int(r.top()) - 4)
    QApplication.sendEvent(view, QHelpEvent(QEvent.Type.ToolTip, pos, view.mapToGlobal(pos)))
    qtbot.waitUntil(QToolTip.isVisible)
    assert "actual at the last launch" in QToolTip.text()
    with qtbot.waitSignal(launcher.server.finished, timeout=20_000):
        launcher.stop()
    assert window.memory_view.actuals == actuals  # it stays until the next launch or model


def test_an_edit_after_a_launch_marks_its_figures_stale_until_the_next(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, small_models: dict[str, Path]
) -> None:
    open_and_wait(qtbot, window, small_models["qwen3moe"])
    a = window.doc.analysis
    assert a is not None and a.projection is not None
    window.set_backend_path(str(_fake_server(tmp_path, _buffer_lines(a.projection))))
    launcher, view = window.launcher, window.memory_view
    launcher.port_spin.setValue(19500 + os.getpid() % 400)
    window.tabs.setCurrentIndex(window.tabs.count() - 1)
    with qtbot.waitSignal(launcher.actualsReady, timeout=20_000, check_params_cb=bool):
        qtbot.mouseClick(launcher.launch_button, Qt.MouseButton.LeftButton)
    assert view.actuals and not view.actuals_stale and not launcher.stale_note.isVisible()
    window.doc.set_option("context.n_ctx", 2048, "context size")
    wait_projected(qtbot, window)
    assert view.actuals_stale and launcher.table_is_stale and launcher.stale_note.isVisible()
    with qtbot.waitSignal(launcher.server.finished, timeout=20_000):
        launcher.stop()
    assert view.actuals_stale  # kept, marked, until a launch reports again
    with qtbot.waitSignal(launcher.actualsReady, timeout=20_000, check_params_cb=bool):
        qtbot.mouseClick(launcher.launch_button, Qt.MouseButton.LeftButton)
    assert view.actuals and not view.actuals_stale and not launcher.stale_note.isVisible()
    with qtbot.waitSignal(launcher.server.finished, timeout=20_000):
        launcher.stop()


def test_no_llama_server_says_what_to_do_and_offers_to_choose_one(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, qwen3moe_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newcomer without llama-server presses Launch: the problem says what to do next and a
    Choose llama-server… button appears beside the state, in view (the Server field is below the
    table, out of sight at 1280x800); the error is said once."""
    from offload_planner.ui.launcher_panel import SERVER_HINT

    open_and_wait(qtbot, window, qwen3moe_path)
    window.tabs.setCurrentIndex(window.tabs.count() - 1)  # Launch
    panel, scroll = window.launcher, window.launch_scroll
    missing = tmp_path / "no-such-dir" / "llama-server"
    panel.set_executable(str(missing))
    qtbot.waitExposed(window)
    assert panel.server_edit.mapTo(panel, QPoint(0, 0)).y() > scroll.viewport().height()  # out of sight
    assert not panel.choose_button.isVisible()
    qtbot.mouseClick(panel.launch_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.failures.count() > 0, timeout=10_000)
    text = panel.failures.item(0).text()
    assert text.startswith(f"llama-server did not start: llama-server not found; looked in: {missing}")
    assert SERVER_HINT in text
    assert str(missing) not in panel.notes.text()  # said once, not again under the problem
    button = panel.choose_button
    assert button.isVisible()
    top = button.mapTo(scroll.viewport(), QPoint(0, 0)).y()
    assert top >= 0 and top + button.height() <= scroll.viewport().height()
    exe = tmp_path / "bin" / "llama-server"
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(exe), "")))
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    assert panel.server_edit.text() == str(exe) and window.settings.get(keys.BACKEND_PATH) == str(exe)
    assert not button.isVisible()
