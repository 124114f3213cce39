"""The window names -nkvo's attention on the CPU over the host KV cache where it is the bottleneck:
the speed line under the memory bars and the Speed tab's -ub sweep."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.core.speed.bottleneck import HOST_KV_PART
from offload_planner.ui.settings import Settings

RES = Path(__file__).resolve().parents[2] / "resources"


def test_window_names_the_host_kv_attention(qtbot: QtBot, settings: Settings) -> None:
    win = make_window(qtbot, settings, system_info("CUDA0=rtx4090", cpu_gib=256))
    try:
        open_and_wait(qtbot, win, RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
        doc = win.doc
        ctx = replace(doc.plan.context, n_ctx=8192, n_seq_max=1, kv_unified=False)
        doc.replace_plan(replace(doc.plan, context=ctx), "-c 8192 -np 1")
        wait_projected(qtbot, win)
        qtbot.waitUntil(lambda: win.speed_label.text().startswith("est."))
        assert HOST_KV_PART not in win.speed_label.text()
        # -nkvo without flash attention: the attention of every layer on the CPU
        host = replace(doc.plan.context, offload_kqv=False, flash_attn=False)
        doc.replace_plan(replace(doc.plan, context=host), "-nkvo -fa off")
        qtbot.waitUntil(lambda: HOST_KV_PART in win.speed_label.text(), timeout=20_000)
        assert "-nkvo: 48 GPU layers" in win.speed_label.toolTip()
        plot = win.ubatch_plot
        plot.button.click()
        qtbot.waitUntil(lambda: bool(plot.points), timeout=120_000)
        assert f"(bottleneck: {HOST_KV_PART}" in plot.status.text(), plot.status.text()
    finally:
        win.close()
