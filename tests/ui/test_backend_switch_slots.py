"""The Backend box reads the plan's command as the chosen build's server reads it: a command without
``-np`` has that build's default slots.  The pinned server's default is four slots sharing one unified
KV cache; ik_llama.cpp's and the 2025 builds' is one.  The switch kept the pinned four, so the window
exported ``-np 4`` for ik (four slots of a quarter of the context each) where ``offload-planner plan
--backend ik_llama.cpp`` of the same command plans one slot of all of it (newcomer7)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot
from tests.support.projected import buffer_counts
from tests.ui.window_helpers import open_and_wait, wait_projected

from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.dialects import Dialect
from offload_planner.ui.main_window import MainWindow


def _switch(qtbot: QtBot, win: MainWindow, dialect: str) -> None:
    box = win.backend_box
    box.setCurrentIndex(box.findData(dialect))
    box.activated.emit(box.currentIndex())  # as a user's choice in the box
    wait_projected(qtbot, win)


@pytest.mark.parametrize("dialect", ["ik_llama.cpp", "llama.cpp-2025"])
def test_switching_the_backend_plans_the_command_as_that_build_reads_it(
    qtbot: QtBot, window: MainWindow, qwen3moe_path: Path, dialect: str
) -> None:
    open_and_wait(qtbot, window, qwen3moe_path)
    before = window.doc.analysis
    assert before is not None and "-np" not in before.command  # the pinned server's -np auto
    assert window.doc.plan.context.n_seq_max == 4
    _switch(qtbot, window, dialect)
    shown = window.doc.analysis
    assert shown is not None and shown.projection is not None
    assert shown.command[shown.command.index("-np") + 1] == "1", shown.command  # was -np 4
    # what `plan --backend DIALECT` makes of the command the window showed before the switch
    args = parse_server_args(before.command[2:], dialect=Dialect(dialect)).args
    plan = window.doc.plan
    cli = analyse_command(plan.model, plan.devices, args, Dialect(dialect), command=True)
    assert cli.projection is not None
    assert shown.command == cli.command
    assert buffer_counts(shown.projection) == buffer_counts(cli.projection)
    assert window.doc.plan.context.n_seq_max == cli.plan.context.n_seq_max == 1
    # and back: the pinned build's default again, the command as it was
    _switch(qtbot, window, "llama.cpp")
    assert window.doc.analysis is not None and window.doc.analysis.command == before.command


def test_slots_the_user_set_survive_the_switch(qtbot: QtBot, window: MainWindow, qwen3moe_path: Path) -> None:
    """-np 2 is the user's, not a server default: every build gets it."""
    open_and_wait(qtbot, window, qwen3moe_path)
    window.options_panel.slots.setValue(2)  # Slots -np
    wait_projected(qtbot, window)
    for dialect in ("ik_llama.cpp", "llama.cpp"):
        _switch(qtbot, window, dialect)
        command = window.doc.analysis.command if window.doc.analysis else []
        assert command[command.index("-np") + 1] == "2", (dialect, command)


def test_ik_has_no_unified_kv_box_to_tick(qtbot: QtBot, window: MainWindow, qwen3moe_path: Path) -> None:
    """ik_llama.cpp keeps one KV stream and refuses -kvu: the "unified KV" box was there to tick, and
    the command then carried -kvu (ik: "error: unknown argument: -kvu")."""
    from PySide6.QtCore import Qt

    open_and_wait(qtbot, window, qwen3moe_path)
    box = window.options_panel.unified
    assert box.isEnabled()
    _switch(qtbot, window, "ik_llama.cpp")
    assert not box.isEnabled() and not box.isChecked()
    assert "ik_llama.cpp" in box.toolTip()
    qtbot.mouseClick(box, Qt.MouseButton.LeftButton)
    wait_projected(qtbot, window)
    command = window.doc.analysis.command if window.doc.analysis else []
    assert "-kvu" not in command
    assert not parse_server_args(command[2:], dialect=Dialect("ik_llama.cpp")).errors
    _switch(qtbot, window, "llama.cpp")
    assert box.isEnabled() and box.isChecked()  # the pinned server's default: 4 slots, one cache


@pytest.mark.parametrize("dialect", ["llama.cpp", "llama.cpp-2025", "ik_llama.cpp"])
def test_the_mmap_box_names_the_builds_own_flag(
    qtbot: QtBot, window: MainWindow, qwen3moe_path: Path, dialect: str
) -> None:
    """It said "off: -lm none (--no-mmap)" for every build: the pinned build refuses --no-mmap, and
    ik and the 2025 builds have no -lm."""
    open_and_wait(qtbot, window, qwen3moe_path)
    if dialect != "llama.cpp":
        _switch(qtbot, window, dialect)
    tip = window.options_panel.mmap.toolTip()
    flags = tip.removeprefix("off: ").split(":", 1)[0].split()
    assert flags == list(Dialect(dialect).no_mmap_flags), tip
    assert not parse_server_args(flags, dialect=Dialect(dialect)).errors
