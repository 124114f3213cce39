"""Without a detected GPU the Devices notice says what the plan is for: the GPUs declared (--device,
+ Virtual GPU…) or the CPU alone, following the list as GPUs are added and removed.  It said only
"No GPU detected: no NVIDIA driver found." beside a list of declared GPUs the plan put layers on
(newcomer7)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.core.units import GiB
from offload_planner.ui.main_window import DEMO_NOTICE, MainWindow
from offload_planner.ui.settings import Settings

WHY = "No GPU detected (no NVIDIA driver found): "


def test_the_notice_names_the_declared_gpus(qtbot: QtBot, window: MainWindow, qwen3moe_path: Path) -> None:
    notice = window.devices_panel.notice
    assert notice.text() == WHY + "planning for the declared CUDA0."  # before any model
    open_and_wait(qtbot, window, qwen3moe_path)
    assert notice.text() == WHY + "planning for the declared CUDA0." and notice.isVisibleTo(window)
    window.doc.add_device(replace(window.doc.plan.devices.gpus[0], name="CUDA1", total=12 * GiB))
    wait_projected(qtbot, window)
    assert notice.text() == WHY + "planning for the declared CUDA0, CUDA1."
    window.doc.remove_device("CUDA0")
    window.doc.remove_device("CUDA1")
    wait_projected(qtbot, window)
    assert notice.text() == WHY + "planning for the CPU alone."
    window.doc.undo_stack.undo()
    wait_projected(qtbot, window)
    assert notice.text() == WHY + "planning for the declared CUDA1."


def test_no_gpu_at_all_and_the_demo(qtbot: QtBot, settings: Settings, demo_path: Path) -> None:
    win = make_window(qtbot, settings, system_info())
    assert win.devices_panel.notice.text() == WHY + "planning for the CPU alone."
    open_and_wait(qtbot, win, demo_path)  # the demo plans for its own declared hardware, and says so
    assert win.devices_panel.notice.text() == DEMO_NOTICE
    win.close()
