"""A Mac's CPU and Metal GPU share one RAM: a plan where each fits its own size but together they take
more than the RAM is over capacity in the window as in ``offload-planner plan`` (which names the CPU
and exits 3, core.mapped_span.unified_over).  The window said "✔ fits on every device", gave the speed
without "if it fit:", and listed the unified-memory figures as a plain note (newcomer7)."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.core.device_figures import DeviceFigures
from offload_planner.core.mapped_span import unified_over
from offload_planner.core.units import GiB
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.memory_view import OVER_COLOR
from offload_planner.ui.settings import Settings

QWEN = Path(__file__).resolve().parents[2] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf"
# experts of layers 24-47 on the CPU: MTL0 20.4 GiB (its mapped span), the CPU 8.4 GiB, together
# 26.9 GiB (the CPU tensors inside MTL0's span counted once) on a 24 GiB Mac
COMMAND = r"llama-server -c 32768 -ngl 999 -ot 'blk\.(2[4-9]|3[0-9]|4[0-7])\.ffn_.*_exps=CPU'"


def _mac(qtbot: QtBot, settings: Settings, ram_gib: int) -> MainWindow:
    win = make_window(qtbot, settings, system_info("MTL0=m4max,24GiB", cpu_gib=ram_gib))
    open_and_wait(qtbot, win, QWEN)
    assert win.command_pane.apply_command_text(COMMAND)
    wait_projected(qtbot, win)
    return win


def test_a_mac_over_its_ram_is_over_capacity_in_the_window(qtbot: QtBot, settings: Settings) -> None:
    win = _mac(qtbot, settings, 24)
    try:
        a = win.doc.analysis
        assert a is not None and a.projection is not None
        assert all(not DeviceFigures.of(dm).over for dm in a.projection.devices)  # each bar fits
        assert unified_over(a.projection) > 2 * GiB  # plan: "over capacity: CPU (exit status 3)"
        view = win.memory_view
        assert view.verdict() == "✖ over capacity: RAM (CPU + MTL0)"
        assert view.verdict_color() == OVER_COLOR
        assert "CPU + MTL0 share one RAM and together take more than it" in view.next_step()
        assert win.speed_label.text().startswith("if it fit: est. tg ")
        problems = win.problems.problems()
        assert [sev for sev, text in problems if text.startswith("unified memory:")] == ["error"]
        assert win.problems.item(0).text().startswith("unified memory:")  # errors first, above the notes
        assert win.tabs.tabText(1) == "Problems (1)"
    finally:
        win.close()


def test_a_mac_within_its_ram_fits(qtbot: QtBot, settings: Settings) -> None:
    win = _mac(qtbot, settings, 48)
    try:
        a = win.doc.analysis
        assert a is not None and a.projection is not None and unified_over(a.projection) == 0
        assert win.memory_view.verdict() == "✔ fits on every device"
        assert win.speed_label.text().startswith("est. tg ")
        unified = [sev for sev, text in win.problems.problems() if text.startswith("unified memory:")]
        assert all(sev == "note" for sev in unified)
    finally:
        win.close()
