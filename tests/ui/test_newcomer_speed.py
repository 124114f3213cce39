"""The speed features of issue 11 as a newcomer meets them in the window: a GPU picked from the
catalogue stays that card (named, and with its speeds, in this session and the next), the speed line
names every device a token takes time on, hovering a layer (not only a tensor) previews the move in
bytes and tokens/s, a small speed change is not shown as +0.0, Fastest plan says what it gained and
an Undo says what it undid, and the -ub plot says when its curves are of another plan."""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QDoubleSpinBox
from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.backend.speed_store import plan_speed
from offload_planner.core.device_figures import DeviceFigures
from offload_planner.core.devices import Device
from offload_planner.core.placement import CPU
from offload_planner.core.speed.tps import tps_text
from offload_planner.ui.device_panel import AddGpuDialog
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.memory_view import device_tooltip
from offload_planner.ui.settings import Settings
from offload_planner.ui.speed_bench import SpeedBench

RES = Path(__file__).resolve().parents[2] / "resources"
QWEN = RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf"  # 48 layers, 128 experts


def _add_card(qtbot: QtBot, win: MainWindow, key: str) -> Device:
    dlg = AddGpuDialog(win.doc, 1024**3)
    qtbot.addWidget(dlg)
    dlg.card.setCurrentIndex(dlg.card.findData(key))
    dev = dlg.device()
    assert dev is not None
    info = dlg.card_info.text()
    win.doc.add_device(dev)
    wait_projected(qtbot, win)
    assert "936 GB/s memory, PCIe 4.0 x16, 142 TFLOPS" in info  # the dialog says what the card sets
    return dev


def test_a_gpu_from_the_catalogue_is_named_and_comes_back_as_that_card(
    qtbot: QtBot, settings: Settings
) -> None:
    """Picking an RTX 3090 made a GPU shown as "virtual 24 GiB" (the memory pane and the device
    list said nothing of the card), and the next session restored it without its card: at default
    speeds, so the same plan's estimate changed between sessions without a word."""
    win = make_window(qtbot, settings, system_info(cpu_gib=256))
    try:
        open_and_wait(qtbot, win, QWEN)
        dev = _add_card(qtbot, win, "rtx3090")
        assert dev.description == "RTX 3090, virtual"
        model = win.devices_panel.model
        row = model.row_of(dev.name)
        assert row is not None
        tip = str(model.data(model.index(row, 0), Qt.ItemDataRole.ToolTipRole))
        assert "speeds of the RTX 3090 (catalogue): 936 GB/s memory" in tip
        tg_now = plan_speed(win.doc.plan, probe=False).tg_tps
        win.save_settings()
    finally:
        win.close()
    again = make_window(qtbot, settings, system_info(cpu_gib=256))
    try:
        open_and_wait(qtbot, again, QWEN)
        back = again.doc.plan.devices.by_name(dev.name)
        assert back is not None and back.hardware == (("card", "rtx3090"),)
        assert back.description == "RTX 3090, virtual"
        qtbot.waitUntil(lambda: "936 GB/s (catalogue" in again.speed_label.toolTip())
        assert plan_speed(again.doc.plan, probe=False).tg_tps == tg_now
    finally:
        again.close()


def test_the_speed_line_names_every_device_a_token_takes_time_on(qtbot: QtBot, settings: Settings) -> None:
    """Qwen3-30B whole on an RTX 4090: the CPU still reads a row of the token embeddings per token,
    under 0.5% of the time. The line said "CUDA0 99%" alone (a device below 0.5% was dropped: a GPU
    with a few layers beside experts in RAM vanished from it the same way)."""
    win = make_window(qtbot, settings, system_info("CUDA0=rtx4090", cpu_gib=256))
    try:
        open_and_wait(qtbot, win, QWEN)
        est = plan_speed(win.doc.plan, probe=False, placement=win.doc.placement)
        small = [d for d in est.devices if 0 < d.share < 0.005]
        assert [d.name for d in small] == [CPU]
        qtbot.waitUntil(lambda: "time per token" in win.speed_label.text())
        assert re.search(r"\(time per token: CUDA0\u00a0\d+% · CPU\u00a0<1%\)$", win.speed_label.text())
    finally:
        win.close()


def _demo_with_experts_on_cpu(qtbot: QtBot, win: MainWindow, demo_path: Path) -> None:
    open_and_wait(qtbot, win, demo_path)  # the demo hardware: one 24 GiB GPU, --cpu-moe
    assert win.on_demo_hardware


