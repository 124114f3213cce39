"""Hostile -ot rules in the window: the error reaches the Problems pane, the window stays usable.

The GUI thread places tensors for the grid and the projection thread projects: both used to
backtrack forever on ``(.+)+Z`` (the deadline makes such a regression fail, not hang).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot
from tests.support.deadline import deadline
from tests.ui.window_helpers import open_and_wait, wait_projected

from offload_planner.ui.main_window import MainWindow

NESTED = "(" * 1000 + "a" + ")" * 1000


@pytest.mark.parametrize(
    ("pattern", "fragment"),
    [
        ("(.+)+Z", "the pattern backtracks catastrophically on tensor names"),
        (NESTED, "groups nested more than 100 deep"),
    ],
)
def test_hostile_rule_is_a_problem_not_a_crash(
    qtbot: QtBot, window: MainWindow, demo_path: Path, pattern: str, fragment: str
) -> None:
    open_and_wait(qtbot, window, demo_path)
    doc = window.doc
    with deadline(60):
        assert window.command_pane.apply_command_text(
            f"llama-server -m DeepSeek-V3-Q4_K_M.gguf -ngl 999 -c 4096 -ot '{pattern}=CPU'")
        wait_projected(qtbot, window, timeout=20_000)
    a = doc.analysis
    assert a is not None and a.projection is None
    assert a.error.startswith(f"-ot '{pattern[:57]}") and fragment in a.error, a.error
    problems = [window.problems.item(i).text() for i in range(window.problems.count())]
    assert any(fragment in p for p in problems), problems

    doc.undo_stack.undo()  # the window still works: back to a plan it can project
    wait_projected(qtbot, window, timeout=20_000)
    assert doc.analysis is not None and doc.analysis.projection is not None
    assert not doc.analysis.error
