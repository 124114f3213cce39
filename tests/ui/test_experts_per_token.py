"""Options ▸ Experts/token (LM Studio's "Number of experts"): the routed experts each token runs, set on
a MoE model as llama.cpp takes it, ``--override-kv <arch>.expert_used_count=int:N`` in the command, the
speed line and the compute buffers following it; one undo step; the file's own count takes the flag
out again; a dense model has no such row."""

from __future__ import annotations

import re
from pathlib import Path

from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.settings import Settings

FLAG = "deepseek2.expert_used_count=int:4"


def _tg(win: MainWindow) -> float:
    m = re.search(r"est\. tg ([0-9.]+) t/s", win.speed_label.text())
    assert m, win.speed_label.text()
    return float(m.group(1))


def _set(qtbot: QtBot, win: MainWindow, n: int) -> None:
    win.options_panel.experts.setValue(n)
    wait_projected(qtbot, win)
    qtbot.waitUntil(lambda: "est. tg" in win.speed_label.text(), timeout=30_000)


def test_fewer_experts_a_token_from_options(qtbot: QtBot, settings: Settings, demo_path: Path) -> None:
    win = make_window(qtbot, settings, system_info())
    try:
        open_and_wait(qtbot, win, demo_path)
        wait_projected(qtbot, win)
        box = win.options_panel.experts
        assert box.isVisible() and box.value() == 8 and box.maximum() == 256 and box.text() == "8/256"
        qtbot.waitUntil(lambda: "est. tg" in win.speed_label.text(), timeout=30_000)
        tg8 = _tg(win)
        assert "--override-kv" not in win.command_pane.argv()
        _set(qtbot, win, 4)
        argv = win.command_pane.argv()
        assert argv[argv.index("--override-kv") + 1] == FLAG
        assert win.doc.plan.model.summary.n_expert_used == 4
        assert _tg(win) > 1.3 * tg8  # the CPU holds the experts: it reads half of them a token
        win.act_undo.trigger()  # one step back: the file's 8 and no flag
        wait_projected(qtbot, win)
        assert box.value() == 8 and "--override-kv" not in win.command_pane.argv()
        win.act_redo.trigger()
        wait_projected(qtbot, win)
        assert box.value() == 4
        _set(qtbot, win, 8)  # the file's own count: the flag goes, not "=int:8"
        assert "--override-kv" not in win.command_pane.argv()
    finally:
        win.close()


def test_a_dense_model_has_no_experts_row(qtbot: QtBot, settings: Settings,
                                           small_models: dict[str, Path]) -> None:
    win = make_window(qtbot, settings, system_info())
    try:
        open_and_wait(qtbot, win, small_models["llama"])
        assert not win.options_panel.experts.isVisible()
        open_and_wait(qtbot, win, small_models["qwen3moe"])
        assert win.options_panel.experts.isVisible() and win.options_panel.experts.text() == "2/8"
    finally:
        win.close()
