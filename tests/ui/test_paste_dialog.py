"""Paste command…: a command that cannot be read (a quote left open, as when a multi-line command is
copied short of its last line) closed the dialog and said so for 6 s in the status bar, so a long
command pasted and edited in the dialog was lost.  The dialog stays open with the reason under the
text; the corrected command then goes through."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QDialogButtonBox
from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.ui.command_pane import PasteCommandDialog
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.settings import Settings

QWEN = Path(__file__).resolve().parents[2] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf"
TYPO = "llama-server -m model.gguf -c 8192 -ngl 99 -ot 'blk\\.1[0-9]\\.ffn_.*_exps=CPU -ub 1024"


def test_a_refused_paste_keeps_the_dialog_and_its_text(qtbot: QtBot, settings: Settings) -> None:
    win = make_window(qtbot, settings, system_info("CUDA0=24GiB"))
    try:
        open_and_wait(qtbot, win, QWEN)
        before = win.doc.plan
        seen: dict[str, object] = {}

        def drive() -> None:
            dlg = next(w for w in QApplication.topLevelWidgets()
                       if isinstance(w, PasteCommandDialog) and w.isVisible())
            ok = dlg.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok)
            dlg.edit.setPlainText(TYPO)
            ok.click()
            seen["open"], seen["text"] = dlg.isVisible(), dlg.text()
            error = getattr(dlg, "error", None)
            seen["error"] = error.text() if error is not None and error.isVisible() else ""
            if dlg.isVisible():
                dlg.edit.setPlainText(TYPO.replace("CPU ", "CPU' "))  # the fix, in the same dialog
                ok.click()

        QTimer.singleShot(0, drive)
        win.command_pane.paste_dialog()
        assert seen["open"] and seen["text"] == TYPO
        assert "No closing quotation" in str(seen["error"]), seen["error"]
        wait_projected(qtbot, win)
        assert win.doc.plan != before
        argv = win.command_pane.argv()
        assert argv[argv.index("-ub") + 1] == "1024" and argv[argv.index("-c") + 1] == "8192"
    finally:
        win.close()


def test_a_pasted_command_llama_server_refuses_is_an_error(qtbot: QtBot, settings: Settings) -> None:
    """plan refuses such a command (exit 2); the window plans what it can read of it, and said so
    as one of "1 notes in Problems", listed with an information icon.  Now the status line and the
    Problems tab say it is an error, and a note is counted as one."""
    win = make_window(qtbot, settings, system_info("CUDA0=24GiB"))
    messages: list[str] = []
    win.command_pane.message.connect(messages.append)
    try:
        open_and_wait(qtbot, win, QWEN)
        assert win.command_pane.paste_text("llama-server -c 8192 -ngl 99 --cpu-moe -foo")
        wait_projected(qtbot, win)
        assert messages[-1] == ("Plan rebuilt from the pasted command, which llama-server would refuse: "
                                "see Problems (1 error)")
        problems = win.problems.problems()
        refused = [(sev, text) for sev, text in problems if "would refuse it" in text]
        assert refused == [("error", "pasted command: llama-server would refuse it: error: invalid argument: "
                                     "-foo (not a flag of llama.cpp (pinned build 11434))")]
        assert problems[0] == refused[0] and win.tabs.tabText(1) == "Problems (1)"
        assert win.command_pane.paste_text("llama-server -c 8k -ngl 99 --cpu-moe")
        wait_projected(qtbot, win)
        assert messages[-1] == "Plan rebuilt from the pasted command (1 note in Problems)"
        assert all(sev == "note" for sev, text in win.problems.problems() if text.startswith("pasted"))
    finally:
        win.close()


def test_docker_env_has_no_empty_command_line(qtbot: QtBot, window: MainWindow, demo_path: Path) -> None:
    """Format docker env on a command whose every argument is a LLAMA_ARG_* variable (the demo's
    on one declared GPU; README step 6 shows such a list) ended with "# command (arguments after the
    image's llama-server entrypoint): " and nothing after it."""
    open_and_wait(qtbot, window, demo_path)
    pane = window.command_pane
    pane.set_format_style("docker-env")
    assert pane.text.toPlainText().splitlines() == [
        f"LLAMA_ARG_MODEL={window.doc.plan.model.path}", "LLAMA_ARG_CTX_SIZE=32768",
        "LLAMA_ARG_N_GPU_LAYERS=999", "LLAMA_ARG_FLASH_ATTN=on", "LLAMA_ARG_FIT=off"]
