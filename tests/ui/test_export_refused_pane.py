"""A model path the chosen export format cannot carry: the command pane shows why (naming the
argument and the format) instead of a wrong command, Copy copies nothing, and bash shows the path's
control character escaped, on one line."""

from __future__ import annotations

import shutil
from pathlib import Path

from PySide6.QtGui import QGuiApplication
from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait

from offload_planner.core.command_text import split_command_text
from offload_planner.ui.launcher_panel import launched_text
from offload_planner.ui.settings import Settings

QWEN = Path(__file__).resolve().parents[2] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf"


def test_the_pane_refuses_what_the_format_cannot_carry(
    qtbot: QtBot, settings: Settings, tmp_path: Path
) -> None:
    model = tmp_path / "q\x1b[2Jwen\n%PATH%.gguf"
    shutil.copyfile(QWEN, model)
    win = make_window(qtbot, settings, system_info("CUDA0=24GiB"))
    try:
        open_and_wait(qtbot, win, model)
        pane = win.command_pane
        bash = pane.text.toPlainText()
        assert "\n" not in bash and "\x1b" not in bash and "$'" in bash
        assert str(model) in split_command_text(bash)
        messages: list[str] = []
        pane.message.connect(messages.append)
        for style, name in (("cmd", "cmd.exe"), ("llama-swap", "llama-swap")):
            pane.set_format_style(style)
            shown = pane.text.toPlainText()
            assert shown.startswith(f"cannot write the command for {name}: argument 2 ")
            assert "the value of '-m'" in shown and "\\x1b" in shown and "\x1b" not in shown
            QGuiApplication.clipboard().setText("before")
            pane.copy()
            assert QGuiApplication.clipboard().text() == "before" and messages[-1] == shown
    finally:
        win.close()


def test_the_launched_command_field_shows_control_characters_escaped() -> None:
    """The launcher's "Command" field (shlex.join) kept a newline or an escape sequence raw."""
    text = launched_text(["llama-server", "-m", "/m/a\nb\x1b[2J.gguf", "-c", "512"])
    assert text == "llama-server -m $'/m/a\\nb\\x1b[2J.gguf' -c 512"
    refused = launched_text(["llama-server", "-m", "a\0b"])
    assert refused.startswith("cannot write the command for bash: argument 2")
