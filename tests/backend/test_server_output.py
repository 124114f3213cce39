"""A backend that prints megabytes without a newline, or binary garbage, through the whole path:
``offload-planner launch`` streams its log to our stdout, the window's runner and log view show it.

Issue 12 measured 44 s and 202 MB for 30 MB without a newline (quadratic) and 974 KB of raw escape
codes sent to the terminal.  Here the planner's peak memory (``wait4``'s ``ru_maxrss``) for 32 MiB
may exceed that for 1 MiB by at most 24 MiB, its output stays small, and no control byte reaches it.
Timing is left to bench/log_throughput.py.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from pytestqt.qtbot import QtBot
from tests.support.procs import free_port

from offload_planner.backend.log_lines import CUT_MARK, LINE_LIMIT, MAX_LINE_CHARS, dropped_note
from offload_planner.backend.runner import LaunchConfig, LaunchOutcome, ServerProcess
from offload_planner.core.cmdline import Dialect
from offload_planner.core.units import MiB
from offload_planner.ui.log_view import LogView

ROOT = Path(__file__).resolve().parents[2]
#: Bytes a terminal must not receive from us: C0 controls but tab and newline, DEL.
RAW_CONTROL = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")
#: The same as text, plus C1 controls, separators and bidi overrides.
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def fake_backend(tmp_path: Path) -> Path:
    """A "llama-server" that answers --version/--help, then prints $MODE output and exits 1:
    ``flood:N`` N MiB of "x" without a newline, ``garbage:N`` N MiB of seeded random bytes."""
    exe = tmp_path / "llama-server"
    exe.write_text(f"#!{sys.executable}\n" + textwrap.dedent("""
        import os, random, sys
        if sys.argv[1:] in (["--version"], ["--help"]):
            print("version: 1 (fake)")
            sys.exit(0)
        mode, mib = os.environ["MODE"].split(":")
        out = sys.stdout.buffer
        rng = random.Random(7)
        for _ in range(int(mib) * 16):
            out.write(b"x" * 65536 if mode == "flood" else rng.randbytes(65536))
        out.flush()
        sys.exit(1)
    """))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def _launch(exe: Path, mode: str, tmp_path: Path) -> tuple[int, bytes, bytes, int]:
    """Run ``offload-planner launch`` on the fake backend: exit code, stdout, stderr, peak RSS in KiB."""
    env = {**os.environ, "MODE": mode, "PYTHONPATH": str(ROOT / "gui"),
           "OFFLOAD_PLANNER_CONFIG_DIR": str(tmp_path / "cfg")}
    out, err = tmp_path / f"{mode}.out", tmp_path / f"{mode}.err"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen([sys.executable, "-m", "offload_planner", "launch", str(tmp_path / "m.gguf"),
                                 "--server", str(exe), "--no-detect", "--port", str(free_port()), "--",
                                 "-c", "512"], stdin=subprocess.DEVNULL, stdout=o, stderr=e, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, out.read_bytes(), err.read_bytes(), usage.ru_maxrss


@pytest.mark.skipif(sys.platform == "win32", reason="os.wait4")
def test_cli_output_without_newlines_costs_bounded_memory(tmp_path: Path) -> None:
    exe = fake_backend(tmp_path)
    code_small, out_small, _, rss_small = _launch(exe, "flood:1", tmp_path)
    code, out, err, rss = _launch(exe, "flood:32", tmp_path)
    assert code_small == code == 3, err.decode(errors="replace")[-2000:]
    text = out.decode()
    assert text.splitlines() == ["x" * (LINE_LIMIT - len(CUT_MARK)) + CUT_MARK, dropped_note(32 * MiB - 4096)]
    assert out_small.decode().splitlines()[-1] == dropped_note(MiB - 4096)
    print(f"peak RSS of the planner: {rss_small / 1024:.0f} MiB for 1 MiB, {rss / 1024:.0f} MiB for 32 MiB")
    assert rss - rss_small < 24 * 1024


@pytest.mark.skipif(sys.platform == "win32", reason="os.wait4")
def test_cli_shows_binary_garbage_escaped(tmp_path: Path) -> None:
    code, out, err, _ = _launch(fake_backend(tmp_path), "garbage:1", tmp_path)
    assert code == 3
    for stream in (out, err):
        assert b"\x1b" not in stream and not RAW_CONTROL.search(stream)
        assert not UNSAFE.search(stream.decode("utf-8"))
    assert out.count(b"\\x1b") > 100 and len(out) < 8 * MiB
    assert all(len(line) <= LINE_LIMIT for line in out.decode().splitlines())


def test_window_log_shows_garbage_escaped(qtbot: QtBot, tmp_path: Path) -> None:
    view = LogView(flush_ms=10)
    qtbot.addWidget(view)
    sp = ServerProcess()
    view.attach(sp)
    cfg = LaunchConfig(executable=str(fake_backend(tmp_path)), dialect=Dialect.LLAMA_CPP, host=None,
                       verbose_log=False, health_check=False, env={"MODE": "garbage:1"})
    try:
        with qtbot.waitSignal(sp.finished, timeout=60_000) as done:
            sp.start(cfg)
    finally:
        sp.shutdown(2.0)
    outcome = done.args[0]
    assert isinstance(outcome, LaunchOutcome) and outcome.exit_code == 1
    qtbot.waitUntil(lambda: view.model.pending == 0, timeout=10_000)
    rows = view.model.lines()
    assert len(rows) > 100 and all(len(r) <= LINE_LIMIT for r in rows)
    assert not any(UNSAFE.search(r) for r in rows + outcome.tail)
    view.append_lines(["direct \x1b[31m\u202e" + "y" * 10_000])  # lines from anywhere else too
    view.model.flush()
    shown = "direct \\x1b[31m\\u202e" + "y" * 10_000
    assert view.model.lines()[-1] == shown[:MAX_LINE_CHARS] + CUT_MARK
