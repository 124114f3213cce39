"""Work run beside the caller in a forked child (``offload-planner fit`` runs llama.cpp's ``--fit``
that way): the value is the child's, an error in the child surfaces once as the same error the work
raises in the caller, and no child outlives its parent or a result nobody asked for."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from offload_planner.core.speed.forked import Forked, fork_useful

pytestmark = pytest.mark.skipif(not fork_useful(), reason="needs Linux, one thread and two cores")

GUI = Path(__file__).resolve().parents[2] / "gui"


def _gone(pid: int, within: float = 5.0) -> bool:
    """The process has exited (reaped, or a zombie nobody reaps in this container)."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_the_value_comes_from_a_child_and_equals_the_callers() -> None:
    parent = os.getpid()
    big = {"layers": list(range(100_000)), "name": "x" * 70_000}  # more than a pipe's buffer
    with Forked(lambda: (os.getpid(), big)) as job:
        assert job.forked
        pid, value = job.result()
    assert job.in_child and pid != parent
    assert value == big
    assert job.result() == (pid, value), "asked again: the same value, not the work run again"


def test_an_error_in_the_child_is_raised_once_by_the_work_run_in_the_caller(
        capfd: pytest.CaptureFixture[str]) -> None:
    parent = os.getpid()
    runs: list[int] = []

    def work() -> int:
        runs.append(os.getpid())  # the child's append is lost with it: only the caller's counts
        raise ValueError(f"bad command line (in {'the caller' if os.getpid() == parent else 'a child'})")

    with Forked(work) as job, pytest.raises(ValueError, match=r"^bad command line \(in the caller\)$"):
        job.result()
    assert runs == [parent] and not job.in_child
    out, err = capfd.readouterr()
    assert out == "" and err == "", "the child says nothing itself"


def test_a_child_that_crashes_leaves_the_work_to_the_caller() -> None:
    parent = os.getpid()

    def work() -> int:
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return 42

    with Forked(work) as job:
        assert job.result() == 42
    assert not job.in_child


def test_pending_while_the_child_works() -> None:
    go = Path(f"/tmp/forked-test-{os.getpid()}")

    def work() -> str:
        while not go.exists():
            time.sleep(0.01)
        return "done"

    try:
        with Forked(work) as job:
            assert job.pending() and job.pending()
            go.touch()
            end = time.monotonic() + 10
            while job.pending() and time.monotonic() < end:
                time.sleep(0.01)
            assert not job.pending(), "the child wrote its result"
            assert job.result() == "done" and job.in_child
            assert not job.pending()
    finally:
        go.unlink(missing_ok=True)
    assert not Forked(os.getpid, fork=False).pending()


def test_a_result_not_asked_for_ends_its_child() -> None:
    job = Forked(lambda: time.sleep(60))
    pid = job._pid
    assert pid
    t0 = time.monotonic()
    job.close()
    assert time.monotonic() - t0 < 5
    assert _gone(pid)
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped


def test_ctrl_c_while_waiting_ends_the_child() -> None:
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        job = Forked(lambda: time.sleep(60))
        pid = job._pid
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt):
            job.result()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert _gone(pid)


def test_the_child_dies_with_its_parent(tmp_path: Path) -> None:
    started = tmp_path / "started"
    script = textwrap.dedent(f"""
        import os, signal, time
        from pathlib import Path
        from offload_planner.core.speed.forked import Forked
        job = Forked(lambda: (Path({str(started)!r}).touch(), time.sleep(60)))
        while not Path({str(started)!r}).exists():  # the child is at work, its parent alive
            time.sleep(0.01)
        print(job._pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    out = tmp_path / "pid"
    err = tmp_path / "err"
    with out.open("w") as f, err.open("w") as e:  # files, not pipes an orphan would keep open
        r = subprocess.run([sys.executable, "-c", script], stdout=f, stderr=e, timeout=30,
                           env={**os.environ, "PYTHONPATH": str(GUI)})
    assert r.returncode == -signal.SIGKILL, err.read_text()
    pid = int(out.read_text())
    try:
        assert _gone(pid)
    finally:
        if not _gone(pid, within=0):
            os.kill(pid, signal.SIGKILL)


def test_no_fork_beside_other_threads() -> None:
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        with Forked(os.getpid) as job:
            assert not job.forked
            assert job.result() == os.getpid() and not job.in_child
    finally:
        stop.set()
        t.join()


def test_fork_false_runs_in_the_caller() -> None:
    with Forked(os.getpid, fork=False) as job:
        assert not job.forked and job.result() == os.getpid()