def test_hovering_a_layer_previews_moving_it_in_bytes_and_tokens_per_second(
    qtbot: QtBot, settings: Settings, demo_path: Path
) -> None:
    """The layer's row header said only where the layer is; the preview was on single cells."""
    win = make_window(qtbot, settings, system_info())
    try:
        _demo_with_experts_on_cpu(qtbot, win, demo_path)
        grid = win.doc.grid
        assert grid is not None
        row = grid.row_of_layer(4)
        assert row is not None
        tip = str(win.map_view.model().headerData(row, Qt.Orientation.Vertical, Qt.ItemDataRole.ToolTipRole))
        assert "Moving the layer would change" in tip
        # to CUDA0: the layer's 6.81 GiB of routed experts leave the CPU, and a token reads less RAM
        m = re.search(r"<b>CUDA0</b></td><td align=right>\+([\d.]+) GiB</td><td>CPU −([\d.]+) GiB</td>"
                      r"<td align=right>([\d.]+) t/s \(\+([\d.]+)%\)", tip)
        assert m, tip
        assert float(m.group(1)) == float(m.group(2)) > 6
        layer = [n for c in range(len(grid.columns)) for n in grid.cell(row, c).movable_names]
        now = plan_speed(win.doc.plan, probe=False).tg_tps
        win.doc.move(layer, "CUDA0")
        then = plan_speed(win.doc.plan, probe=False).tg_tps
        assert float(m.group(3)) == float(f"{then:.3g}")  # three significant figures
        assert abs(float(m.group(4)) - 100 * (then - now) / now) <= 0.05
    finally:
        win.close()


def test_a_small_speed_change_is_not_shown_as_none(qtbot: QtBot, settings: Settings, demo_path: Path) -> None:
    """Moving one routed-expert tensor (1.97 GiB) of DeepSeek-V3 from RAM to the GPU was previewed as
    "0.5 t/s (+0.0)": no change, though the estimate rises by about half a percent."""
    win = make_window(qtbot, settings, system_info())
    try:
        _demo_with_experts_on_cpu(qtbot, win, demo_path)
        grid = win.doc.grid
        assert grid is not None
        row, col = grid.row_of_layer(4), grid.column_index("exps_up")
        assert row is not None and col is not None
        model = win.map_view.model()
        tip = str(model.data(model.index(row, col), Qt.ItemDataRole.ToolTipRole))
        assert "(+0.0)" not in tip
        m = re.search(r"<b>CUDA0</b>.*?([\d.]+) t/s \(\+([\d.]+)%\)", tip)
        assert m, tip
        assert float(m.group(2)) > 0
    finally:
        win.close()


def test_fastest_plan_says_what_it_gained_and_undo_what_it_undid(
    qtbot: QtBot, settings: Settings, demo_path: Path
) -> None:
    """After Undo the status bar went on saying "Fastest plan: 11 tensors moved" under the plan
    it had undone."""
    win = make_window(qtbot, settings, system_info())
    try:
        _demo_with_experts_on_cpu(qtbot, win, demo_path)
        before = plan_speed(win.doc.plan, probe=False)
        assert win.presets_menu.fastest()
        wait_projected(qtbot, win, 120_000)
        after = plan_speed(win.doc.plan, probe=False)
        said = win.statusBar().currentMessage()
        gain = 100 * (after.tg_tps - before.tg_tps) / before.tg_tps
        # written as every rate is (core.speed.tps.tps_text: "14.0", not "14")
        tg, pp = f"{tps_text(before.tg_tps)} → {tps_text(after.tg_tps)}", tps_text(before.pp_tps)
        assert said.startswith(f"Fastest plan: est. tg {tg} t/s (+{gain:.1f}%), pp {pp} → ")
        win.act_undo.trigger()
        assert win.statusBar().currentMessage() == "Undone: Fastest plan"
        win.act_redo.trigger()  # a redo (like any other step) leaves no message of an earlier state
        assert win.statusBar().currentMessage() == ""
    finally:
        win.close()


