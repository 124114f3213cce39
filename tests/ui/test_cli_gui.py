"""``offload-planner [gui] [MODEL]`` starts the window; ``--screenshot`` renders it offscreen."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtGui import QImage

from offload_planner import cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, dict[str, object]]]:
    got: list[tuple[object, dict[str, object]]] = []

    def fake(model: object, **kw: object) -> int:
        got.append((model, kw))
        return 0

    monkeypatch.setattr("offload_planner.ui.app.run_gui", fake)
    return got


def test_no_subcommand_or_a_path_opens_the_window(calls: list[tuple[object, dict[str, object]]]) -> None:
    assert cli.main([]) == 0
    assert cli.main(["model.gguf"]) == 0
    assert (
        cli.main(["gui", "m.gguf", "--device", "CUDA0=24GiB", "--screenshot", "x.png", "--size", "1600x900"])
        == 0
    )
    assert [c[0] for c in calls] == [None, "model.gguf", "m.gguf"]
    assert calls[2][1]["devices"] == ["CUDA0=24GiB"]
    assert calls[2][1]["screenshot"] == "x.png" and calls[2][1]["size"] == (1600, 900)


def test_inspect_is_unchanged(
    calls: list[tuple[object, dict[str, object]]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["inspect", "--no-layers"]) == 0
    assert "deepseek2" in capsys.readouterr().out
    assert calls == []


def test_screenshot_renders_the_window_at_1280x800(tmp_path: Path) -> None:
    shot = tmp_path / "window.png"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "gui"), "QT_QPA_PLATFORM": "offscreen"}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "offload_planner",
            "gui",
            "--device",
            "CUDA0=24GiB",
            "--device",
            "CUDA1=24GiB",
            "--screenshot",
            str(shot),
            "--settings",
            str(tmp_path / "s.ini"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "Fatal" not in r.stderr
    img = QImage(str(shot))
    assert not img.isNull()
    assert (img.width(), img.height()) == (1280, 800)
    # not blank: the device colours of the map and the memory bars are there
    colours = {img.pixelColor(x, y).name() for x in range(0, 1280, 7) for y in range(0, 800, 7)}
    assert "#0072b2" in colours and "#e69f00" in colours


def test_bad_size_and_no_display_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert cli.main(["gui", "--size", "big", "--screenshot", "x.png"]) == 2
    assert "--size 'big'" in capsys.readouterr().err
    assert cli.main(["gui", "--size", "800x600", "--screenshot", "x.png"]) == 2  # drawn 1024x640 otherwise
    assert "--size '800x600': smaller than the window's minimum 1024x640" in capsys.readouterr().err
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    env["PYTHONPATH"] = str(ROOT / "gui")
    r = subprocess.run(
        [sys.executable, "-m", "offload_planner"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    if sys.platform.startswith("linux"):
        assert r.returncode == 2 and "no display" in r.stderr
