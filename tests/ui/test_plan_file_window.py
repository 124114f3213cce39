"""Plan files in the window: a bad file, a FIFO, a model URL or a command from a file never abort
or act silently: a dialog names the file and the field, asks before fetching a URL named in the
file, and shows the whole command (with the arguments to look at) before launching it."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtWidgets import QMessageBox, QWidget
from pytestqt.qtbot import QtBot
from tests.support.http_range_server import RangeServer
from tests.ui.window_helpers import open_and_wait, wait_projected

from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.plan_file import PlanFile, plan_json
from offload_planner.ui.confirm import FETCH_TITLE, LAUNCH_TITLE
from offload_planner.ui.main_window import MainWindow


def _boxes(parent: QWidget, title: str) -> list[QMessageBox]:
    return [b for b in parent.findChildren(QMessageBox) if b.windowTitle() == title and b.isVisible()]


def _wait_box(qtbot: QtBot, parent: QWidget, title: str) -> QMessageBox:
    qtbot.waitUntil(lambda: bool(_boxes(parent, title)), timeout=5000)
    return _boxes(parent, title)[-1]


def _click(box: QMessageBox, text: str) -> None:
    button = next(b for b in box.buttons() if b.text().replace("&", "") == text)
    button.click()


def _plan_data(model_path: Path, extra: list[str] | None = None) -> dict[str, object]:
    from offload_planner.core.devices import Device, DeviceKind, DeviceSet

    model = open_model(model_path)
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 << 30), ())
    plan = plan_from_args(model, devices, argparse.Namespace(ctx_size=2048))
    pf = PlanFile.of(replace(plan, extra_args=list(extra or [])))
    data = plan_json(pf)
    data["extra_args"] = list(extra or [])  # written by hand: a file may carry anything
    return data


def _write(path: Path, data: dict[str, object]) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_a_bad_plan_file_shows_a_dialog_naming_the_file_and_field(
    qtbot: QtBot, window: MainWindow, qwen3moe_path: Path, tmp_path: Path
) -> None:
    data = _plan_data(qwen3moe_path)
    data["context"]["n_seq_max"] = "four"  # type: ignore[index]
    bad = _write(tmp_path / "bad.plan.json", data)
    window.open_path(bad)
    box = _wait_box(qtbot, window, "Cannot open the plan")
    assert (
        str(bad) in box.text() and "$.context.n_seq_max" in box.text() and "expected an integer" in box.text()
    )
    assert not window.doc.has_plan and not window.loader.busy
    box.close()
    raw = tmp_path / "raw.plan.json"
    raw.write_bytes(b'{"format": "offload-planner-plan", "version": 1, "model": {"path": "\xff"}}')
    window.open_path(raw)
    box = _wait_box(qtbot, window, "Cannot open the plan")
    assert str(raw) in box.text() and "not UTF-8" in box.text()
    deep = tmp_path / "deep.plan.json"
    deep.write_bytes(b"[" * 200_000 + b"]" * 200_000)
    window.open_path(deep)
    qtbot.waitUntil(lambda: any(str(deep) in b.text() for b in _boxes(window, "Cannot open the plan")))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_as_plan_or_as_its_model_is_refused_at_once(
    qtbot: QtBot, window: MainWindow, qwen3moe_path: Path, tmp_path: Path
) -> None:
    fifo = tmp_path / "pipe.plan.json"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    window.open_path(fifo)
    box = _wait_box(qtbot, window, "Cannot open the plan")
    assert "pipe.plan.json" in box.text() and "a FIFO" in box.text() and time.monotonic() - t0 < 3
    box.close()
    model_fifo = tmp_path / "model.gguf"
    os.mkfifo(model_fifo)
    data = _plan_data(qwen3moe_path)
    data["model"]["path"] = str(model_fifo)  # type: ignore[index]
    window.open_path(_write(tmp_path / "m.plan.json", data))
    box = _wait_box(qtbot, window, "Cannot open the plan")
    assert str(model_fifo) in box.text() and "a FIFO" in box.text()
    assert not window.loader.busy, "nothing is left reading the FIFO"


def test_a_model_url_in_a_plan_file_is_fetched_only_after_asking(
    qtbot: QtBot, window: MainWindow, qwen3moe_path: Path, tmp_path: Path
) -> None:
    with RangeServer(qwen3moe_path.parent) as srv:
        data = _plan_data(qwen3moe_path)
        url = srv.url(qwen3moe_path.name)
        data["model"]["path"] = url  # type: ignore[index]
        plan_file = _write(tmp_path / "remote.plan.json", data)
        window.open_path(plan_file)
        box = _wait_box(qtbot, window, FETCH_TITLE)
        assert url in box.text() and str(plan_file) in box.text()
        qtbot.wait(200)
        assert srv.log == [] and not window.loader.busy, "nothing fetched before the answer"
        _click(box, "Cancel")
        qtbot.wait(200)
        assert srv.log == [] and not window.doc.has_plan
        window.open_path(plan_file)
        _click(_wait_box(qtbot, window, FETCH_TITLE), "Fetch")
        qtbot.waitUntil(lambda: window.doc.has_plan, timeout=30_000)
        wait_projected(qtbot, window)
        assert window.doc.plan.model.path == url and srv.log


def test_launching_a_plan_from_a_file_shows_the_command_first(
    qtbot: QtBot, window: MainWindow, qwen3moe_path: Path, tmp_path: Path
) -> None:
    extra = ["--host", "0.0.0.0", "--log-file", str(tmp_path / "x.log"), "--api-key", "sk-shown-never"]
    plan_file = _write(tmp_path / "shared.plan.json", _plan_data(qwen3moe_path, extra))
    open_and_wait(qtbot, window, plan_file)
    panel = window.launcher
    panel.set_executable(str(tmp_path / "no-such-llama-server"))
    assert panel.review_source == str(plan_file.resolve())
    assert not panel.launch()
    box = _wait_box(qtbot, panel, LAUNCH_TITLE)
    text = box.informativeText()
    assert "shared.plan.json" in box.text()
    assert (
        "no-such-llama-server" in text and "--host 0.0.0.0" in text and str(qwen3moe_path.resolve()) in text
    )
    assert "--host: listens on 0.0.0.0" in text and "--log-file: writes its log to" in text
    assert "sk-shown-never" not in text and "--api-key '***'" in text
    _click(box, "Cancel")
    qtbot.wait(100)
    assert not panel.server.state.active and panel._run is None, "nothing started"
    assert panel.review_source is not None, "the next Launch asks again"
    assert not panel.launch()
    _click(_wait_box(qtbot, panel, LAUNCH_TITLE), "Launch")
    qtbot.waitUntil(lambda: panel._run is not None, timeout=5000)
    assert panel.review_source is None
    qtbot.waitUntil(lambda: not panel.server.state.active, timeout=15_000)


def test_a_model_opened_directly_launches_without_asking(
    qtbot: QtBot, window: MainWindow, qwen3moe_path: Path, tmp_path: Path
) -> None:
    open_and_wait(qtbot, window, qwen3moe_path)
    assert window.launcher.review_source is None


def test_saving_from_the_window_drops_secrets_with_a_note(
    qtbot: QtBot, window: MainWindow, qwen3moe_path: Path, tmp_path: Path
) -> None:
    extra = ["-t", "4", "--api-key", "sk-123", "-hft", "hf_456"]
    open_and_wait(qtbot, window, _write(tmp_path / "in.plan.json", _plan_data(qwen3moe_path, extra)))
    out = tmp_path / "out.plan.json"
    assert window._save_to(str(out))
    text = out.read_text()
    assert "sk-123" not in text and "hf_456" not in text and json.loads(text)["extra_args"] == ["-t", "4"]
    assert "--api-key: its value is a secret and was not saved" in window.statusBar().currentMessage()
    qtbot.waitUntil(lambda: any("-hft: its value is a secret" in ln for ln in window.log_view.shown_lines()))


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")
def test_saving_over_a_read_only_folder_says_so(
    qtbot: QtBot, window: MainWindow, qwen3moe_path: Path, tmp_path: Path
) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    open_and_wait(qtbot, window, qwen3moe_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert not window._save_to(str(ro / "p.plan.json"))
        assert _boxes(window, "Cannot save the plan")
    finally:
        ro.chmod(0o700)