def test_the_ub_plot_says_when_its_curves_are_of_another_plan(
    qtbot: QtBot, settings: Settings
) -> None:
    """Curves plotted for one placement stayed on screen, unmarked, after any edit; the dotted line
    shows the plan's -ub, and a change of -ub alone (which the sweep sets itself) is not an edit of
    the curves."""
    from offload_planner.ui.ubatch_plot import STALE

    win = make_window(qtbot, settings, system_info("CUDA0=24GiB"))
    try:
        win.resize(1024, 640)
        open_and_wait(qtbot, win, QWEN)
        plot = win.ubatch_plot
        win.tabs.setCurrentWidget(plot)
        plot.button.click()
        qtbot.waitUntil(lambda: bool(plot.points), timeout=120_000)
        fresh = plot.status.text()
        assert not fresh.startswith(STALE)
        assert plot.now_line.value() == math.log10(512)
        win.doc.set_option("context.n_ubatch", 2048, "-ub")
        wait_projected(qtbot, win)
        assert plot.now_line.value() == math.log10(2048) and plot.status.text() == fresh
        win.doc.set_option("context.n_ubatch", 0, "-ub")  # llama.cpp: -ub 0 is -b (2048 here)
        assert plot.now_line.value() == math.log10(2048)
        win.doc.undo_stack.undo()
        experts = [t.name for t in win.doc.plan.model.tensors if t.role.is_routed_expert and t.layer == 3]
        win.doc.move(experts, CPU)
        assert plot.status.text() == STALE + fresh
        win.doc.undo_stack.undo()
        assert plot.status.text() == fresh
        # at 1024 px the line is elided within the tab, whole in its tooltip (it ran off the window)
        qtbot.wait(20)
        assert plot.status.geometry().right() <= plot.width()
        if plot.status.fontMetrics().horizontalAdvance(fresh) > plot.status.width():
            assert fresh in plot.status.toolTip()
    finally:
        win.close()


# --- the Launch tab's Bench: a failed measurement always comes back ------------------------------


@pytest.fixture
def zero_timings_server() -> Iterator[str]:
    """A real HTTP server answering /completion as llama-server does, with timings of 0 (what a
    cached prompt or a proxy gives)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            timings = {"prompt_n": len(body["prompt"]), "prompt_ms": 0, "prompt_per_second": 0,
                       "predicted_n": body["n_predict"], "predicted_ms": 0, "predicted_per_second": 0}
            data = json.dumps({"timings": timings}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    srv = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()
    srv.server_close()


def test_bench_against_timings_of_zero_fails_with_a_message(
    qtbot: QtBot, settings: Settings, zero_timings_server: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Timings of 0 divided the calibration by zero in the worker: no signal came back, so the
    Launch tab kept "Measuring speed…" and its Bench button off for good."""
    monkeypatch.setenv("OFFLOAD_PLANNER_CONFIG_DIR", str(tmp_path / "cfg"))
    win = make_window(qtbot, settings, system_info(cpu_gib=256))
    try:
        open_and_wait(qtbot, win, QWEN)
        button = win.launcher.bench_button  # off until a server listens, and its tooltip says so
        assert not button.isEnabled() and "(after Launch, once the server listens)" in button.toolTip()
        bench = SpeedBench()
        with qtbot.waitSignal(bench.failed, timeout=60_000) as got:
            assert bench.start(zero_timings_server, win.doc.plan)
        assert "'timings' gives prompt_ms = 0, not a measured time or rate" in got.args[0]
        assert not bench.busy
        with qtbot.waitSignal(bench.failed, timeout=60_000) as got:  # any failure: here no plan at all
            assert bench.start(zero_timings_server, None)
        assert got.args[0].startswith("AttributeError: ") and not bench.busy
        bench.shutdown()
    finally:
        win.close()


# --- the device list: edits that would lie ---------------------------------------------------------


def _type_into(qtbot: QtBot, win: MainWindow, row: int, col: int, text: str) -> None:
    """Double-click-edit a cell of the device list as a user does: its editor, the text, Return."""
    view, model = win.devices_panel.view, win.devices_panel.model
    idx = model.index(row, col)
    view.setCurrentIndex(idx)
    view.edit(idx)
    editor = view.focusWidget()
    assert isinstance(editor, QDoubleSpinBox)
    editor.selectAll()
    qtbot.keyClicks(editor, text)
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: view.state() != QAbstractItemView.State.EditingState)
    qtbot.wait(20)  # the commit and its projection request


