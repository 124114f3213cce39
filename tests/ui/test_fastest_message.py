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

MESSAGE = re.compile(r"Fastest plan: est\. tg [\d.]+ → [\d.]+ t/s \([^)]+\), "
                     r"pp [\d.]+ → [\d.]+ t/s \([^)]+\); (\d+) tensors moved "
                     r"\(marked on the map\), (?:-b \d+ )?-ub \d+(.*)")


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


def test_fastest_says_nothing_of_overflow_when_all_fits(
    qtbot: QtBot, settings: Settings, demo_path: Path
) -> None:
    win = make_window(qtbot, settings, system_info("CUDA0=24GiB", "CUDA1=24GiB", cpu_gib=512))
    try:
        open_and_wait(qtbot, win, demo_path)
        m = MESSAGE.fullmatch(_fastest(qtbot, win))
        assert m and "over" not in m.group(2)
        marked = _marked(win)
        assert 0 < marked < len(win.doc.plan.moves)  # the moves name tensors --cpu-moe places anyway
        assert int(m.group(1)) == marked
        a = win.doc.analysis
        assert a is not None and a.projection is not None
        assert all(DeviceFigures.of(a.projection.device(d)).over == 0 for d in ("CUDA0", "CUDA1", "CPU"))
    finally:
        win.close()
