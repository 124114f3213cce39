"""The speed estimate in the window: a line under the memory bars that follows every edit, and the
"Fastest plan" preset as one undo step that keeps the user's moves and fits the GPU."""

from __future__ import annotations

import re
from pathlib import Path

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.core.placement import CPU
from offload_planner.core.tensor_grid import Cell
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.rates import change_text, rate_text
from offload_planner.ui.settings import Settings
from offload_planner.ui.ubatch_plot import UbatchPlot

LABEL = re.compile(r"est\. tg ([\d.]+) t/s · pp ([\d.]+) t/s \((.*)\)")
RES = Path(__file__).resolve().parents[2] / "resources"


def test_label_follows_every_edit(qtbot: QtBot, settings: Settings) -> None:
    win = make_window(qtbot, settings, system_info("CUDA0=rtx4090", cpu_gib=256))
    try:
        open_and_wait(qtbot, win, RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
        doc = win.doc
        experts = [t.name for t in doc.plan.model.tensors if t.role.is_routed_expert]
        first = win.speed_label.text()  # "CPU <1%" already: the CPU holds the embeddings
        doc.apply_preset(dict.fromkeys(experts, CPU), "experts to CPU")
        qtbot.waitUntil(lambda: "CPU" in win.speed_label.text() and win.speed_label.text() != first)
        m = LABEL.fullmatch(win.speed_label.text())
        assert m, win.speed_label.text()
        tg_cpu = float(m.group(1))
        assert "CUDA0" in m.group(3) and "CPU" in m.group(3)
        assert "assumptions" in win.speed_label.toolTip()
        doc.undo_stack.undo()  # experts back on the 24 GiB GPU: every token reads only VRAM
        qtbot.waitUntil(lambda: "CPU" not in win.speed_label.text() or win.speed_label.text() != m.group(0))
        m2 = LABEL.fullmatch(win.speed_label.text())
        assert m2 and float(m2.group(1)) > 2 * tg_cpu
    finally:
        win.close()


def test_fastest_plan_preset_is_one_undo_step(qtbot: QtBot, settings: Settings) -> None:
    win = make_window(qtbot, settings, system_info("CUDA0=12GiB,bw=936GB/s", cpu_gib=256))
    try:
        open_and_wait(qtbot, win, RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
        doc = win.doc
        pinned = {t.name: CPU for t in doc.plan.model.tensors if t.layer == 2 and t.role.is_routed_expert}
        doc.apply_preset(pinned, "pin layer 2")
        wait_projected(qtbot, win)
        before = doc.plan
        steps = doc.undo_stack.count()
        assert win.presets_menu.fastest()
        assert doc.undo_stack.count() == steps + 1
        after = doc.plan
        devs = after.placement().tensor_devices()
        assert {devs[n] for n in pinned} == {CPU}
        gpu = after.devices.gpus[0]
        margin = gpu.margin or 1024**3
        assert after.projection().device("CUDA0").resident() + margin <= (gpu.capacity or 0)
        doc.undo_stack.undo()
        assert doc.plan == before
    finally:
        win.close()


def test_fastest_plan_quantizes_the_kv_cache_only_when_checked(qtbot: QtBot, settings: Settings) -> None:
    from dataclasses import replace

    win = make_window(qtbot, settings, system_info("CUDA0=12GiB,bw=936GB/s", cpu_gib=256))
    try:
        open_and_wait(qtbot, win, RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
        doc = win.doc
        ctx = replace(doc.plan.context, n_ctx=40960, n_seq_max=1, kv_unified=False)
        doc.replace_plan(replace(doc.plan, context=ctx), "-c 40960 -np 1")
        wait_projected(qtbot, win)
        menu = win.presets_menu
        menu._build()
        [box] = [a for a in menu.actions() if "(q8_0)" in a.text()]  # the -nkvo option names the KV cache too
        assert box.isCheckable() and not box.isChecked()
        assert menu.fastest()
        assert (doc.plan.context.type_k, doc.plan.context.type_v) == ("f16", "f16")
        doc.undo_stack.undo()
        messages: list[str] = []
        menu.message.connect(messages.append)
        box.trigger()
        assert menu.allow_kv_quant
        assert menu.fastest()
        assert (doc.plan.context.type_k, doc.plan.context.type_v) == ("q8_0", "q8_0")
        assert "KV cache q8_0/q8_0" in messages[-1]
        menu._build()  # the menu is rebuilt when shown: the box stays checked
        assert next(a for a in menu.actions() if "(q8_0)" in a.text()).isChecked()
    finally:
        win.close()


def test_fastest_plan_keeps_the_kv_cache_in_ram_only_when_checked(qtbot: QtBot, settings: Settings) -> None:
    """`fit --allow-nkvo` had no counterpart in the window: Qwen3-30B with a 131072-token f16 cache
    on one 8 GiB card does not fit even with every routed expert on the CPU, and Fastest plan said
    "Nothing fits". With the box checked it puts the cache in RAM (-nkvo), one undo step, and the
    card fits by the plan's own projection; the box stays checked when the menu is rebuilt."""
    win = make_window(qtbot, settings, system_info("CUDA0=8GiB,bw=936GB/s", cpu_gib=256))
    try:
        open_and_wait(qtbot, win, RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
        doc = win.doc
        assert win.command_pane.apply_command_text("llama-server -m x.gguf -c 131072")
        wait_projected(qtbot, win)
        menu = win.presets_menu
        menu._build()
        [box] = [a for a in menu.actions() if "-nkvo" in a.text()]
        assert box.isCheckable() and not box.isChecked()
        messages: list[str] = []
        menu.message.connect(messages.append)
        before, steps = doc.plan, doc.undo_stack.count()
        assert not menu.fastest()
        assert doc.plan == before and messages[-1].startswith("Nothing fits these devices")
        box.trigger()
        assert menu.allow_nkvo
        assert menu.fastest()
        assert doc.undo_stack.count() == steps + 1
        assert before.context.offload_kqv and not doc.plan.context.offload_kqv
        assert "KV cache in RAM (-nkvo)" in messages[-1]
        gpu = doc.plan.devices.gpus[0]
        fresh = doc.plan.projection().device("CUDA0")
        assert fresh.resident() + (gpu.margin or 1024**3) <= (gpu.capacity or 0)
        assert not any(b.kind == "kv" for b in fresh.buffers)
        qtbot.waitUntil(lambda: "-nkvo" in win.command_pane.text.toPlainText())
        doc.undo_stack.undo()
        assert doc.plan == before
        menu._build()  # the menu is rebuilt when shown: the box stays checked
        assert next(a for a in menu.actions() if "-nkvo" in a.text()).isChecked()
    finally:
        win.close()


def test_fastest_plan_says_the_users_ot_rule_holds_the_experts(qtbot: QtBot, settings: Settings) -> None:
    win = make_window(qtbot, settings, system_info("CUDA0=80GiB,bw=2000GB/s", cpu_gib=256))
    try:
        open_and_wait(qtbot, win, RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
        messages: list[str] = []
        win.presets_menu.message.connect(messages.append)
        assert win.command_pane.apply_command_text("llama-server -m x.gguf -c 4096 -ot exps=CPU")
        wait_projected(qtbot, win)
        win.presets_menu.fastest()
        n_experts = sum(t.role.is_routed_expert for t in win.doc.plan.model.tensors)
        assert messages, "the preset says what it did"
        assert f"{n_experts} routed-expert tensors stay on CPU by the command's -ot rules" in messages[-1]
        devs = win.doc.plan.placement().tensor_devices()
        assert {devs[t.name] for t in win.doc.plan.model.tensors if t.role.is_routed_expert} == {CPU}
    finally:
        win.close()


def test_virtual_gpu_from_the_catalogue(qtbot: QtBot, settings: Settings) -> None:
    from offload_planner.ui.device_panel import AddGpuDialog

    win = make_window(qtbot, settings, system_info(cpu_gib=256))
    try:
        open_and_wait(qtbot, win, RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
        dlg = AddGpuDialog(win.doc, 1024**3)
        qtbot.addWidget(dlg)
        dlg.card.setCurrentIndex(dlg.card.findData("rtx3090"))
        assert dlg.size_spin.value() == 24.0
        dev = dlg.device()
        assert dev is not None and dev.hardware == (("card", "rtx3090"),)
        win.doc.add_device(dev)
        qtbot.waitUntil(lambda: "CUDA0" in win.speed_label.text())
        assert "936 GB/s (catalogue" in win.speed_label.toolTip()
    finally:
        win.close()


def _exps_down(win: MainWindow, layer: int) -> Cell:
    """The tensor map's cell of a layer's routed ``ffn_down_exps``."""
    grid = win.doc.grid
    assert grid is not None
    row, col = grid.row_of_layer(layer), grid.column_index("exps_down")
    assert row is not None and col is not None
    return grid.cell(row, col)


def test_hover_preview_gives_the_tg_the_move_would_give(qtbot: QtBot, settings: Settings) -> None:
    from offload_planner.backend.speed_store import machine_hardware
    from offload_planner.core.speed.estimate import tg_tps
    from offload_planner.ui.tensor_map_model import move_preview_html, move_tg

    win = make_window(qtbot, settings, system_info("CUDA0=rtx4090", cpu_gib=256))
    try:
        open_and_wait(qtbot, win, RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
        doc = win.doc
        cell = _exps_down(win, 7)
        names = cell.movable_names
        preview = move_tg(doc.plan, names)
        now, to_cpu = preview[CPU]
        assert to_cpu < now and preview["CUDA0"][1] == now  # already there
        assert f"{rate_text(to_cpu)} t/s ({change_text(now, to_cpu)})" in move_preview_html(doc.plan, cell)
        doc.move(names, CPU)
        assert tg_tps(doc.plan, machine_hardware(doc.plan, probe=False)) == to_cpu
    finally:
        win.close()


def _ubatch_sweep_with_experts_on_cpu(qtbot: QtBot, win: MainWindow) -> UbatchPlot:
    """Qwen3-30B with its routed experts on the CPU, the Speed tab's -ub sweep run to its points."""
    open_and_wait(qtbot, win, RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
    experts = [t.name for t in win.doc.plan.model.tensors if t.role.is_routed_expert]
    win.doc.apply_preset(dict.fromkeys(experts, CPU), "experts to CPU")
    plot = win.ubatch_plot
    plot.button.click()
    qtbot.waitUntil(lambda: bool(plot.points), timeout=120_000)
    return plot


def test_ubatch_plot_shows_the_tradeoff(qtbot: QtBot, settings: Settings) -> None:
    win = make_window(qtbot, settings, system_info("CUDA0=rtx3090", cpu_gib=256))
    try:
        plot = _ubatch_sweep_with_experts_on_cpu(qtbot, win)
        pts = plot.points
        assert [p.n_ubatch for p in pts] == [64, 128, 256, 512, 1024, 2048, 4096]
        pp = [p.pp_tps for p in pts]
        assert pp == sorted(pp) and pp[-1] > 3 * pp[0]  # op offload: copies shared by more tokens
        buf = [p.gpu_compute_bytes for p in pts]
        assert buf[-1] > buf[0]  # a larger micro-batch needs a larger compute buffer
        assert plot.pp_curve.yData is not None and len(plot.pp_curve.yData) == 7
        assert "fastest prompt processing that fits at -ub 4096" in plot.status.text()
        assert all(p.fits for p in pts) and "does not fit" not in plot.status.text()
    finally:
        win.close()


def test_label_shows_mtp_speculation_beside_the_plain_figure(qtbot: QtBot, settings: Settings,
                                                              small_models: dict[str, Path]) -> None:
    """With --spec-type draft-mtp the line gives tg with MTP and the figure without it, as the
    estimate computes them (core tests check those against the model's bytes)."""
    win = make_window(qtbot, settings, system_info("CUDA0=rtx4090", cpu_gib=64))
    try:
        open_and_wait(qtbot, win, small_models["glm4moe"])
        qtbot.waitUntil(lambda: "CUDA0" in win.speed_label.text() or "CPU" in win.speed_label.text())
        assert "with MTP" not in win.speed_label.text()
        assert win.command_pane.apply_command_text("llama-server -m m.gguf -c 2048 --spec-type draft-mtp")
        wait_projected(qtbot, win)
        qtbot.waitUntil(lambda: "with MTP" in win.speed_label.text())
        m = re.fullmatch(r"est\. tg ([\d.]+) t/s with MTP \(([\d.]+) without\) · pp ([\d.]+) t/s \((.*)\)",
                         win.speed_label.text())
        assert m, win.speed_label.text()
        assert "speculative decoding, MTP (1 NextN layer): 3 tokens drafted" in win.speed_label.toolTip()
        assert "pull/25980" in win.speed_label.toolTip()
    finally:
        win.close()


def test_hover_preview_with_mtp_gives_the_speed_lines_tg(qtbot: QtBot, settings: Settings,
                                                         small_models: dict[str, Path]) -> None:
    """With MTP the hover preview's tg is the speed line's (with MTP, depth 0): now, and after the
    move it previews (it had given the plain tg, without speculation)."""
    from offload_planner.backend.speed_store import plan_speed
    from offload_planner.ui.tensor_map_model import move_preview_html, move_tg

    win = make_window(qtbot, settings, system_info("CUDA0=rtx4090", cpu_gib=64))
    try:
        open_and_wait(qtbot, win, small_models["glm4moe"])
        assert win.command_pane.apply_command_text("llama-server -m m.gguf -c 2048 --spec-type draft-mtp")
        wait_projected(qtbot, win)
        qtbot.waitUntil(lambda: "with MTP" in win.speed_label.text())
        doc = win.doc
        cell = _exps_down(win, 2)
        names = cell.movable_names
        now, to_cpu = move_tg(doc.plan, names)[CPU]
        shown = plan_speed(doc.plan, probe=False, placement=doc.placement)
        assert shown.spec is not None and now == shown.tg_tps != shown.spec.tg_tps_plain
        m = re.match(r"est\. tg ([\d.]+) t/s with MTP", win.speed_label.text())
        assert m and abs(float(m.group(1)) - now) <= (0.5 if now >= 100 else 0.05)  # as the line rounds
        html = move_preview_html(doc.plan, cell)
        assert f"{rate_text(to_cpu)} t/s ({change_text(now, to_cpu)})" in html
        assert "est. tg at depth 0, with MTP" in html
        doc.move(names, CPU)
        assert plan_speed(doc.plan, probe=False).tg_tps == to_cpu
    finally:
        win.close()


def test_ubatch_plot_names_the_fastest_ub_that_fits(qtbot: QtBot, settings: Settings) -> None:
    """A GPU that holds the plan at -ub 2048 but not the larger compute buffer of -ub 4096: the tab
    names -ub 2048 and says 4096 would be faster but does not fit.  The window's plan (-c 32768,
    experts on the CPU) puts 4.28 GiB on CUDA0 at -ub 2048 and 4.7 at 4096; with the 1 GiB margin
    5.5 GiB holds the first only."""
    win = make_window(qtbot, settings, system_info("CUDA0=5.5GiB", cpu_gib=256))
    try:
        plot = _ubatch_sweep_with_experts_on_cpu(qtbot, win)
        by_ub = {p.n_ubatch: p for p in plot.points}
        assert by_ub[2048].fits and by_ub[4096].over == ("CUDA0",)
        assert by_ub[4096].pp_tps > by_ub[2048].pp_tps
        text = plot.status.text()
        assert text.startswith("fastest prompt processing that fits at -ub 2048: "), text
        assert "-ub 4096 would give" in text and "does not fit: CUDA0 cannot hold" in text
        brushes = plot.pp_curve.opts["symbolBrush"]  # the point that does not fit is drawn hollow
        assert brushes[-1].style() == Qt.BrushStyle.NoBrush and brushes[-2].style() != Qt.BrushStyle.NoBrush
    finally:
        win.close()


def test_a_slow_declared_gpu_reads_as_the_command_line_writes_it(qtbot: QtBot, settings: Settings) -> None:
    """A GPU declared at 1 MB/s (`bw=0.001GB/s`): the speed line gives the same figures as `plan`
    prints for the same command (0.000391 t/s, not 3.91e-07 or 0.0), and the Speed tab's -ub sweep
    names its fastest pp in significant figures (it wrote "0 t/s")."""
    from tests.test_cli_plan_input import run

    win = make_window(qtbot, settings, system_info("CUDA0=24GiB,bw=0.001GB/s", cpu_gib=256))
    try:
        open_and_wait(qtbot, win, RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
        assert win.command_pane.apply_command_text("llama-server -m x.gguf -ngl 99 -c 4096")
        wait_projected(qtbot, win)
        qtbot.waitUntil(lambda: "CUDA0\u00a0100%" in win.speed_label.text())
        m = LABEL.fullmatch(win.speed_label.text())
        assert m, win.speed_label.text()
        cli = run("plan", str(RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf"), "--no-detect", "--device",
                  "CUDA0=24GiB,bw=0.001GB/s", "--device", "CPU=256GiB", "--", "-ngl", "99", "-c", "4096")
        line = re.search(r"tg (\S+) t/s at depth 0, \S+ t/s at 4096 tokens; pp (\S+) t/s", cli.stdout)
        assert line, cli.stdout + cli.stderr
        assert (m.group(1), m.group(2)) == line.groups()
        assert float(m.group(1)) < 0.001 and "e-" not in m.group(0)
        plot = win.ubatch_plot
        plot.button.click()
        qtbot.waitUntil(lambda: bool(plot.points), timeout=120_000)
        best = max(p.pp_tps for p in plot.points if p.fits)
        assert best < 1 and f": {rate_text(best)} t/s," in plot.status.text(), plot.status.text()
    finally:
        win.close()
