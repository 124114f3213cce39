"""The speed line's tooltip listed "(default: uncalibrated)" after every efficiency and ended there: no
word of what uncalibrated means or what to do about it (the Launch tab's Bench calibrates; another
machine's figures are declared with --device).  Said under the assumptions while the estimate is
uncalibrated, and gone once it is calibrated."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait

from offload_planner.backend.speed_store import record_efficiencies
from offload_planner.ui.settings import Settings
from offload_planner.ui.speed_view import UNCALIBRATED


def test_the_tooltip_says_what_uncalibrated_means_until_calibrated(
    qtbot: QtBot, settings: Settings, demo_path: Path, small_models: dict[str, Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """This machine's Bench calibrates this machine's estimates: a model on its own CPU says calibrated
    then; the demo, whose CPU is declared as another machine's (``ram=``), takes none of it and keeps
    saying what uncalibrated means."""
    monkeypatch.setenv("OFFLOAD_PLANNER_CONFIG_DIR", str(tmp_path / "cfg"))
    win = make_window(qtbot, settings, system_info())
    try:
        open_and_wait(qtbot, win, demo_path)
        qtbot.waitUntil(lambda: "est. tg" in win.speed_label.text())
        tip = win.speed_label.toolTip()
        assert "(uncalibrated)" in tip and tip.endswith("</pre>" + UNCALIBRATED)
        assert "Launch tab's Bench" in UNCALIBRATED and "--device CPU=512GiB,ram=12xDDR5-4800" in UNCALIBRATED
        record_efficiencies("llama.cpp", {"probe_bandwidth": 0.6, "cpu_bandwidth": 0.6,
                                          "cpu_compute": 0.3, "gpu_compute": 0.3})  # what Bench stores
        win.speed_label.refresh()
        tip = win.speed_label.toolTip()
        assert "(uncalibrated)" in tip and tip.endswith("</pre>" + UNCALIBRATED)  # another machine's CPU
        open_and_wait(qtbot, win, small_models["llama"])  # this machine's CPU
        qtbot.waitUntil(lambda: "est. tg" in win.speed_label.text())
        tip = win.speed_label.toolTip()
        assert "(calibrated)" in tip and UNCALIBRATED not in tip and tip.endswith("</pre>")
    finally:
        win.close()


def test_help_names_bench_and_what_fastest_ranks_by(
    qtbot: QtBot, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Help → Keys and mouse named Fastest plan and the Speed tab, but not what Fastest plan is fastest
    at (a request, fit's --goal balanced) nor the Launch tab's Bench, the one way to make the estimate
    this machine's."""
    shown: list[str] = []
    monkeypatch.setattr("offload_planner.ui.main_window.QMessageBox.information",
                        lambda _parent, _title, text: shown.append(text))
    win = make_window(qtbot, settings, system_info())
    try:
        help_menu = next(a.menu() for a in win.menuBar().actions() if a.text() == "&Help")
        next(a for a in help_menu.actions() if a.text() == "Keys and mouse").trigger()
        assert len(shown) == 1
        assert "Fastest plan: the fastest placement that fits, for a request of a 4096-token prompt and a " \
               "512-token answer" in shown[0]
        assert "its Bench measures the speed and calibrates the estimate for this machine" in shown[0]
    finally:
        win.close()
