"""A newcomer's first hour in the window (issue 13): unsaved work, session devices and their order,
the demo on declared hardware, the same figures as the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.backend.system import cpu_device
from offload_planner.core.placement import CPU
from offload_planner.core.synth import SMALL_MODELS, write_model
from offload_planner.core.units import GiB
from offload_planner.ui import settings as keys
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
Button = QMessageBox.StandardButton


# --- 2. unsaved work ---------------------------------------------------------------------------


def _drop(win: MainWindow, path: Path) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    ev = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                    Qt.KeyboardModifier.NoModifier)
    win.dropEvent(ev)


WAYS: dict[str, Callable[[MainWindow, Path], None]] = {
    "open": lambda w, p: w.open_path(p),
    "recent": lambda w, p: w._open_recent(str(p)),
    "drop": _drop,
    "paste": lambda w, p: w.command_pane.paste_text(f"llama-server -m {p} -ngl 0 -c 1024"),
}


@pytest.fixture
def edited(qtbot: QtBot, window: MainWindow, qwen3moe_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> tuple[MainWindow, list[str], list[Button]]:
    """The window with one unsaved move; ``answers`` are given to the Save? question in turn."""
    open_and_wait(qtbot, window, qwen3moe_path)
    window.doc.move(["blk.1.ffn_up_exps.weight"], CPU)
    window.confirm_close = True
    asked: list[str] = []
    answers: list[Button] = []

    def ask(consequence: str) -> Button:
        asked.append(consequence)
        return answers.pop(0) if answers else Button.Discard  # closing at the end

    monkeypatch.setattr(window, "ask_unsaved", ask)
    return window, asked, answers


@pytest.mark.parametrize("way", list(WAYS))
def test_replacing_unsaved_work_asks_and_cancel_keeps_it(
    qtbot: QtBot, edited: tuple[MainWindow, list[str], list[Button]], tmp_path: Path, way: str
) -> None:
    win, asked, answers = edited
    other = write_model(SMALL_MODELS["qwen3moe"], tmp_path / "other.gguf")[0]
    answers.append(Button.Cancel)
    WAYS[way](win, other)
    qtbot.wait(50)
    assert len(asked) == 1
    assert not win.loader.busy and win.doc.plan.moves == {"blk.1.ffn_up_exps.weight": CPU}
    assert win.doc.undo_stack.canUndo() and win.isWindowModified()

    answers.append(Button.Discard)
    WAYS[way](win, other)
    qtbot.waitUntil(lambda: not win.loader.busy)
    wait_projected(qtbot, win)
    assert len(asked) == 2
    assert win.doc.plan.moves == {}


def test_save_answer_saves_then_opens(
    qtbot: QtBot, edited: tuple[MainWindow, list[str], list[Button]], tmp_path: Path
) -> None:
    win, asked, answers = edited
    target = tmp_path / "kept.plan.json"
    win.doc.file_path = str(target)
    other = write_model(SMALL_MODELS["qwen3moe"], tmp_path / "other.gguf")[0]
    answers.append(Button.Save)
    open_and_wait(qtbot, win, other)
    assert asked and target.is_file()
    assert "blk.1.ffn_up_exps.weight" in target.read_text()
    assert win.doc.plan.model.path == str(other)


def test_a_saved_plan_is_replaced_without_asking(
    qtbot: QtBot, edited: tuple[MainWindow, list[str], list[Button]], tmp_path: Path
) -> None:
    win, asked, _answers = edited
    win.doc.undo_stack.undo()  # back to the clean state
    open_and_wait(qtbot, win, write_model(SMALL_MODELS["qwen3moe"], tmp_path / "o.gguf")[0])
    assert asked == []


# --- 3. session devices, llama.cpp order ---------------------------------------------------------


def test_devices_from_the_command_line_are_not_written_to_the_settings(
    qtbot: QtBot, settings: Settings, qwen3moe_path: Path
) -> None:
    settings.set(keys.VIRTUAL_GPUS, [{"name": "CUDA2", "total": 8 * GiB, "margin": GiB}])
    win = make_window(qtbot, settings, system_info("CUDA1=24GiB", "CUDA0=12GiB,margin=2GiB", "CPU=64GiB"))
    open_and_wait(qtbot, win, qwen3moe_path)
    assert win.doc.device_names() == ["CUDA0", "CUDA1", "CUDA2", "CPU"]
    win.close()
    assert [d.name for d in settings.virtual_gpus()] == ["CUDA2"]
    assert "CUDA0" not in settings.get(keys.MARGINS) and "CUDA1" not in settings.get(keys.MARGINS)
    assert settings.get(keys.CPU_SIZE) == 0


def test_stored_devices_come_back_in_llama_order(qtbot: QtBot, settings: Settings,
                                                 qwen3moe_path: Path) -> None:
    settings.set(keys.VIRTUAL_GPUS, [{"name": "CUDA1", "total": 24 * GiB, "margin": GiB},
                                     {"name": "CUDA0", "total": 12 * GiB, "margin": GiB}])
    win = make_window(qtbot, settings, system_info())
    open_and_wait(qtbot, win, qwen3moe_path)
    assert win.doc.device_names() == ["CUDA0", "CUDA1", "CPU"]
    win.doc.remove_device("CUDA0")
    from offload_planner.core.devices import parse_device_decl

    win.doc.add_device(parse_device_decl("CUDA0=12GiB"))  # added back: first, as llama.cpp lists it
    assert win.doc.device_names() == ["CUDA0", "CUDA1", "CPU"]
    win.close()


def test_a_screenshot_run_with_devices_leaves_the_settings_file_without_them(tmp_path: Path) -> None:
    ini = tmp_path / "s.ini"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "gui"), "QT_QPA_PLATFORM": "offscreen"}
    r = subprocess.run(
        [sys.executable, "-m", "offload_planner", "gui", "--device", "CUDA1=24GiB", "--device", "CUDA0=8GiB",
         "--screenshot", str(tmp_path / "s.png"), "--settings", str(ini)],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "CUDA" not in ini.read_text()


# --- 7. the demo, RAM, the same figures as the CLI ----------------------------------------------


def test_the_demo_opens_on_declared_demo_hardware_that_fits(
    qtbot: QtBot, settings: Settings, demo_path: Path, qwen3moe_path: Path
) -> None:
    win = make_window(qtbot, settings, system_info(cpu_gib=16))  # an ordinary machine, no GPU
    open_and_wait(qtbot, win, demo_path)
    devs = win.doc.plan.devices
    assert [(d.name, d.total) for d in devs] == [("CUDA0", 24 * GiB), ("CPU", 512 * GiB)]
    assert [d.description for d in devs] == ["demo GPU", "demo RAM"]
    assert "--cpu-moe" in win.command_pane.argv()
    a = win.doc.analysis
    assert a is not None and not [w for w in a.warnings if "over capacity" in w]
    assert "Demo hardware (declared)" in win.devices_panel.notice.text()
    assert win.devices_panel.notice.isVisible()
    # your own model plans for your machine, and the demo's devices are not remembered
    open_and_wait(qtbot, win, qwen3moe_path)
    assert [(d.name, d.total) for d in win.doc.plan.devices] == [("CPU", 16 * GiB)]
    assert "Demo hardware" not in win.devices_panel.notice.text()
    win.close()
    assert settings.virtual_gpus() == [] and settings.get(keys.CPU_SIZE) == 0


def test_ram_capacity_is_the_total_and_stable() -> None:
    first, second = cpu_device(), cpu_device()
    assert first.capacity == second.capacity == psutil.virtual_memory().total


def test_window_and_cli_give_the_same_cpu_figures_and_note(qtbot: QtBot, settings: Settings,
                                                           demo_path: Path) -> None:
    """The demo's plan in the window and in `offload-planner plan`: the same CPU weights (bytes
    read), and the same explanation of the mmap span."""
    win = make_window(qtbot, settings, system_info())
    open_and_wait(qtbot, win, demo_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "gui")}
    args = win.command_pane.argv()[1:]
    i = args.index("-m")
    del args[i:i + 2]
    r = subprocess.run(
        [sys.executable, "-m", "offload_planner", "plan", str(demo_path), "--no-detect", "--device",
         "CUDA0=24GiB", "--device", "CPU=512GiB", "--", *args],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )
    cpu_row = next(line for line in r.stdout.splitlines() if line.startswith("CPU "))
    cli_weights = float(cpu_row.split()[1])
    from offload_planner.core.device_figures import DeviceFigures

    a = win.doc.analysis
    assert a is not None and a.projection is not None
    f = DeviceFigures.of(a.projection.device("CPU"))
    win_weights = dict(f.by_kind)["model"] / GiB
    assert round(win_weights, 2) == cli_weights, (win_weights, cpu_row)
    notes = [win.problems.item(i).text() for i in range(win.problems.count())]
    mmap = [n for n in notes if "file span" in n]
    assert mmap and mmap[0] in r.stdout
    win.close()


def test_a_plan_pins_its_ram_size(qtbot: QtBot, settings: Settings, qwen3moe_path: Path,
                                  tmp_path: Path) -> None:
    win = make_window(qtbot, settings, system_info("CUDA0=24GiB", cpu_gib=64))
    open_and_wait(qtbot, win, qwen3moe_path)
    win.doc.set_device_size("CPU", 200 * GiB)
    target = tmp_path / "ram.plan.json"
    assert win._save_to(str(target))
    win.close()
    other = make_window(qtbot, Settings.at(str(tmp_path / "o.ini")), system_info(cpu_gib=16))
    open_and_wait(qtbot, other, target)
    assert other.doc.plan.devices.cpu.capacity == 200 * GiB
    other.close()


# --- 5. the Launch tab --------------------------------------------------------------------------


def _launch_tab(win: MainWindow) -> None:
    win.tabs.setCurrentIndex(win.tabs.count() - 1)


def test_launch_on_the_demo_explains_where_it_can_be_seen_and_a_new_model_clears_it(
    qtbot: QtBot, window: MainWindow, demo_path: Path, small_models: dict[str, Path]
) -> None:
    open_and_wait(qtbot, window, demo_path)
    _launch_tab(window)
    launcher = window.launcher
    qtbot.mouseClick(launcher.launch_button, Qt.MouseButton.LeftButton)
    assert launcher.failures.isVisible() and "header-only" in launcher.failures.item(0).text()
    viewport = window.launch_scroll.viewport()
    top_left = launcher.failures.mapTo(viewport, launcher.failures.rect().topLeft())
    first_line = launcher.failures.visualItemRect(launcher.failures.item(0))
    assert viewport.rect().contains(top_left + first_line.bottomRight()), (top_left, viewport.rect())
    open_and_wait(qtbot, window, small_models["qwen3moe"])
    assert not launcher.failures.isVisible() and launcher.explanations == []


def test_the_launch_tab_says_a_header_only_model_cannot_be_launched_before_launch(
    qtbot: QtBot, window: MainWindow, demo_path: Path, small_models: dict[str, Path]
) -> None:
    """The Launch tab on the demo warned only that CUDA0 is declared; that the file cannot be launched
    at all came after pressing Launch. Its note says so instead (nothing launches, so where CUDA0's
    tensors would go is moot); a complete model gets the declared-GPU warning back."""
    header_only = ("⚠ This model file is header-only (its tensors' shapes, not their data): llama-server "
                   "cannot load it; open the complete GGUF to launch it")
    open_and_wait(qtbot, window, demo_path)
    _launch_tab(window)
    note = window.launcher.virtual_note
    assert note.isVisible() and note.text() == header_only
    open_and_wait(qtbot, window, small_models["qwen3moe"])
    assert note.isVisible() and note.text() == (
        "⚠ CUDA0 is declared, not on this machine: llama-server will not see CUDA0, so what the plan puts "
        "there goes elsewhere and its figures will not match the projection")


def _cpu_only_log(win: MainWindow) -> list[str]:
    """What llama-server logs on a machine without the plan's GPU: every buffer on the CPU."""
    from tests.ui.test_launcher_panel import _buffer_lines

    from offload_planner.core.devices import DeviceSet
    from offload_planner.core.memory import project

    plan = win.doc.plan
    cpu_only = DeviceSet(plan.devices.cpu, ())
    return _buffer_lines(project(plan.model, cpu_only, plan.placement(), plan.context))


