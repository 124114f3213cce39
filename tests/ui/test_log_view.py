"""The log view: batched inserts on a timer, a bounded buffer, level colours, filters, follow-tail only
at the bottom, copy and save; and a child printing 200,000 lines through ServerProcess keeps the
event loop responsive with the row count capped."""

from __future__ import annotations

import itertools
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QItemSelectionModel, Qt, QTimer
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from offload_planner.backend.runner import LaunchConfig, ServerProcess
from offload_planner.core.cmdline import Dialect
from offload_planner.ui.log_view import BATCH_MAX, LEVEL_COLORS, LEVEL_ROLE, LogModel, LogView

MIXED = [
    "0.00.001.000 I srv  llama_server: initializing ...",
    "0.00.002.000 W srv  llama_server: security: no API key is set",
    "0.00.003.000 E llama_model_load: error loading model: unable to allocate CUDA0 buffer",
    "0.00.004.000 D create_tensor: loading tensor token_embd.weight",
    "error: invalid argument: --foo",
    "plain text",
]


def _view(qtbot: QtBot, **kw: int) -> LogView:
    v = LogView(**kw)
    qtbot.addWidget(v)
    v.resize(600, 200)
    v.show()
    qtbot.waitExposed(v)
    return v


def _flush(qtbot: QtBot, model: LogModel) -> None:
    qtbot.waitUntil(lambda: model.pending == 0, timeout=5000)


def test_lines_arrive_in_batches_on_the_timer(qtbot: QtBot) -> None:
    m = LogModel(max_lines=1000, flush_ms=100)
    flushed: list[int] = []
    m.flushed.connect(flushed.append)
    for i in range(50):
        m.append_lines([f"line {i}"])
    assert m.rowCount() == 0 and m.pending == 50  # nothing inserted until the timer fires
    with qtbot.waitSignal(m.flushed, timeout=1000):
        pass
    assert m.rowCount() == 50 and flushed == [50]
    assert m.data(m.index(49, 0)) == "line 49"


def test_the_buffer_is_bounded(qtbot: QtBot) -> None:
    m = LogModel(max_lines=100, flush_ms=10)
    for k in range(5):
        m.append_lines([f"{k}:{i}" for i in range(50)])
        _flush(qtbot, m)
    assert m.rowCount() == 100 and m.lines()[0] == "3:0" and m.lines()[-1] == "4:49"
    assert m.received == 250 and m.dropped == 150
    m.append_lines([f"big {i}" for i in range(1000)])  # more than fits: only the newest are kept
    assert m.pending == 100
    _flush(qtbot, m)
    assert m.lines() == [f"big {i}" for i in range(900, 1000)] and m.dropped == 1150
    m.clear()
    assert m.rowCount() == 0 and m.received == 0


def test_levels_are_coloured(qtbot: QtBot) -> None:
    m = LogModel(flush_ms=10)
    m.append_lines(MIXED)
    _flush(qtbot, m)
    levels = [m.data(m.index(r, 0), LEVEL_ROLE) for r in range(m.rowCount())]
    assert levels == ["I", "W", "E", "D", "E", "I"]
    fg = [m.data(m.index(r, 0), Qt.ItemDataRole.ForegroundRole) for r in range(m.rowCount())]
    assert fg == [None, LEVEL_COLORS["W"], LEVEL_COLORS["E"], LEVEL_COLORS["D"], LEVEL_COLORS["E"], None]
    assert m.data(m.index(2, 0), Qt.ItemDataRole.ToolTipRole) == "error"


