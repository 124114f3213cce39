"""An exception the window's code does not expect (a bug) is said, fast, and loses nothing: a
--screenshot run whose load, projection or any slot raised waited for its 120 s timeout (PySide printed
the traceback and went on; the projection thread never answered again); in the window, a projection
that raised left every later edit unprojected, and a new model whose placing raised had already cleared
the open plan's undo history. The bugs are stood in for by patching one function to raise."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot
from tests.support.cli import PACKAGE_ROOT
from tests.ui.window_helpers import open_and_wait, wait_projected

from offload_planner.core.placement import CPU
from offload_planner.ui.main_window import MainWindow

#: patches ``TARGET`` (module:attribute) to raise, then runs the CLI with the rest of argv
RUN_PATCHED = """
import importlib, sys
module, _, attr = sys.argv[1].partition(':')
cls, _, meth = attr.partition('.')
def boom(*args, **kwargs):
    raise RuntimeError('boom from a bug')
owner = importlib.import_module(module)
setattr(getattr(owner, cls), meth, boom) if meth else setattr(owner, cls, boom)
from offload_planner.cli import main
raise SystemExit(main(sys.argv[2:]))
"""


def _screenshot_with(target: str, model: Path, tmp_path: Path
                     ) -> tuple[subprocess.CompletedProcess[str], float]:
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT, "HOME": str(home),
           "XDG_CONFIG_HOME": str(home / ".config"), "QT_QPA_PLATFORM": "offscreen"}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", RUN_PATCHED, target, "gui", str(model), "--screenshot",
                        str(tmp_path / "x.png"), "--settings", str(tmp_path / "s.ini")],
                       capture_output=True, text=True, timeout=90, env=env, stdin=subprocess.DEVNULL)
    return r, time.monotonic() - t0


@pytest.mark.parametrize(("target", "said"), [
    ("offload_planner.ui.main_window:new_plan", "{model}: RuntimeError: boom from a bug"),
    ("offload_planner.ui.projector:window_analysis",
     "{model}: cannot project the plan: RuntimeError: boom from a bug"),
    ("offload_planner.ui.main_window:MainWindow._plan_to_launcher",
     "{model}: internal error: RuntimeError: boom from a bug"),
])
def test_a_screenshot_run_whose_window_code_raises_fails_at_once_naming_the_file(
        tmp_path: Path, qwen3moe_path: Path, target: str, said: str) -> None:
    r, seconds = _screenshot_with(target, qwen3moe_path, tmp_path)
    assert seconds < 30, seconds
    assert r.returncode == 1, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [f"offload-planner: error: {said.format(model=qwen3moe_path)}"], \
        r.stderr[-2000:]
    assert not (tmp_path / "x.png").exists()


def test_an_edit_whose_projection_raises_is_said_and_the_next_edit_is_projected(
        qtbot: QtBot, window: MainWindow, qwen3moe_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from offload_planner.ui import projector

    open_and_wait(qtbot, window, qwen3moe_path)
    shown: list[str] = []
    window.errorShown.connect(shown.append)
    real = projector.window_analysis
    monkeypatch.setattr(projector, "window_analysis", lambda plan: 1 / 0)
    assert window.doc.move(["blk.1.ffn_down_exps.weight"], CPU)
    qtbot.waitUntil(lambda: bool(shown), timeout=20_000)
    assert shown == [f"{qwen3moe_path}: cannot project the plan: ZeroDivisionError: division by zero"]
    monkeypatch.setattr(projector, "window_analysis", real)
    assert window.doc.move(["blk.2.ffn_down_exps.weight"], CPU)  # the projection thread answers again
    wait_projected(qtbot, window, timeout=20_000)
    assert window.doc.undo_stack.count() == 2 and window.doc.plan.moves == {
        "blk.1.ffn_down_exps.weight": CPU, "blk.2.ffn_down_exps.weight": CPU}


def test_a_model_whose_plan_cannot_be_placed_keeps_the_open_plans_edits(
        qtbot: QtBot, window: MainWindow, qwen3moe_path: Path, small_models: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from offload_planner.ui import document

    open_and_wait(qtbot, window, qwen3moe_path)
    assert window.doc.move(["blk.1.ffn_down_exps.weight"], CPU)
    wait_projected(qtbot, window)
    plan = window.doc.plan
    shown: list[str] = []
    window.errorShown.connect(shown.append)
    real = document.build_grid

    def grid_for_the_first_model_only(model, *args, **kwargs):  # type: ignore[no-untyped-def]
        if model is not plan.model:
            raise RuntimeError("boom from a bug")
        return real(model, *args, **kwargs)

    monkeypatch.setattr(document, "build_grid", grid_for_the_first_model_only)
    other = small_models["llama"]
    window.open_path(other)
    qtbot.waitUntil(lambda: bool(shown), timeout=20_000)
    assert shown == [f"{other}: RuntimeError: boom from a bug"]
    assert window.doc.plan is plan and window.doc.undo_stack.count() == 1
    assert not window.doc.undo_stack.isClean()
    wait_projected(qtbot, window, timeout=20_000)
    window.doc.undo_stack.undo()
    assert window.doc.plan.moves == {}


def test_an_error_that_repeats_opens_one_dialog(qtbot: QtBot, window: MainWindow,
                                                qwen3moe_path: Path) -> None:
    """A paint or timer slot that raises raises again at once: one dialog, not one per repeat."""
    open_and_wait(qtbot, window, qwen3moe_path)
    shown: list[str] = []
    window.errorShown.connect(shown.append)
    for _ in range(5):
        window.internalError.emit("RuntimeError: boom from a bug")
    window.internalError.emit("KeyError: 'other'")
    assert shown == [f"{qwen3moe_path}: internal error: RuntimeError: boom from a bug",
                     f"{qwen3moe_path}: internal error: KeyError: 'other'"]
