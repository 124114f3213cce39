"""What the Fastest plan preset says matches what the window then shows: the tensors it counts as
moved are the ones the map marks (not every entry of the plan's moves, most of which --cpu-moe
places there anyway); where RAM is smaller than the experts the GPUs cannot take, nothing fits and
the message names the host with how much (the search respects RAM like any device)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.core.device_figures import DeviceFigures
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.settings import Settings

#: The plan before held more than the GPUs (the demo's -ngl 999 on two declared 24 GiB cards): no
#: "before → after" against a plan llama-server would not load.
FROM_OVER = re.compile(r"Fastest plan: est\. tg ([\d.]+) t/s, pp ([\d.]+) t/s \(the plan before did not "
                       r"fit (.+?): no speed to compare with\); (\d+) tensors moved \(marked on the map\), "
                       r"-ts (\d+),(\d+) \(its own layer split\), (?:-b \d+ )?-ub \d+(.*)")


def _marked(win: MainWindow) -> int:
    grid = win.doc.grid
    assert grid is not None
    return sum(1 for cell in grid.cells.values() for item in cell.items if item.moved)


def _fastest(qtbot: QtBot, win: MainWindow) -> str:
    messages: list[str] = []
    win.presets_menu.message.connect(messages.append)
    assert win.presets_menu.fastest()
    wait_projected(qtbot, win, 120_000)
    return messages[-1]


def test_fastest_refuses_a_plan_over_ram_and_says_by_how_much(
    qtbot: QtBot, settings: Settings, demo_path: Path
) -> None:
    """24 GiB of RAM cannot hold the experts two 24 GiB GPUs leave of DeepSeek-V3 (about 330 GiB):
    the search respects the host like any device, changes nothing and names it with the amount."""
    win = make_window(qtbot, settings, system_info("CUDA0=24GiB", "CUDA1=24GiB", cpu_gib=24))
    try:
        open_and_wait(qtbot, win, demo_path)
        before = win.doc.plan
        messages: list[str] = []
        win.presets_menu.message.connect(messages.append)
        assert not win.presets_menu.fastest()
        assert win.doc.plan == before
        m = re.fullmatch(r"Nothing fits these devices: CPU \(RAM\) over by (\d+\.\d) GiB \((\d+\.\d) GiB "
                         r"projected \+ (\d+\.\d) GiB margin > 24\.0 GiB\) in the closest plan, (.*)",
                         messages[-1])
        assert m, messages[-1]
        over, used, margin = (float(m.group(i)) for i in (1, 2, 3))
        assert over > 300 and used + margin - over == pytest.approx(24, abs=0.11)
    finally:
        win.close()


def test_nothing_fits_this_machines_ram_says_how_to_set_another(
    qtbot: QtBot, settings: Settings, demo_path: Path
) -> None:
    """`gui --device CUDA0=rtx3090` on the demo (the RAM then this machine's): Fastest plan said only
    "Nothing fits these devices: CPU (RAM) over by ...", where `fit` adds that the RAM is this
    machine's and how to declare another's. The window says it too, naming its Size column; once the
    size is typed there (declared) the message is the search's alone."""
    win = make_window(qtbot, settings, system_info("CUDA0=rtx3090", cpu_gib=24))
    try:
        open_and_wait(qtbot, win, demo_path)
        messages: list[str] = []
        win.presets_menu.message.connect(messages.append)
        assert not win.presets_menu.fastest()
        assert messages[-1].startswith("Nothing fits these devices: CPU (RAM) over by ")
        assert messages[-1].endswith(
            ". The RAM is this machine's (24.0 GiB): to plan for another machine, type its size in the CPU "
            "row's Size column (or start with --device CPU=512GiB,ram=8xDDR5-4800)")
        win.doc.set_device_size("CPU", 32 * 1024**3)
        wait_projected(qtbot, win)
        assert not win.presets_menu.fastest()
        assert messages[-1].startswith("Nothing fits these devices: CPU (RAM) over by ")
        assert "this machine's" not in messages[-1]
    finally:
        win.close()
    declared = make_window(qtbot, settings, system_info("CUDA0=rtx3090", "CPU=32GiB", cpu_gib=24))
    try:  # `gui --device CPU=32GiB`: another machine's RAM, declared
        open_and_wait(qtbot, declared, demo_path)
        said: list[str] = []
        declared.presets_menu.message.connect(said.append)
        assert not declared.presets_menu.fastest()
        assert said[-1].startswith("Nothing fits these devices: CPU (RAM) over by ")
        assert "> 32.0 GiB" in said[-1]
        assert "this machine's" not in said[-1]
    finally:
        declared.close()


def test_fastest_says_nothing_of_overflow_when_all_fits(
    qtbot: QtBot, settings: Settings, demo_path: Path
) -> None:
    win = make_window(qtbot, settings, system_info("CUDA0=24GiB", "CUDA1=24GiB", cpu_gib=512))
    try:
        open_and_wait(qtbot, win, demo_path)
        m = FROM_OVER.fullmatch(_fastest(qtbot, win))
        assert m and "over" not in m.group(7)
        marked = _marked(win)
        assert 0 < marked < len(win.doc.plan.moves)  # the moves name tensors --cpu-moe places anyway
        assert int(m.group(4)) == marked
        a = win.doc.analysis
        assert a is not None and a.projection is not None
        assert all(DeviceFigures.of(a.projection.device(d)).over == 0 for d in ("CUDA0", "CUDA1", "CPU"))
    finally:
        win.close()


def test_fastest_from_a_plan_that_did_not_fit_gives_no_loss_and_names_its_split(
    qtbot: QtBot, settings: Settings, demo_path: Path
) -> None:
    """The demo on two declared RTX 3090 opens on -ngl 999 (all 376 GiB on the GPUs, over): Fastest
    plan said "est. tg 29.2 → 0.577 t/s (−98%)", a loss against a plan llama-server would not load,
    and did not say it had changed -ts (its own layer split), which moves whole layers between the
    GPUs on the map."""
    from offload_planner.backend.speed_store import plan_speed
    from offload_planner.ui.rates import rate_text

    win = make_window(qtbot, settings, system_info("CUDA0=rtx3090", "CUDA1=rtx3090"))
    try:
        open_and_wait(qtbot, win, demo_path)
        said = _fastest(qtbot, win)
        m = FROM_OVER.fullmatch(said)
        assert m, said
        assert "→" not in said and "%" not in said
        assert m.group(3) == "CUDA0, CUDA1"
        est = plan_speed(win.doc.plan, probe=False)
        assert (m.group(1), m.group(2)) == (rate_text(est.tg_tps), rate_text(est.pp_tps))
        ts = win.doc.plan.placement_options.tensor_split
        assert (float(m.group(5)), float(m.group(6))) == ts
        assert "-ts " + ",".join(f"{t:g}" for t in ts) in win.command_pane.text.toPlainText()
    finally:
        win.close()


def test_a_message_the_window_cuts_is_whole_in_the_log_and_the_tooltip(
    qtbot: QtBot, settings: Settings, demo_path: Path
) -> None:
    """At 1024x640 the status bar cut Fastest plan's message after "-ts 25,37 (it" and cleared it after
    6 s: what it did to -b, -ub and the KV cache could not be read anywhere.  The whole message is the
    status bar's tooltip while shown and stays in the Log tab."""
    from PySide6.QtGui import QFontMetrics

    win = make_window(qtbot, settings, system_info("CUDA0=rtx3090", "CUDA1=rtx3090"))
    try:
        win.resize(1024, 640)
        open_and_wait(qtbot, win, demo_path)
        win.presets_menu.allow_kv_quant = True
        said = _fastest(qtbot, win)
        bar = win.statusBar()
        assert QFontMetrics(bar.font()).horizontalAdvance(said) > bar.width()  # cut on screen
        assert bar.currentMessage() == said and bar.toolTip() == said
        win.log_view.model.flush()
        assert any(line.endswith(said) for line in win.log_view.model.lines())
        bar.clearMessage()
        assert bar.toolTip() == ""  # no tooltip of a message no longer shown
    finally:
        win.close()
