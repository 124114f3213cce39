"""A child llama-server starts in a session of its own (setsid), left running when the server exits by
itself (after launch's SIGTERM, or on its own): launch ends it too. On Linux the launch process is a
child subreaper (prctl PR_SET_CHILD_SUBREAPER), so the orphan becomes its child instead of init's,
and it is stopped, killed and reaped when launch ends. A POSIX script stands in for llama-server
only for this process-tree behaviour (the real one starts no such child)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import pytest
from tests.support.procs import still_running

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the subreaper is Linux's")

QWEN = str(Path(__file__).resolve().parents[2] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf")

#: starts a child in a session of its own (it ignores SIGTERM and SIGHUP, and itself starts a grandchild),
#: writes both PIDs down, then either never listens and exits 0 on SIGTERM, or says it listens and exits
POLITE = ("import os, signal, subprocess, sys, time\n"
          "if '--version' in sys.argv or '--help' in sys.argv:\n"
          "    print('version: 1 (abc)'); sys.exit(0)\n"
          "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
          "kid = ('import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); '\n"
          "       'signal.signal(signal.SIGHUP, signal.SIG_IGN); '\n"
          "       'g = subprocess.Popen([sys.executable, \"-c\", \"import time; time.sleep(120)\"]); '\n"
          "       'print(g.pid, flush=True); time.sleep(120)')\n"
          "k = subprocess.Popen([sys.executable, '-c', kid], start_new_session=True,\n"
          "                     stdout=subprocess.PIPE, text=True)\n"
          "g = k.stdout.readline().strip()\n"
          "open(os.environ['HOSTILE_PIDS'], 'w').write(f'{k.pid} {g}')\n"
          "if os.environ.get('HOSTILE_EXIT'):\n"
          "    print('main: server is listening on http://127.0.0.1:1', flush=True); sys.exit(0)\n"
          "time.sleep(120)\n")


def _script(tmp_path: Path) -> Path:
    exe = tmp_path / "llama-server"
    exe.write_text(f"#!{sys.executable}\n{POLITE}")
    exe.chmod(0o755)
    return exe


@pytest.mark.parametrize("on_its_own", [False, True])
def test_a_child_in_its_own_session_does_not_outlive_launch(tmp_path: Path, on_its_own: bool) -> None:
    from tests.support.cli import run_cli

    pids_file = tmp_path / "pids"
    env = {"HOSTILE_PIDS": str(pids_file), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    if on_its_own:
        env["HOSTILE_EXIT"] = "1"
    t0 = time.monotonic()
    r = run_cli("launch", QWEN, "--server", str(_script(tmp_path)), "--no-detect", "--timeout", "3",
                "--stop-timeout", "5", "--quiet", "--no-verbose-log", "--", "-c", "512", timeout=60, **env)
    pids = [int(p) for p in pids_file.read_text().split()]
    try:
        assert time.monotonic() - t0 < 30 and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert "ignored SIGTERM" not in r.stderr  # it exited by itself
        assert still_running(pids, within=3.0) == [], r.stderr[-2000:]
        assert ("llama-server left 2 processes running outside its process group (in a session of their "
                "own); ended them") in r.stderr, r.stderr[-2000:]
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
