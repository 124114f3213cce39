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


def test_the_demo_notice_says_what_its_speeds_rest_on(qtbot: QtBot, settings: Settings, demo_path: Path,
                                                      qwen3moe_path: Path) -> None:
    """On the demo the notice's tooltip was this machine's "No GPU detected: ..." alone: nothing said
    that the demo's GPU, declared by its size, is priced at default figures, nor how to plan for other
    devices. It says both, and this machine's detection after them; off the demo it is that alone."""
    win = make_window(qtbot, settings, system_info())
    notice = win.devices_panel.notice
    no_gpu = notice.toolTip()
    assert no_gpu.startswith("No GPU detected: no NVIDIA driver found")
    open_and_wait(qtbot, win, demo_path)
    tip = notice.toolTip()
    assert "<code>--device CUDA0=24GiB --device CPU=512GiB,ram=8xDDR5-4800</code>" in tip
    assert "default figures (500 GB/s, 50 TFLOPS)" in tip and "+ Virtual GPU…" in tip
    assert tip.endswith(f"<p>This machine: {no_gpu}</p>")
    open_and_wait(qtbot, win, qwen3moe_path)
    assert notice.toolTip() == no_gpu
    win.close()