def test_virtual_gpus_are_warned_before_and_explained_after(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, small_models: dict[str, Path]
) -> None:
    from tests.ui.test_launcher_panel import _fake_server

    open_and_wait(qtbot, window, small_models["qwen3moe"])
    launcher = window.launcher
    assert launcher.virtual_devices() == ["CUDA0"]  # declared with --device, no GPU detected
    window.set_backend_path(str(_fake_server(tmp_path, _cpu_only_log(window))))
    launcher.port_spin.setValue(17000 + os.getpid() % 1000)
    _launch_tab(window)
    assert launcher.virtual_note.isVisible()  # before Launch
    warning = launcher.virtual_note.text()
    assert "CUDA0 is declared, not on this machine: llama-server will not see CUDA0" in warning
    with qtbot.waitSignal(launcher.server.ready, timeout=20_000):
        qtbot.mouseClick(launcher.launch_button, Qt.MouseButton.LeftButton)
    marks = [launcher.table.item(r, 6).text() for r in range(launcher.table.rowCount())
             if launcher.table.item(r, 0).text() == "CUDA0" and launcher.table.item(r, 1).text() == "total"]
    assert marks == ["✗ declared, not on this machine"]
    texts = [launcher.failures.item(i).text() for i in range(launcher.failures.count())]
    assert any("CUDA0 is declared, not on this machine" in t for t in texts)

    # 5c: after Stop the status says stopped, not "100% healthy"
    launcher.server.healthChanged.emit(True)
    assert launcher.stage_label.text() == "healthy"
    with qtbot.waitSignal(launcher.server.finished, timeout=20_000):
        launcher.stop()
    assert launcher.stage_label.text() == "stopped" and launcher.progress.value() == 0
    launcher.server.healthChanged.emit(True)  # a late answer
    assert launcher.stage_label.text() == "stopped"


