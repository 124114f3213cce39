"""A model or projector URL whose server accepts and never answers: the window's load is cut when
another file is opened or the window closes, and so is the projection's read of a -mmu URL. Before,
the load held a thread of the loader's pool to the 60 s network deadline: closing the window blocked
for 30 s, and with two such loads under way the next file (even a local one) waited for one of them
to give up."""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import open_and_wait

from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.errors import GGUFError
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.plan_file import PlanFile, plan_json
from offload_planner.core.remote import Cancel, HttpRangeSource, cancel_scope
from offload_planner.ui.main_window import MainWindow


@pytest.fixture
def silent_url() -> Iterator[str]:
    """http://127.0.0.1:PORT/m.gguf on a listener that accepts connections and never answers."""
    srv = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(srv.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}/m.gguf"
    srv.close()
    for c in held:
        c.close()


def test_a_cancel_from_another_thread_ends_a_stalled_read_at_once(silent_url: str) -> None:
    cancel = Cancel()
    failed: list[BaseException] = []

    def read() -> None:
        with cancel_scope(cancel):
            try:
                HttpRangeSource(silent_url, timeout=30, deadline=60)
            except GGUFError as e:
                failed.append(e)

    t = threading.Thread(target=read)
    t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    cancel.cancel()
    t.join(10)
    assert not t.is_alive() and time.monotonic() - t0 < 2
    assert failed and str(failed[0]) == f"{silent_url}: cancelled"


def test_closing_the_window_while_a_url_loads_is_at_once(qtbot: QtBot, window: MainWindow,
                                                          silent_url: str) -> None:
    window.open_path(silent_url)
    qtbot.wait(300)
    assert window.loader.busy
    t0 = time.monotonic()
    window.close()
    assert time.monotonic() - t0 < 5


def test_a_file_opened_after_two_stalled_urls_opens_at_once(qtbot: QtBot, window: MainWindow, silent_url: str,
                                                            qwen3moe_path: Path) -> None:
    window.open_path(silent_url)
    window.open_path(silent_url.replace("m.gguf", "n.gguf"))
    qtbot.wait(300)
    t0 = time.monotonic()
    open_and_wait(qtbot, window, qwen3moe_path, timeout=20_000)
    assert time.monotonic() - t0 < 15
    assert window.doc.plan.model.path == str(qwen3moe_path)


def _plan_with_projector_url(tmp_path: Path, model: Path, url: str) -> Path:
    m = open_model(model)
    plan = plan_from_args(m, DeviceSet(Device("CPU", DeviceKind.CPU, 64 << 30), ()),
                          argparse.Namespace(ctx_size=2048))
    data = plan_json(PlanFile.of(plan))
    data["extra_args"] = ["-mmu", url]
    path = tmp_path / "mmu.plan.json"
    path.write_text(json.dumps(data))
    return path


def test_closing_the_window_while_a_projector_url_is_read_is_at_once(
        qtbot: QtBot, window: MainWindow, silent_url: str, qwen3moe_path: Path, tmp_path: Path) -> None:
    """The projection thread read the plan's -mmu URL: the close waited 10 s for it, then Qt destroyed
    the running thread (an abort)."""
    window.allow_remote_plans = True
    window.open_path(_plan_with_projector_url(tmp_path, qwen3moe_path, silent_url))
    qtbot.waitUntil(lambda: window.doc.has_plan and window.doc.busy, timeout=20_000)
    qtbot.wait(300)
    assert window.doc.busy
    t0 = time.monotonic()
    window.close()
    assert time.monotonic() - t0 < 5
