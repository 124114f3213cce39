"""child_guard: a process the planner starts dies with it however the planner ends.

Each test runs a small Python "planner" as a subprocess that starts a child through
:mod:`offload_planner.backend.child_guard` (or a test rpc-server through tests/support), prints the
child's PID, and is then killed; the child must be gone within 2 s.  Linux only (the death signal).
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from tests.support.procs import running, still_running

from offload_planner.backend import child_guard, exec_guard

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the death signal is Linux's")

ROOT = Path(__file__).resolve().parents[2]
SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


Planner = Callable[[str], tuple[subprocess.Popen[str], list[int]]]


@pytest.fixture
def planner(tmp_path: Path) -> Iterator[Planner]:
    """Start a Python process running ``body`` (which prints child PIDs, one per line); returns it
    with the PIDs it printed.  Whatever happens, it is killed at the end of the test."""
    started: list[subprocess.Popen[str]] = []

    def start(body: str) -> tuple[subprocess.Popen[str], list[int]]:
        proc = _stand_in(body, tmp_path)
        started.append(proc)
        return proc, _pids(proc)

    yield start
    for proc in started:
        proc.kill()
        proc.wait(10)


def _stand_in(body: str, tmp_path: Path) -> subprocess.Popen[str]:
    code = "import sys, time\n" + textwrap.dedent(body) + "\nprint('ready', flush=True)\ntime.sleep(120)\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "gui"), str(ROOT)])}
    return child_guard.popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env,
                             cwd=tmp_path)


def _pids(proc: subprocess.Popen[str]) -> list[int]:
    assert proc.stdout is not None
    pids = []
    for line in proc.stdout:
        if line.strip() == "ready":
            return pids
        pids.append(int(line))
    proc.wait(10)
    pytest.fail(f"the planner stand-in exited with {proc.returncode} before starting its children")


START_CHILD = f"""
from offload_planner.backend import child_guard
child = child_guard.popen({SLEEPER!r})
print(child.pid, flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGSEGV],
                         ids=lambda s: signal.Signals(s).name)
def test_the_child_dies_with_the_planner(sig: int, planner: Planner) -> None:
    stand_in, (child,) = planner(START_CHILD)
    assert running(child) and psutil.Process(child).ppid() == stand_in.pid
    stand_in.send_signal(sig)
    stand_in.wait(10)
    assert still_running([child], within=2.0) == []


def test_test_rpc_servers_die_with_the_test_process(llama_bin_dir: Path, tmp_path: Path,
                                                    planner: Planner) -> None:
    """tests/support starts rpc-servers and llama-servers through the same guard: a SIGKILLed pytest
    leaves none behind."""
    stand_in, (rpc,) = planner(f"""
        from pathlib import Path
        from tests.support.rpc import rpc_servers
        ctx = rpc_servers(Path({str(llama_bin_dir)!r}), 1, Path({str(tmp_path)!r}))
        ctx.__enter__()
        import psutil
        print(psutil.Process().children()[0].pid, flush=True)
    """)
    assert "rpc-server" in psutil.Process(rpc).name()
    stand_in.kill()
    stand_in.wait(10)
    assert still_running([rpc], within=2.0) == []