def test_filters_copy_and_save(qtbot: QtBot, tmp_path: Path) -> None:
    v = _view(qtbot, flush_ms=10)
    v.append_lines(MIXED)
    _flush(qtbot, v.model)
    qtbot.keyClicks(v.filter_edit, "LLAMA_SERVER")  # case-insensitive
    assert v.shown_lines() == MIXED[:2] and "2 of 6 lines" in v.status.text()
    v.filter_edit.clear()
    v.problems_only.setChecked(True)
    assert v.shown_lines() == [MIXED[1], MIXED[2], MIXED[4]]
    assert v.copy() == "\n".join([MIXED[1], MIXED[2], MIXED[4]])  # nothing selected: all shown lines
    assert QApplication.clipboard().text() == v.copy()
    assert v.save(tmp_path / "filtered.log") == 3
    v.problems_only.setChecked(False)
    sel = v.view.selectionModel()
    for r in (0, 3):
        sel.select(v.text_proxy.index(r, 0), QItemSelectionModel.SelectionFlag.Select)
    assert v.copy() == f"{MIXED[0]}\n{MIXED[3]}"
    assert v.save(tmp_path / "all.log") == 6
    assert (tmp_path / "all.log").read_text() == "".join(ln + "\n" for ln in MIXED)
    v.clear()
    assert v.model.rowCount() == 0


def test_follows_the_tail_only_at_the_bottom(qtbot: QtBot) -> None:
    v = _view(qtbot, flush_ms=10)
    sb = v.view.verticalScrollBar()
    v.append_lines([f"first {i}" for i in range(300)])
    _flush(qtbot, v.model)
    qtbot.waitUntil(lambda: sb.maximum() > 0 and sb.value() == sb.maximum(), timeout=2000)
    sb.setValue(10)  # the user scrolls up to read
    v.append_lines([f"more {i}" for i in range(300)])
    _flush(qtbot, v.model)
    qtbot.wait(50)
    assert sb.value() == 10 and sb.maximum() > 10
    sb.setValue(sb.maximum())  # back at the bottom: follow again
    v.append_lines([f"again {i}" for i in range(300)])
    _flush(qtbot, v.model)
    qtbot.waitUntil(lambda: sb.value() == sb.maximum(), timeout=2000)
    newest = v.view.visualRect(v.text_proxy.index(v.text_proxy.rowCount() - 1, 0))
    assert 0 <= newest.bottom() <= v.view.viewport().height() + 1  # the newest line is in view


def test_200k_lines_keep_the_event_loop_responsive(qtbot: QtBot, tmp_path: Path) -> None:
    n = 200_000
    script = tmp_path / "spam.py"
    script.write_text(
        "import sys\n"
        "w = sys.stdout.write\n"
        f"for i in range({n}):\n"
        "    w(f'0.00.{i % 1000:03d}.000 I slot update_slots: id  0 | task {i} | prompt line {i}\\n')\n"
        "sys.stdout.flush()\n"
    )
    v = _view(qtbot, max_lines=20_000)
    server = ServerProcess()
    v.attach(server)
    ticks: list[float] = []
    timer = QTimer()
    timer.setInterval(10)
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    timer.start()
    peak_pending = 0

    def watch() -> None:
        nonlocal peak_pending
        peak_pending = max(peak_pending, v.model.pending)

    timer.timeout.connect(watch)
    notices: list[str] = []
    server.notice.connect(notices.append)
    cfg = LaunchConfig(executable=sys.executable, server_args=[str(script)], dialect=Dialect.LLAMA_CPP,
                       host=None, verbose_log=False, health_check=False)
    t0 = time.monotonic()
    with qtbot.waitSignal(server.finished, timeout=120_000) as done:
        server.start(cfg)
    _flush(qtbot, v.model)
    qtbot.wait(150)
    timer.stop()
    elapsed = time.monotonic() - t0
    outcome = done.args[0]
    assert outcome.exit_code == 0 and v.model.received == n + len(notices)  # notices: "[launcher] ..."
    assert v.model.rowCount() == 20_000 and v.model.lines()[-1].endswith(f"line {n - 1}")
    assert peak_pending <= 20_000 and len(outcome.tail) <= 2000  # memory stays bounded
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    print(f"\n200k lines in {elapsed:.2f} s, {len(ticks)} ticks, max gap {max(gaps) * 1000:.1f} ms, "
          f"batch max {BATCH_MAX}")
    assert max(gaps) < 0.100, f"event loop stalled for {max(gaps) * 1000:.0f} ms"
