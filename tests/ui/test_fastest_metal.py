"""The window's Fastest plan on a Mac whose MTL0 cannot hold the file span mmap maps for it.

With mmap Metal maps the file span from the first to the last of MTL0's tensors (MTL0_Mapped): with every
routed expert on the CPU, Qwen3-30B-A3B's span still runs from blk.0 to output.weight, 17.11 GiB, so on a
12 GiB MTL0 the search found nothing. It now also tries the command without mmap (-lm none), where MTL0
holds only its tensors, and says so when it takes that."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.core.device_figures import DeviceFigures
from offload_planner.ui.settings import Settings

QWEN = Path(__file__).resolve().parents[2] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf"


def test_fastest_on_a_12_gib_mac_loads_without_mmap_and_says_why(qtbot: QtBot, settings: Settings) -> None:
    win = make_window(qtbot, settings, system_info("MTL0=m2max,12GiB", cpu_gib=32))
    try:
        open_and_wait(qtbot, win, QWEN)
        assert win.doc.plan.placement_options.use_mmap
        messages: list[str] = []
        win.presets_menu.message.connect(messages.append)
        assert win.presets_menu.fastest(), messages
        wait_projected(qtbot, win, 120_000)
        assert ", loaded without mmap (-lm none): MTL0 then holds only its tensors" in messages[-1], messages
        plan = win.doc.plan
        assert not plan.placement_options.use_mmap
        a = win.doc.analysis
        assert a is not None and a.projection is not None
        mtl0 = a.projection.device("MTL0")
        assert [b.name for b in mtl0.buffers if b.kind == "model"] == ["MTL0"]  # a copy, not the span
        assert DeviceFigures.of(mtl0).over == 0
        assert "-lm none" in win.command_pane.text.toPlainText()
    finally:
        win.close()


def test_fill_moves_nothing_when_the_mapped_span_keeps_mtl0_over(qtbot: QtBot, settings: Settings) -> None:
    """On MTL0 with mmap the span of its attention tensors (blk.0 to output.weight, the experts between)
    keeps it over whatever Fill moves. Fill sent every expert to the CPU and left a plan still over (and
    slower); it now moves nothing, and says why: the span, and the way out."""
    from offload_planner.core.units import GiB

    win = make_window(qtbot, settings, system_info("MTL0=m2max,12GiB", cpu_gib=32))
    try:
        open_and_wait(qtbot, win, QWEN)
        before = win.doc.plan
        messages: list[str] = []
        win.presets_menu.message.connect(messages.append)
        assert not win.presets_menu.fill("MTL0", from_first=True)
        assert win.doc.plan is before and win.doc.undo_stack.count() == 0
        mapped = [b for b in before.projection().device("MTL0").buffers if b.name == "MTL0_Mapped"]
        assert f"{sum(b.bytes for b in mapped) / GiB:.2f}" == "17.11"  # blk.0's first byte to output's end
        assert messages[-1] == (
            "Fill moved nothing: MTL0 stays over whatever routed experts it moves: with mmap it maps the "
            "17.11 GiB file span from its first tensor to its last, and experts inside the span of its other "
            "tensors free nothing when moved off; without mmap (-lm none) it holds only its tensors (Fastest "
            "plan tries both)"), messages
    finally:
        win.close()


def test_fill_takes_the_experts_the_span_holds_anyway(qtbot: QtBot, settings: Settings) -> None:
    """--cpu-moe on a 20 GiB MTL0 with mmap: MTL0 maps blk.0 to output.weight, every expert inside. Fill
    took 5 layers' experts by their sizes (the room besides the span); they cost nothing there, and it now
    takes all 48 with MTL0's bytes not growing, and the plan fits."""
    win = make_window(qtbot, settings, system_info("MTL0=m2max,20GiB", cpu_gib=32))
    try:
        open_and_wait(qtbot, win, QWEN)
        assert win.command_pane.apply_command_text("llama-server -m x.gguf -c 8192 -ngl 999 --cpu-moe")
        wait_projected(qtbot, win, 120_000)
        used = DeviceFigures.of(win.doc.plan.projection().device("MTL0")).used
        messages: list[str] = []
        win.presets_menu.message.connect(messages.append)
        assert win.presets_menu.fill("MTL0", from_first=True)
        wait_projected(qtbot, win, 120_000)
        assert messages[-1] == "MTL0 holds the routed experts of 48 layers (0-47)", messages
        after = DeviceFigures.of(win.doc.plan.projection().device("MTL0"))
        assert after.over == 0 and after.used <= used
    finally:
        win.close()


def test_the_windows_fastest_plan_is_the_clis_top_layers_on_a_mac(qtbot: QtBot, tmp_path: Path) -> None:
    """A dense 70B (header-only, 39.6 GiB) on a Mac whose MTL0 takes 36 GiB: with every layer on MTL0 it
    is over with mmap and without (-lm none), and a dense model has no experts to leave on the CPU; the
    most layers from the top that fit (-ngl N with mmap: the last layers and the output lie together at
    the file's end, so MTL0's mapped span is only its tensors) is `fit`'s answer.  The window's Fastest
    plan lacked that candidate (its search from an open plan could make no -ngl variant) and said nothing
    fits; it now runs the same candidate and answers with `fit`'s command for the window's own command."""
    import json
    import os
    import re
    import subprocess
    import sys

    from offload_planner.core.devices import parse_device_decl
    from offload_planner.core.synth import BIG_MODELS, write_model
    from offload_planner.ui.main_window import SystemInfo

    devices = ["MTL0=m2max,36GiB", "CPU=64GiB,bw=100GB/s"]
    model = write_model(BIG_MODELS["Llama-3.1-70B-Q4_K_M"], tmp_path / "llama70.gguf", header_only=True)[0]
    win = make_window(qtbot, Settings.at(str(tmp_path / "s.ini")),
                      SystemInfo.probe([parse_device_decl(d) for d in devices]))
    try:
        open_and_wait(qtbot, win, model)
        command = win.command_pane.argv()
        assert command[1:3] == ["-m", str(model)] and "-ngl" in command, command
        root = Path(__file__).resolve().parents[2]
        r = subprocess.run([sys.executable, "-m", "offload_planner", "fit", str(model), "--json",
                            "--no-detect", *(f"--device={d}" for d in devices), "--", *command[3:]],
                           capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(root / "gui")}, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stderr
        fit = json.loads(r.stdout)
        assert re.fullmatch(r"-ngl \d+ \(mmap\)", fit["best"]), fit["best"]
        messages: list[str] = []
        win.presets_menu.message.connect(messages.append)
        assert win.presets_menu.fastest(), messages
        wait_projected(qtbot, win, 120_000)
        n = fit["best"].split()[1]
        assert f", -ngl {n} with mmap: the top {n} layers (the output counted as one) on MTL0" in messages[-1]
        assert win.command_pane.argv()[1:] == fit["plan"]["command"], (win.command_pane.argv(), fit["plan"])
        a = win.doc.analysis
        assert a is not None and a.projection is not None
        assert DeviceFigures.of(a.projection.device("MTL0")).over == 0
    finally:
        win.close()
