"""While a device is over capacity, the Memory pane says under its legend what to do about it (the
pane was red with nothing to act on): for a MoE model's GPUs the Fastest plan preset, for a dense
model fewer GPU layers or Move layers, for RAM too small what would take the CPU's share; once every
device fits, what would make it faster (tests/ui/test_memory_faster.py) instead."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.core.placement import CPU
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.memory_view import next_step_text
from offload_planner.ui.settings import Settings


def _experts_to_cpu(qtbot: QtBot, win: MainWindow) -> None:
    experts = [t.name for t in win.doc.plan.model.tensors if t.role.is_routed_expert]
    win.doc.apply_preset(dict.fromkeys(experts, CPU), "experts to CPU")
    wait_projected(qtbot, win)


def _drawn_inside(qtbot: QtBot, win: MainWindow) -> None:
    view = win.memory_view
    view.repaint()
    r = view.next_step_rect()
    assert r is not None
    legend_top = view.bar_rect(len(view._breakdown_lines()) - 1).bottom()
    assert r.top() > legend_top and r.bottom() <= view.height(), (r, view.height())
    fm = view.fontMetrics()
    assert r.height() >= fm.height() * 2  # wrapped to the pane's width, whole


def test_next_step_for_gpus_over_then_nothing_once_it_fits(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    open_and_wait(qtbot, window, demo_path)  # -ngl 999 on one 24 GiB GPU
    view = window.memory_view
    text = view.next_step()
    assert text.startswith("What next: Presets ▸ Fastest plan puts on CUDA0 ")
    assert "RAM" not in text
    _drawn_inside(qtbot, window)
    _experts_to_cpu(qtbot, window)  # 367 GiB of experts in 512 GiB of RAM: fits
    qtbot.wait(20)  # the speed line's coalesced refresh: what would make it faster (test_memory_faster)
    view.repaint()
    assert "What next" not in view.next_step() and view.next_step().startswith("Faster, with Presets ▸ ")
    assert ". Also: CUDA0's 8.5 GiB left can take routed experts" in view.next_step()  # the moves hold them


def test_next_step_when_ram_is_too_small(qtbot: QtBot, settings: Settings, demo_path: Path) -> None:
    win = make_window(qtbot, settings, system_info("CUDA0=24GiB", cpu_gib=64))
    try:
        open_and_wait(qtbot, win, demo_path)
        _experts_to_cpu(qtbot, win)  # 367 GiB of experts in 64 GiB of RAM
        text = win.memory_view.next_step()
        assert "The CPU's share is more than its RAM" in text and "Fastest plan" not in text
        _drawn_inside(qtbot, win)
    finally:
        win.close()


def test_next_step_for_a_dense_model_names_what_frees_the_gpu() -> None:
    text = next_step_text(["CUDA0", "CUDA1"], False, moe=False)
    assert "Fastest plan" not in text  # the preset is for MoE models only
    assert "GPU layers" in text and "Move layers" in text and text.endswith("free CUDA0, CUDA1.")
    assert next_step_text([], False, moe=True) == ""


def test_a_short_pane_cuts_the_next_step_at_a_word_and_hover_gives_it_whole(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    from PySide6.QtCore import QEvent, QPoint
    from PySide6.QtGui import QHelpEvent
    from PySide6.QtWidgets import QApplication, QToolTip

    window.resize(1024, 640)  # the smallest window
    open_and_wait(qtbot, window, demo_path)
    view = window.memory_view
    window.h_split.setSizes([270, 2000, 10])  # the memory pane as narrow as it goes: more lines
    qtbot.wait(50)
    view.repaint()
    whole = view.next_step()
    shown = view.next_step_shown()
    r = view.next_step_rect()
    assert whole and r is not None and r.bottom() <= view.height() - 4, (r, view.height())
    assert shown.endswith(" …") and whole.startswith(shown[:-2])  # cut at a word, not mid-line
    QToolTip.hideText()
    pos = QPoint(int(r.left()) + 4, int(r.top()) + 4)
    QApplication.sendEvent(view, QHelpEvent(QEvent.Type.ToolTip, pos, view.mapToGlobal(pos)))
    qtbot.waitUntil(QToolTip.isVisible)
    assert QToolTip.text() == whole


def test_next_step_on_a_mac_where_nothing_fits_suggests_no_preset(
    qtbot: QtBot, settings: Settings, demo_path: Path
) -> None:
    """DeepSeek-V3 (379 GiB with its context) on a 64 GiB Mac: what leaves MTL0 lands in the same RAM,
    so no placement fits; the hint suggested Fastest plan. It now says what helps instead."""
    win = make_window(qtbot, settings, system_info("MTL0=m2max,64GiB", cpu_gib=64))
    try:
        open_and_wait(qtbot, win, demo_path)
        text = win.memory_view.next_step()
        assert text.startswith("What next: no placement fits: CPU + MTL0 share one RAM and together take "
                               "more than it, by 315.4 GiB wherever the tensors go"), text
        assert "Fastest plan or moving layers cannot help" in text and "Presets ▸" not in text
        assert "smaller quant" in text and "smaller context" in text and "more memory" in text
        _drawn_inside(qtbot, win)
        assert win.command_pane.apply_command_text("llama-server -m x.gguf -c 4096 -ngl 0")  # all on the CPU
        wait_projected(qtbot, win)
        assert win.memory_view.next_step().startswith("What next: no placement fits: CPU + MTL0 share")
    finally:
        win.close()


def test_next_step_on_a_mac_whose_ram_takes_the_experts_keeps_fastest(
    qtbot: QtBot, settings: Settings, demo_path: Path
) -> None:
    """A 192 GiB MTL0 in 512 GiB of RAM: the experts fit beside it, Fastest plan is the way out."""
    win = make_window(qtbot, settings, system_info("MTL0=m2max,192GiB", cpu_gib=512))
    try:
        open_and_wait(qtbot, win, demo_path)
        assert win.memory_view.next_step().startswith("What next: Presets ▸ Fastest plan puts on MTL0 ")
    finally:
        win.close()