def test_a_margin_that_leaves_nothing_is_refused_in_the_device_list(
    qtbot: QtBot, settings: Settings, demo_path: Path
) -> None:
    """A 30 GiB margin on a 24 GiB GPU was taken (the bars then said 20.5 GiB over); the command
    line refuses it (--device CUDA0=24GiB,margin=30GiB), the window now does too, and says why."""
    win = make_window(qtbot, settings, system_info())
    try:
        _demo_with_experts_on_cpu(qtbot, win, demo_path)
        steps = win.doc.undo_stack.count()
        _type_into(qtbot, win, 0, 2, "30")  # CUDA0's margin
        assert win.doc.plan.devices.gpus[0].margin == 1024**3 and win.doc.undo_stack.count() == steps
        assert win.statusBar().currentMessage() == (
            "CUDA0: a margin of 30.00 GiB leaves nothing of its 24.00 GiB; the margin is what the plan keeps "
            "free, make it smaller than the size")
        _type_into(qtbot, win, 0, 1, "0.5")  # CUDA0's size, under its 1 GiB margin
        assert win.doc.plan.devices.gpus[0].capacity == 24 * 1024**3
        assert "lower the margin first" in win.statusBar().currentMessage()
        _type_into(qtbot, win, 0, 2, "2")  # a margin below the size is taken
        assert win.doc.plan.devices.gpus[0].margin == 2 * 1024**3
    finally:
        win.close()


def test_the_demo_notice_follows_the_devices(qtbot: QtBot, settings: Settings, demo_path: Path) -> None:
    """The notice went on saying "a 24 GiB GPU, 512 GiB RAM" after RAM was set to 256 GiB and a
    second GPU added."""
    win = make_window(qtbot, settings, system_info())
    try:
        _demo_with_experts_on_cpu(qtbot, win, demo_path)
        notice = win.devices_panel.notice
        assert "a 24 GiB GPU, 512 GiB RAM" in notice.text()
        _type_into(qtbot, win, 1, 1, "256")  # the CPU's size
        assert "a 24 GiB GPU, 256 GiB RAM" in notice.text()
        _add_card(qtbot, win, "rtx3090")
        assert "GPUs of 24 GiB + 24 GiB, 256 GiB RAM" in notice.text() and notice.isVisible()
        qtbot.wait(50)  # laid out: as short as the notice it replaced, the left column does not scroll
        assert not win.left_scroll.verticalScrollBar().isVisible()
        win.doc.undo_stack.undo()
        win.doc.undo_stack.undo()
        assert "a 24 GiB GPU, 512 GiB RAM, experts on the CPU (--cpu-moe)" in notice.text()
    finally:
        win.close()


def test_a_card_declared_on_the_command_line_is_named_in_the_window(qtbot: QtBot, settings: Settings) -> None:
    """`offload-planner gui --device CUDA0=rtx3090`: the memory pane showed CUDA0 with no word of
    the card (a blank where "demo GPU" or "system RAM" stand)."""
    win = make_window(qtbot, settings, system_info("CUDA0=rtx3090", cpu_gib=256))
    try:
        open_and_wait(qtbot, win, QWEN)
        gpu = win.doc.plan.devices.gpus[0]
        assert gpu.description == "RTX 3090, virtual" and gpu.hardware == (("card", "rtx3090"),)
        a = win.doc.analysis
        assert a is not None and a.projection is not None
        assert "<b>CUDA0</b> RTX 3090, virtual" in device_tooltip(a.projection.device("CUDA0"))
    finally:
        win.close()


def test_a_move_preview_says_when_the_move_would_not_fit(
    qtbot: QtBot, settings: Settings, demo_path: Path
) -> None:
    """The preview gave "+6.81 GiB" for a GPU with 4.5 GiB left and no word that it would not fit."""
    win = make_window(qtbot, settings, system_info())
    try:
        _demo_with_experts_on_cpu(qtbot, win, demo_path)
        win.doc.set_device_size("CUDA0", 20 * 1024**3)
        wait_projected(qtbot, win)
        a = win.doc.analysis
        assert a is not None and a.projection is not None
        left = DeviceFigures.of(a.projection.device("CUDA0")).left
        assert left is not None and 0 < left < 6.81 * 1024**3
        grid = win.doc.grid
        assert grid is not None
        row = grid.row_of_layer(4)
        assert row is not None
        tip = str(win.map_view.model().headerData(row, Qt.Orientation.Vertical, Qt.ItemDataRole.ToolTipRole))
        m = re.search(r"<b>CUDA0</b></td><td align=right>\+([\d.]+) GiB<br><span style='color:#D00000'>"
                      r"over by ([\d.]+) GiB</span>", tip)
        assert m, tip
        assert abs(float(m.group(2)) - (float(m.group(1)) - left / 1024**3)) < 0.011
        cpu_row = tip[tip.index("<b>CPU</b>"):]
        assert "over by" not in cpu_row  # the CPU has room for the layer's attention
    finally:
        win.close()


