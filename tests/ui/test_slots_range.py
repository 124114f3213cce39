"""The Options panel's Slots -np box follows the plan's build: the pinned build refuses more than
LLAMA_MAX_SEQ (256: ``Dialect.max_seq``), ik checks none, so the box took at most 256 on an ik plan
(an ik plan of 300 slots showed 256, and 300 could not be typed)."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import open_and_wait, wait_projected

from offload_planner.core.cmdline.handlers_mainline import INT_MAX
from offload_planner.core.plan_edits import option_value
from offload_planner.ui.main_window import MainWindow


def test_slots_range_follows_the_dialect(qtbot: QtBot, window: MainWindow, demo_path: Path) -> None:
    open_and_wait(qtbot, window, demo_path)
    slots = window.options_panel.slots
    assert slots.maximum() == 256
    window.doc.set_dialect("ik_llama.cpp", "ik_llama.cpp")
    assert slots.maximum() == INT_MAX
    slots.setValue(300)  # as typed: the plan takes it
    wait_projected(qtbot, window)
    assert option_value(window.doc.plan, "context.n_seq_max") == 300
    assert slots.value() == 300
    window.doc.set_dialect("llama.cpp", "llama.cpp")
    assert slots.maximum() == 256
    wait_projected(qtbot, window)  # the plan keeps its 300 (the box shows 256): Problems say the build exits
    errors = [t for kind, t in window.problems.problems() if kind == "warning" and "n_seq_max" in t]
    assert errors == ["llama-server exits: llama_init_from_model: failed to initialize the context: "
                      "n_seq_max must be <= 256 (-np 300: this build takes at most 256 sequences, "
                      "LLAMA_MAX_SEQ)"], window.problems.problems()
    window.doc.undo_stack.undo()  # back to ik: the plan's 300 is shown again
    assert (slots.maximum(), slots.value()) == (INT_MAX, 300)
