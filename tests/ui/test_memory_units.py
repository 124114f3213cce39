"""The breakdown line under a bar writes GiB figures bare ("W 9.3  KV 2.1") beside MiB ones that carry
their unit ("O 2 MiB"); the legend then says what the bare ones are in."""

from __future__ import annotations

import re
from pathlib import Path

from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import open_and_wait

from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.memory_view import UNIT_NOTE


def test_legend_says_bare_figures_are_gib(qtbot: QtBot, window: MainWindow, demo_path: Path,
                                         small_models: dict[str, Path]) -> None:
    open_and_wait(qtbot, window, demo_path)
    view = window.memory_view
    text = view.breakdown(0)[0]  # type: ignore[index]
    assert re.search(r"\b\d+\.\d(?! [KMG]iB)", text), text  # a bare figure
    assert (UNIT_NOTE, "note") in view.legend_items()
    open_and_wait(qtbot, window, small_models["llama"])  # every figure in MiB/KiB, with its unit
    assert all(re.search(r"\d [KM]iB", part) for part in re.split(r"\s{2,}", view.breakdown(0)[0]))  # type: ignore[index]
    assert (UNIT_NOTE, "note") not in view.legend_items()
