"""Driving the window in tests: open a model and wait for its projection, make a window."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from offload_planner.ui.main_window import MainWindow, SystemInfo
from offload_planner.ui.settings import Settings


def open_and_wait(qtbot: QtBot, win: MainWindow, path: str | Path, timeout: int = 30_000) -> None:
    """Open a model or plan and wait until its projection is on screen."""
    win.open_path(path)
    qtbot.waitUntil(lambda: not win.loader.busy, timeout=timeout)
    wait_projected(qtbot, win, timeout)


def wait_projected(qtbot: QtBot, win: MainWindow, timeout: int = 30_000) -> None:
    qtbot.waitUntil(lambda: win.doc.has_plan and win.doc.analysis_current, timeout=timeout)


def make_window(qtbot: QtBot, settings: Settings, system: SystemInfo) -> MainWindow:
    win = MainWindow(settings, system)
    win.confirm_close = False
    qtbot.addWidget(win)
    win.resize(1280, 800)
    win.show()
    qtbot.waitExposed(win)
    return win
