"""Nothing is clipped at 1280x800 logical (the Options fields keep their height, the device buttons
stay in view), and at QT_SCALE_FACTOR=2 the screenshot is drawn at twice the pixels, not scaled up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from PySide6.QtCore import QPoint, QRect
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QWidget
from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import open_and_wait

from offload_planner.ui.main_window import MainWindow

ROOT = Path(__file__).resolve().parents[2]


def _rect_in(w: QWidget, ancestor: QWidget) -> QRect:
    return QRect(w.mapTo(ancestor, QPoint(0, 0)), w.size())


def test_options_and_device_buttons_are_not_clipped_at_1280x800(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    window.devices_panel.show_notice(
        "No GPU detected: no NVIDIA driver found (NVML Shared Library Not Found). Add a virtual GPU."
    )
    open_and_wait(qtbot, window, demo_path)
    assert (window.width(), window.height()) == (1280, 800)
    qtbot.wait(50)
    o = window.options_panel
    for w in (o.ctx, o.batch, o.ubatch, o.ngl, o.type_k, o.type_v, o.slots, o.unified, o.flash, o.mmap):
        assert w.isVisible()
        assert w.height() >= w.sizeHint().height(), f"{w.toolTip()}: {w.height()} < {w.sizeHint().height()}"
        assert o.rect().contains(_rect_in(w, o)), w.toolTip()
    assert o.ngl.text().startswith("all (")
    fm = o.ngl.fontMetrics()
    assert o.ngl.lineEdit().height() >= fm.height(), "the spin box text fits its height"
    panel = window.devices_panel
    for b in (panel.add_button, panel.remove_button, panel.notice):
        assert b.isVisible() and panel.rect().contains(_rect_in(b, panel))
        assert b.height() >= b.minimumSizeHint().height()
    assert panel.view.height() >= panel.view.minimumHeight() > 0


def test_screenshot_at_scale_factor_2_is_drawn_at_twice_the_pixels(tmp_path: Path) -> None:
    shot = tmp_path / "hidpi.png"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "gui"), "QT_QPA_PLATFORM": "offscreen"}
    env["QT_SCALE_FACTOR"] = "2"
    args = ["gui", "--device", "CUDA0=24GiB", "--device", "CUDA1=24GiB", "--screenshot", str(shot)]
    r = subprocess.run(
        [sys.executable, "-m", "offload_planner", *args, "--settings", str(tmp_path / "s.ini")],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    img = QImage(str(shot))
    assert (img.width(), img.height()) == (2560, 1600)
    colours = {img.pixelColor(x, y).name() for x in range(0, 2560, 9) for y in range(0, 1600, 9)}
    assert "#0072b2" in colours and "#e69f00" in colours
    # text drawn at 2x has detail finer than a logical pixel: many 2x2 blocks are not one colour
    # (a 1x rendering scaled up would make every block uniform)
    mixed = total = 0
    for y in range(0, 40, 2):  # the menu and tool bars
        for x in range(0, 1200, 2):
            block = {img.pixel(x + dx, y + dy) for dx in (0, 1) for dy in (0, 1)}
            total += 1
            mixed += len(block) > 1
    assert mixed / total > 0.03, mixed / total
