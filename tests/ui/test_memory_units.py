"""The memory view's text reads whole: the breakdown line under a bar writes GiB figures bare
("W 9.3  KV 2.1") beside MiB ones that carry their unit ("O 2 MiB"), so the legend says what the bare
ones are in; a verdict over many devices counts them instead of being cut off."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait

from offload_planner.core.synth import BIG_MODELS, write_model
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.memory_view import UNIT_NOTE
from offload_planner.ui.settings import Settings


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


@pytest.fixture(scope="module")
def llama70b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("units") / "Llama-3.1-70B.header.gguf"
    return write_model(BIG_MODELS["Llama-3.1-70B-Q4_K_M"], path, header_only=True)[0]


def test_many_devices_over_capacity_are_counted_not_cut_off(qtbot: QtBot, settings: Settings,
                                                            llama70b: Path) -> None:
    """Four GPUs over capacity: the verdict line says how many instead of eliding their names
    ("over capacity: CUDA0, CUDA1, CU…"), and the overflow is textured: CUDA3's vermillion bar
    runs into the red overflow without a visible seam otherwise."""
    win = make_window(qtbot, settings, system_info("CUDA0=12GiB", "CUDA1=12GiB", "CUDA2=12GiB", "CUDA3=8GiB"))
    try:
        open_and_wait(qtbot, win, llama70b)
        view = win.memory_view
        assert view.width() < 400
        assert view.verdict() == "✖ 4 devices over capacity"
        win.h_split.setSizes([200, 200, 880])
        qtbot.waitUntil(lambda: view.width() > 800)
        assert view.verdict() == "✖ over capacity: CUDA0, CUDA1, CUDA2, CUDA3"
        bar = view.bar_rect(3)
        img = view.grab().toImage()
        dpr = img.devicePixelRatio()
        y = int(bar.center().y() * dpr)
        over = {img.pixel(x, y) for x in range(int((bar.right() - 0.12 * bar.width()) * dpr),
                                                 int((bar.right() - 0.02 * bar.width()) * dpr))}
        assert len(over) >= 2  # red with a white cross-hatch, not one flat red
    finally:
        win.close()