def test_the_child_leads_its_own_group_with_the_environment_untouched() -> None:
    """Its own process group; no LC_CTYPE from the locale coercion of the interpreter that ran
    exec_guard; SIGPIPE and SIGXFSZ not ignored (that interpreter ignores them)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LC_ALL", "LC_CTYPE")}
    env["LANG"] = "C"
    script = 'env; grep SigIgn /proc/self/status; echo "group $(cut -d" " -f5 /proc/$$/stat) pid $$"'
    proc = child_guard.popen(["sh", "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0
    assert "LANG=C" in out.splitlines() and not any(ln.startswith("LC_CTYPE=") for ln in out.splitlines())
    ignored = int(re.search(r"SigIgn:\s*([0-9a-f]+)", out)[1], 16)  # type: ignore[index]
    assert ignored & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1)) == 0
    assert f"group {proc.pid} pid {proc.pid}" in out


def test_a_child_of_a_short_lived_thread_outlives_the_thread() -> None:
    """The death signal follows the starting thread: it is armed only from the main thread."""
    started: list[subprocess.Popen[bytes]] = []
    guarded: list[child_guard.GuardedCommand] = []

    def work() -> None:
        guarded.append(child_guard.guard(SLEEPER[0], SLEEPER[1:]))
        started.append(child_guard.popen(SLEEPER))

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    (child,) = started
    try:
        time.sleep(0.5)
        assert child.poll() is None
        assert guarded[0].own_group and not guarded[0].dies_with_parent
        assert child_guard.guard(SLEEPER[0], SLEEPER[1:]).dies_with_parent
    finally:
        child.kill()
        child.wait(10)


def test_a_planner_that_died_before_the_signal_was_armed_starts_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    r = subprocess.run([sys.executable, "-I", "-S", exec_guard.__file__, "1", exec_guard.UNSET,
                        "/usr/bin/touch", str(marker)], timeout=20)
    assert r.returncode == exec_guard.EXIT_PARENT_GONE and not marker.exists()


def test_a_missing_program_is_left_to_the_caller_to_report(tmp_path: Path) -> None:
    cmd = child_guard.guard(str(tmp_path / "nope"), ["-x"])
    assert (cmd.program, cmd.arguments, cmd.own_group) == (str(tmp_path / "nope"), ("-x",), False)
    with pytest.raises(FileNotFoundError):
        child_guard.output_of([str(tmp_path / "nope")], timeout=5)


def test_output_of_kills_the_whole_group_on_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild"
    script = f"import subprocess, sys, time; p = subprocess.Popen({SLEEPER!r}); " \
             f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(120)"
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        child_guard.output_of([sys.executable, "-c", script], timeout=3)
    assert time.monotonic() - t0 < 10
    assert still_running([int(pidfile.read_text())], within=2.0) == []


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is in the test extra")
def test_the_windows_job_object_path_type_checks() -> None:
    """The kill-on-close job object cannot run here; mypy checks it as Windows would see it."""
    files = [child_guard.__file__, exec_guard.__file__]
    r = subprocess.run([sys.executable, "-m", "mypy", "--platform", "win32", *files], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_run_captures_both_streams_like_subprocess_run(tmp_path: Path) -> None:
    script = ("import sys; print('out'); print('err', file=sys.stderr); sys.stdout.flush(); "
              "sys.stdout.buffer.write(b'\\xff'); sys.exit(3)")
    r = child_guard.run([sys.executable, "-c", script], timeout=20, cwd=str(tmp_path))
    assert (r.returncode, r.stdout, r.stderr) == (3, "out\n\ufffd", "err\n")
    with pytest.raises(subprocess.TimeoutExpired):
        child_guard.run([*SLEEPER], timeout=0.5)


def test_output_of_a_flooding_program_is_cut_and_refused(tmp_path: Path) -> None:
    """A program answering --version with endless output (``yes``) was read whole into memory until
    the timeout; now it is killed past OUTPUT_LIMIT characters with one OSError saying so (newcomer4).
    Output under the limit is returned whole."""
    import errno

    flood = tmp_path / "flood"
    flood.write_text("#!/bin/sh\nexec yes llama-server-flood\n")
    flood.chmod(0o755)
    t0 = time.monotonic()
    with pytest.raises(OSError) as ei:
        child_guard.output_of([str(flood), "--version"], timeout=30, limit=1 << 20)
    assert time.monotonic() - t0 < 10
    assert ei.value.errno == errno.EFBIG and "printed more than 1 MiB for --version" in str(ei.value)
    out = child_guard.output_of([sys.executable, "-c", "print('x' * 900_000 + 'end')"], timeout=30,
                                limit=1 << 20)
    assert out == "x" * 900_000 + "end\n"
