"""The window on models llama.cpp refuses to load (newcomer4; the CLI side and the files:
tests/test_cli_unloadable.py): one without block_count is refused when opened (it was planned, and the
speed line's estimate died with an IndexError traceback); one whose context_length is 0 says in
Problems, its speed line and Fastest plan that Context must be set (they said 'float division by
zero' and 'ZeroDivisionError')."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot
from tests.support.gguf_rewrite import rewrite
from tests.ui.window_helpers import make_window, open_and_wait

from offload_planner.ui.main_window import SystemInfo
from offload_planner.ui.settings import Settings


@pytest.fixture(scope="module")
def unloadable(small_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("unloadable_window")
    src = small_models["qwen3moe"]
    return {"no-blocks": rewrite(src, root / "no-blocks.gguf", drop="qwen3moe.block_count"),
            "context-0": rewrite(src, root / "context-0.gguf", u32=("qwen3moe.context_length", 0))}


def test_the_window_refuses_to_open_it(qtbot: QtBot, tmp_path: Path, unloadable: dict[str, Path]) -> None:
    win = make_window(qtbot, Settings.at(str(tmp_path / "s.ini")), SystemInfo.probe([]))
    shown: list[str] = []
    win.errorShown.connect(shown.append)
    win.open_path(unloadable["no-blocks"])
    qtbot.waitUntil(lambda: bool(shown), timeout=30_000)
    assert "key not found in model: qwen3moe.block_count" in shown[0], shown
    assert str(unloadable["no-blocks"]) in shown[0], shown


def test_the_window_says_a_context_of_0_needs_setting(qtbot: QtBot, tmp_path: Path,
                                                      unloadable: dict[str, Path]) -> None:
    from offload_planner.core.devices import parse_device_decl

    win = make_window(qtbot, Settings.at(str(tmp_path / "s.ini")),
                      SystemInfo.probe([parse_device_decl("CUDA0=24GiB")]))
    open_and_wait(qtbot, win, unloadable["context-0"])
    problems = win.doc.analysis.warnings if win.doc.analysis else []
    assert any("qwen3moe.context_length" in p and "-c 4096" in p for p in problems), problems
    line = win.speed_label.text()
    assert line.startswith("no speed estimate: the model's trained context is 0"), line
    said: list[str] = []
    win.presets_menu.message.connect(said.append)
    assert win.presets_menu.fastest() is False
    assert said and "trained context is 0" in said[0] and "set Context" in said[0], said
