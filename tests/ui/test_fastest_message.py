"""What the Fastest plan preset says matches what the window then shows: the tensors it counts as
moved are the ones the map marks (not every entry of the plan's moves, most of which --cpu-moe
places there anyway), and a device the result still overflows (RAM smaller than the experts the
GPUs cannot take) is named with how much, where the memory pane shows it red."""

from __future__ import annotations

import re
from pathlib import Path

from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.core.device_figures import DeviceFigures
from offload_planner.core.units import GiB
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.settings import Settings

MESSAGE = re.compile(r"Fastest plan: (\d+) tensors moved \(marked on the map\), -ub \d+(.*)")


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


def test_fastest_counts_the_marked_tensors_and_names_what_still_overflows(
    qtbot: QtBot, settings: Settings, demo_path: Path
) -> None:
    win = make_window(qtbot, settings, system_info("CUDA0=24GiB", "CUDA1=24GiB", cpu_gib=24))
    try:
        open_and_wait(qtbot, win, demo_path)
        text = _fastest(qtbot, win)
        m = MESSAGE.fullmatch(text)
        assert m, text
        marked = _marked(win)
        assert 0 < marked < len(win.doc.plan.moves)  # the moves name tensors --cpu-moe places anyway
        assert int(m.group(1)) == marked
        a = win.doc.analysis
        assert a is not None and a.projection is not None
        cpu = DeviceFigures.of(a.projection.device("CPU"))
        assert cpu.over > 300 * GiB  # 24 GiB of RAM for the experts two 24 GiB GPUs cannot take
        assert f"still over capacity: CPU {cpu.over / GiB:.1f} GiB" in m.group(2)
        assert all(DeviceFigures.of(a.projection.device(g)).over == 0 for g in ("CUDA0", "CUDA1"))
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
        assert int(m.group(1)) == _marked(win)
    finally:
        win.close()