# --- 9. layout -----------------------------------------------------------------------------------


def test_the_ik_mla_row_leaves_every_device_row_in_view(
    qtbot: QtBot, settings: Settings, demo_path: Path
) -> None:
    from offload_planner.backend.system import Detection

    system = system_info("CUDA0=24GiB", "CUDA1=24GiB")
    system.detection = Detection([], "no NVIDIA driver found (NVML Shared Library Not Found); declare GPUs "
                                     "with --device CUDA0=24GiB")  # what a machine without a driver says
    win = make_window(qtbot, settings, system)
    open_and_wait(qtbot, win, demo_path)
    box = win.backend_box
    box.setCurrentIndex(box.findData("ik_llama.cpp"))
    box.activated.emit(box.currentIndex())
    wait_projected(qtbot, win)
    assert win.options_panel.isVisible()
    qtbot.wait(50)
    view, notice = win.devices_panel.view, win.devices_panel.notice
    rows = win.devices_panel.model.rowCount()
    assert rows == 3
    for r in range(rows):
        rect = view.visualRect(view.model().index(r, 0))
        assert view.viewport().rect().contains(rect), (r, rect, view.viewport().rect())
    assert notice.isVisible() and notice.geometry().top() >= view.geometry().bottom()
    assert notice.height() >= notice.heightForWidth(notice.width())
    # however long a notice gets, the column scrolls rather than draw it over the list
    win.devices_panel.show_notice(" ".join(["A long notice about the devices."] * 12))
    qtbot.wait(50)
    assert notice.geometry().top() >= view.geometry().bottom()
    assert notice.height() >= notice.heightForWidth(notice.width())
    assert win.left_scroll.verticalScrollBar().maximum() > 0
    win.close()


