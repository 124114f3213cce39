"""The Launch tab's Bench against the real llama-server: it measures the running server, shows the
measured speed against the estimate, stores the calibration in the (temporary) config folder, and
the estimate under the memory bars then says it is calibrated."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot
from tests.support.procs import free_port
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait

from offload_planner.core.synth import SMALL_MODELS, write_model
from offload_planner.core.synth.random_fill import fill_random
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture
def cpu_window(qtbot: QtBot, settings: Settings, tmp_path: Path,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[MainWindow]:
    monkeypatch.setenv("OFFLOAD_PLANNER_CONFIG_DIR", str(tmp_path / "cfg"))
    win = make_window(qtbot, settings, system_info())
    yield win
    win.launcher.shutdown()
    win.close()


def test_bench_button_measures_and_calibrates(qtbot: QtBot, cpu_window: MainWindow, tmp_path: Path,
                                              llama_server: Path) -> None:
    model = tmp_path / "llama-random.gguf"
    write_model(SMALL_MODELS["llama"], model)
    fill_random([model], seed=5)
    win = cpu_window
    open_and_wait(qtbot, win, model)
    assert "est. tg" in win.speed_label.text()
    assert "uncalibrated" in win.speed_label.toolTip()
    launcher = win.launcher
    win.set_backend_path(str(llama_server))
    launcher.port_spin.setValue(free_port())
    launcher.extra_edit.setText("-t 1")
    win.tabs.setCurrentIndex(win.tabs.count() - 1)
    assert not launcher.bench_button.isEnabled()
    qtbot.mouseClick(launcher.launch_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(launcher.bench_button.isEnabled, timeout=120_000)
    with qtbot.waitSignal(launcher.speedMeasured, timeout=300_000) as got:
        qtbot.mouseClick(launcher.bench_button, Qt.MouseButton.LeftButton)
    check = got.args[0]
    assert check.measured.prompt_tokens == 512 and check.measured.gen_tokens == 64
    text = launcher.speed_label.text()
    assert "measured" in text and "estimated" in text and launcher.speed_label.isVisible()
    assert check.stored and (tmp_path / "cfg" / "speed.json").is_file()
    assert "(calibrated)" in win.speed_label.toolTip()
    with qtbot.waitSignal(launcher.server.finished, timeout=30_000):
        launcher.stop()
    assert not launcher.bench_button.isEnabled()
    assert os.environ["OFFLOAD_PLANNER_CONFIG_DIR"] == str(tmp_path / "cfg")