def test_batch_zero_is_refused_when_typed_and_named_when_pasted(qtbot: QtBot, settings: Settings) -> None:
    """Typing 0 in Batch -b was taken (llama.cpp then makes batch and micro-batch 0 tokens) and the
    speed line read "speed estimate unavailable: float division by zero"."""
    win = make_window(qtbot, settings, system_info("CUDA0=24GiB", cpu_gib=256))
    try:
        open_and_wait(qtbot, win, QWEN)
        edit = win.options_panel.batch.lineEdit()
        assert edit is not None
        edit.selectAll()
        qtbot.keyClicks(edit, "0")
        qtbot.keyClick(edit, Qt.Key.Key_Return)
        assert win.doc.plan.context.n_batch == 2048 and win.options_panel.batch.currentText() == "2048"
        assert win.statusBar().currentMessage().startswith("-b 0 is not taken: llama.cpp would make")
        assert win.command_pane.apply_command_text("llama-server -m m.gguf -c 4096 -b 0")
        wait_projected(qtbot, win)
        qtbot.waitUntil(lambda: "-b 0" in win.speed_label.text())
        assert win.speed_label.text().startswith("no speed estimate: -b 0 leaves llama.cpp batches of 0")
        assert "division" not in win.speed_label.text()
    finally:
        win.close()


def test_the_virtual_gpu_dialog_refuses_a_margin_as_large_as_the_memory(
    qtbot: QtBot, settings: Settings
) -> None:
    win = make_window(qtbot, settings, system_info(cpu_gib=256))
    try:
        open_and_wait(qtbot, win, QWEN)
        dlg = AddGpuDialog(win.doc, 1024**3)
        qtbot.addWidget(dlg)
        dlg.size_spin.setValue(8)
        dlg.margin_spin.setValue(8)
        assert dlg.device() is None
        assert dlg.error.text() == "the margin leaves nothing of the memory: make it smaller than the memory"
        dlg.margin_spin.setValue(7.75)
        dev = dlg.device()
        assert dev is not None and dev.margin == int(7.75 * 1024**3)
    finally:
        win.close()


def test_help_names_the_hover_preview_and_the_speed_features(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Help → Keys and mouse said nothing of hovering (the only way to see a move's effect before
    making it), of Fastest plan or of the Speed tab."""
    shown: list[str] = []
    monkeypatch.setattr("offload_planner.ui.main_window.QMessageBox.information",
                        lambda _parent, _title, text: shown.append(text))
    help_menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&Help")
    next(a for a in help_menu.actions() if a.text() == "Keys and mouse").trigger()
    assert len(shown) == 1
    assert "Hover a tensor or a layer number" in shown[0] and "tokens/s" in shown[0]
    assert "Fastest plan" in shown[0] and "Speed tab" in shown[0]


def test_the_card_list_names_each_card_as_the_command_line_does(qtbot: QtBot, settings: Settings) -> None:
    """The window listed "NVIDIA GeForce RTX 3090" where the README and `--device` say rtx3090: a
    newcomer who picked a card in the window could not write the same on the command line."""
    from offload_planner.core.devices import parse_device_decl
    from offload_planner.core.speed.catalogue import card

    win = make_window(qtbot, settings, system_info())
    try:
        open_and_wait(qtbot, win, QWEN)
        dlg = AddGpuDialog(win.doc, 1024**3, win)
        keys = [str(dlg.card.itemData(i)) for i in range(1, dlg.card.count())]
        assert "rtx3090" in keys
        for i, key in enumerate(keys, start=1):
            assert dlg.card.itemText(i).endswith(f" ({key})")
            c = card(key)
            assert c is not None  # what the brackets say is what --device takes
            kind = {"Metal": "Metal", "ROCm": "ROCm"}.get(c.kind, "CUDA")
            parse_device_decl(f"{kind}0={key}" + ("" if c.vram_gib is not None else ",64GiB"))
        dlg.card.setCurrentIndex(dlg.card.findData("rtx3090"))
        assert dlg.size_spin.value() == 24.0
    finally:
        win.close()