def test_memory_breakdowns_are_never_elided(qtbot: QtBot, window: MainWindow, demo_path: Path) -> None:
    from offload_planner.ui.memory_view import BREAKDOWN_FORMS

    open_and_wait(qtbot, window, demo_path)  # -ngl 999 on one declared GPU: "+355.8 GiB over"
    window.h_split.setSizes([270, 2000, 10])  # the user drags the Memory pane as narrow as it goes
    qtbot.wait(50)
    lines = window.memory_view._breakdown_lines()
    assert lines and all(line.form < len(BREAKDOWN_FORMS) for line in lines), [ln.text for ln in lines]


def test_command_and_problems_say_updating_until_the_projection_arrives(
    qtbot: QtBot, window: MainWindow, qwen3moe_path: Path
) -> None:
    open_and_wait(qtbot, window, qwen3moe_path)
    pane, problems = window.command_pane, window.problems
    assert pane.status.text().startswith("projected in") and pane.copy_button.isEnabled()
    window.doc.move(["blk.1.ffn_up_exps.weight"], CPU)  # the projection runs on its thread
    assert pane.status.text() == "updating…"
    assert not pane.copy_button.isEnabled() and not pane.text.isEnabled()
    assert problems.count() and problems.item(0).text().startswith("updating…")
    wait_projected(qtbot, window)
    assert pane.status.text().startswith("projected in") and pane.copy_button.isEnabled()
    assert not any(problems.item(i).text().startswith("updating") for i in range(problems.count()))


def test_the_demo_hardware_declares_its_ram_speed(
    qtbot: QtBot, settings: Settings, demo_path: Path
) -> None:
    """The demo's 512 GiB of RAM are not this machine's, but its speed was this machine's RAM probe
    (7.4 GB/s on a busy 2-core VM: "est. tg 0.532 t/s" for DeepSeek-V3 with one 24 GiB GPU, where the
    README's same plan on 8 channels of DDR5-4800 says 10.7).  The demo declares its RAM's speed as
    the README's commands do, so the window and `plan` give the same figures on any machine."""
    import subprocess
    import sys

    from offload_planner.backend.speed_store import plan_speed
    from offload_planner.ui.rates import rate_text

    win = make_window(qtbot, settings, system_info(cpu_gib=16))
    try:
        open_and_wait(qtbot, win, demo_path)
        est = plan_speed(win.doc.plan, probe=False)
        ram = next(a for a in est.assumptions if a.what == "CPU memory bandwidth")
        assert str(ram.figure.source).startswith("declared") and ram.figure.value == 307.2, ram
        r = subprocess.run([sys.executable, "-m", "offload_planner", "plan", str(demo_path), "--no-detect",
                            "--device", "CUDA0=24GiB", "--device", "CPU=512GiB,ram=8xDDR5-4800", "--",
                            "-c", "32768", "-ngl", "999", "--cpu-moe"], capture_output=True, text=True,
                           timeout=120, check=False)
        assert f"tg {rate_text(est.tg_tps)} t/s at depth 0" in r.stdout, r.stdout
        assert win.speed_label.text().startswith(f"est. tg {rate_text(est.tg_tps)} t/s")
    finally:
        win.close()
