"""Opening and saving through the window: plans, recent files, dropped files, settings, the title."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.core.placement import CPU
from offload_planner.core.synth import SMALL_MODELS, write_model
from offload_planner.core.units import GiB
from offload_planner.ui import settings as keys
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.settings import Settings


def test_save_and_reopen_a_plan(
    qtbot: QtBot, window: MainWindow, qwen3moe_path: Path, tmp_path: Path
) -> None:
    open_and_wait(qtbot, window, qwen3moe_path)
    doc = window.doc
    doc.move(["blk.2.ffn_up_exps.weight", "blk.2.ffn_down_exps.weight"], CPU)
    doc.set_option("context.n_ctx", 2048, "context size")
    doc.set_device_margin("CUDA0", 2 * GiB)
    assert window.isWindowModified()
    target = tmp_path / "q.plan.json"
    assert window._save_to(str(target))
    assert target.is_file() and not window.isWindowModified()
    assert "q.plan.json" in window.windowTitle()
    saved = doc.plan

    doc.set_option("context.n_ctx", 4096, "context size")
    open_and_wait(qtbot, window, target)
    assert doc.plan.moves == saved.moves
    assert doc.plan.context == saved.context and doc.plan.devices == saved.devices
    assert doc.undo_stack.count() == 0 and doc.file_path == str(target.resolve())
    assert doc.notes == []
    assert window.settings.recent_files[0] == str(target.resolve())


def test_plan_of_a_changed_model_says_so(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    model = write_model(SMALL_MODELS["qwen3moe"], tmp_path / "m.gguf")[0]
    open_and_wait(qtbot, window, model)
    window.doc.move(["blk.1.ffn_up_exps.weight"], CPU)
    target = tmp_path / "m.plan.json"
    assert window._save_to(str(target))
    write_model(replace(SMALL_MODELS["qwen3moe"], n_ff_exp=512), model)  # the file changes on disk
    open_and_wait(qtbot, window, target)
    assert window.doc.notes and "model changed on disk" in window.doc.notes[0]
    problems = [window.problems.item(i).text() for i in range(window.problems.count())]
    assert any("changed on disk" in p for p in problems)
    assert window.doc.plan.moves == {"blk.1.ffn_up_exps.weight": CPU}, "moves are applied by name"


def test_a_dropped_gguf_opens(qtbot: QtBot, window: MainWindow, qwen3moe_path: Path) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(qwen3moe_path))])
    enter = QDragEnterEvent(
        window.rect().center(),  # QDragEnterEvent takes a QPoint
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(window, enter)
    assert enter.isAccepted()
    drop = QDropEvent(
        QPointF(window.rect().center()),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(window, drop)
    qtbot.waitUntil(
        lambda: window.doc.has_plan and window.doc.plan.model.path == str(qwen3moe_path.resolve())
    )
    wait_projected(qtbot, window)


def test_a_bad_file_reports_and_keeps_the_plan(
    qtbot: QtBot, window: MainWindow, qwen3moe_path: Path, tmp_path: Path
) -> None:
    open_and_wait(qtbot, window, qwen3moe_path)
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    window.open_path(bad)
    qtbot.waitUntil(lambda: not window.loader.busy)
    assert "broken.gguf" in window.statusBar().currentMessage()
    assert window.doc.plan.model.path == str(qwen3moe_path.resolve())


def test_devices_and_settings_persist(qtbot: QtBot, tmp_path: Path, qwen3moe_path: Path) -> None:
    ini = str(tmp_path / "s.ini")
    win = make_window(qtbot, Settings.at(ini), system_info("CUDA0=24GiB"))
    assert "No GPU detected" in win.devices_panel.notice.text() and win.devices_panel.notice.isVisibleTo(win)
    open_and_wait(qtbot, win, qwen3moe_path)
    win.doc.add_device(replace(win.doc.plan.devices.gpus[0], name="CUDA1", total=12 * GiB))
    win.doc.set_device_margin("CUDA1", 3 * GiB)
    win.command_pane.set_format_style("powershell")
    win.close()

    again = Settings.at(ini)
    assert again.recent_files == [str(qwen3moe_path.resolve())]
    # CUDA0 came from --device: for that session only; CUDA1 was added in the window
    assert {d.name: d.total for d in again.virtual_gpus()} == {"CUDA1": 12 * GiB}
    assert again.margin_of("CUDA1") == 3 * GiB
    assert again.get(keys.COMMAND_STYLE) == "powershell"
    win2 = make_window(qtbot, again, system_info("CUDA0=8GiB"))
    devices = win2.initial_devices()
    assert devices.names == ["CUDA0", "CUDA1", "CPU"] and devices.gpus[1].margin == 3 * GiB
    assert win2.command_pane.format_style == "powershell"
    win2.close()


def test_options_panel_edits_are_undoable(qtbot: QtBot, window: MainWindow, qwen3moe_path: Path) -> None:
    open_and_wait(qtbot, window, qwen3moe_path)
    panel = window.options_panel
    panel.flash.setChecked(False)
    panel.type_k.setCurrentText("q8_0")
    panel.slots.setValue(2)
    doc = window.doc
    assert (doc.plan.context.flash_attn, doc.plan.context.type_k, doc.plan.context.n_seq_max) == (
        False,
        "q8_0",
        2,
    )
    assert doc.undo_stack.count() == 3
    wait_projected(qtbot, window)
    cmd = window.command_pane.text.toPlainText()
    assert "-fa off" in cmd and "-ctk q8_0" in cmd and "-np 2" in cmd
    doc.undo_stack.undo()
    doc.undo_stack.undo()
    doc.undo_stack.undo()
    assert panel.flash.isChecked() and panel.type_k.currentText() == "f16" and panel.slots.value() == 4
    # the margin column of the Devices list is an undoable edit too
    model = window.devices_panel.model
    row = model.row_of("CUDA0")
    assert row is not None
    assert model.setData(model.index(row, 2), 2.5)
    assert doc.plan.devices.gpus[0].margin == int(2.5 * GiB) and doc.undo_stack.count() == 1


def test_ik_backend_shows_the_mla_mode_and_its_memory(qtbot: QtBot, window: MainWindow,
                                                       tmp_path: Path) -> None:
    """On a DeepSeek-style model, choosing ik_llama.cpp shows the -mla row; changing it is one undo
    step that changes the projected KV and weights and the command."""
    from offload_planner.cli import demo_model_path

    open_and_wait(qtbot, window, demo_model_path())
    panel = window.options_panel
    form = panel._form
    assert not form.isRowVisible(panel.mla), "mainline has no -mla"
    box = window.backend_box
    box.setCurrentIndex(box.findData("ik_llama.cpp"))
    box.activated.emit(box.currentIndex())
    wait_projected(qtbot, window)
    doc = window.doc
    assert doc.plan.context.mla == 3 and form.isRowVisible(panel.mla)
    assert panel.mla.currentData() == 3
    weights3 = sum(d.weights for d in doc.plan.projection().devices)
    panel.mla.setCurrentIndex(panel.mla.findData(1))
    panel.mla.activated.emit(panel.mla.currentIndex())
    assert doc.plan.context.mla == 1
    wait_projected(qtbot, window)
    assert "-mla 1" in window.command_pane.text.toPlainText()
    weights1 = sum(d.weights for d in doc.plan.projection().devices)
    assert weights3 - weights1 > GiB, "ik's computed attn_kv_b (about 1 GiB) goes with -mla 1"
    doc.undo_stack.undo()
    assert doc.plan.context.mla == 3 and panel.mla.currentData() == 3
    doc.undo_stack.undo()
    assert doc.plan.dialect == "llama.cpp" and not form.isRowVisible(panel.mla)
