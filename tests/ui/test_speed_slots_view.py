"""The speed tooltip carries the all-slots line of the plan's speed block (-np N > 1) and drops it with
one slot."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait

from offload_planner.ui.settings import Settings

RES = Path(__file__).resolve().parents[2] / "resources"


def test_tooltip_says_all_slots_generating(qtbot: QtBot, settings: Settings) -> None:
    win = make_window(qtbot, settings, system_info("CUDA0=rtx4090", cpu_gib=256))
    try:
        open_and_wait(qtbot, win, RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
        doc = win.doc
        assert doc.plan.context.n_seq_max == 4  # the pinned server's -np auto
        qtbot.waitUntil(lambda: "all 4 slots generating: " in win.speed_label.toolTip(), timeout=30_000)
        assert "t/s in total at depth 0" in win.speed_label.toolTip()
        doc.set_option("context.n_seq_max", 1, "-np")
        qtbot.waitUntil(lambda: "slots generating" not in win.speed_label.toolTip(), timeout=30_000)
        assert "assumptions" in win.speed_label.toolTip()
    finally:
        win.close()
