"""The speed line's shares are of a token's time by device; on an rpc-server a small model's token is
almost all the round trip of its graph split, and the line read "(time per token: RPC0 1% · CPU <1%)":
shares summing to 2% with nothing naming the other 98% (plan's table says "graph splits: 1 per token,
0.51 ms", its bottleneck "graph splits (99% ...)").  Named where it takes a tenth of a token or more."""

from __future__ import annotations

import re
from pathlib import Path

from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.backend.speed_store import plan_speed
from offload_planner.ui.settings import Settings


def test_graph_splits_are_named_where_they_take_the_token(
    qtbot: QtBot, settings: Settings, qwen3moe_path: Path, demo_path: Path
) -> None:
    win = make_window(qtbot, settings, system_info(cpu_gib=64))
    try:
        open_and_wait(qtbot, win, qwen3moe_path)
        assert win.command_pane.paste_text("llama-server --rpc 127.0.0.1:1 -ngl 999 -c 512 -np 1 -fit off")
        wait_projected(qtbot, win)
        est = plan_speed(win.doc.plan, probe=False, placement=win.doc.placement)
        splits = est.split_ms * est.tg_tps / 1e3
        assert splits > 0.9 and est.bottleneck.startswith("graph splits")
        qtbot.waitUntil(lambda: "time per token" in win.speed_label.text())
        m = re.search(r"\(time per token: (.*); graph splits\u00a0(\d+)%\)$", win.speed_label.text())
        assert m, win.speed_label.text()
        assert int(m.group(2)) == round(100 * splits)
        assert "RPC0" in m.group(1)
        open_and_wait(qtbot, win, demo_path)  # the demo: its 117 splits are 3% of a token, not named
        qtbot.waitUntil(lambda: "time per token" in win.speed_label.text())
        assert "graph splits" not in win.speed_label.text()
    finally:
        win.close()
