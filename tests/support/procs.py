"""Run an external program for a test: argument list (never a shell), output to a file, wait for a
line, always stop it by PID.  It is started through the planner's own
:mod:`~offload_planner.backend.child_guard`, so it dies with the test process however that ends
(a SIGKILLed pytest leaves no llama-server or rpc-server behind).

::

    with running_process([server, "-m", model, "--port", str(port)], log_path=tmp / "srv.log",
                         ready=r"listening on http://", timeout=60) as proc:
        ...  # talk to it
    text = proc.output()  # everything it printed, after it stopped

``running_process`` raises :class:`ProcessFailed` (with the output's tail) if the program exits
before printing ``ready`` or does not print it within ``timeout`` seconds.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from offload_planner.backend import child_guard

_POLL = 0.05


class ProcessFailed(RuntimeError):
    """The program exited early or never printed what the test waited for."""

    def __init__(self, message: str, output: str) -> None:
        tail = "\n".join(output.splitlines()[-40:])
        super().__init__(f"{message}\n--- last lines of output ---\n{tail}")
        self.output = output


def running(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan nobody reaped yet counts as ended)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def still_running(pids: Sequence[int], within: float) -> list[int]:
    """Those of ``pids`` still running after up to ``within`` seconds (returns early when none is)."""
    deadline = time.monotonic() + within
    while True:
        alive = [p for p in pids if running(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(_POLL)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0, read it, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class RunningProcess:
    args: list[str]
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        """Everything the program wrote to stdout and stderr so far."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for(self, pattern: str | re.Pattern[str], timeout: float) -> re.Match[str]:
        """Block until ``pattern`` appears in the output (``re.search``, multiline)."""
        rx = re.compile(pattern, re.MULTILINE) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        while True:
            m = rx.search(self.output())
            if m:
                return m
            code = self.popen.poll()
            if code is not None:
                m = rx.search(self.output())  # it may have printed it just before exiting
                if m:
                    return m
                raise ProcessFailed(
                    f"{self.args[0]} exited with code {code} before printing {rx.pattern!r}",
                    self.output(),
                )
            if time.monotonic() > deadline:
                raise ProcessFailed(
                    f"{self.args[0]} did not print {rx.pattern!r} within {timeout:.0f} s",
                    self.output(),
                )
            time.sleep(_POLL)

    def stop(self, grace: float = 10.0) -> int:
        """SIGTERM by PID, then SIGKILL after ``grace`` seconds; returns the exit code."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=grace)
        return self.popen.returncode


@contextlib.contextmanager
def running_process(
    args: Sequence[str | os.PathLike[str]],
    *,
    log_path: Path,
    ready: str | re.Pattern[str] | None = None,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[RunningProcess]:
    """Start ``args``, wait for ``ready`` in its output, yield it, and stop it on exit."""
    argv = [os.fspath(a) for a in args]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        popen = child_guard.popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
            cwd=cwd,
        )
    proc = RunningProcess(argv, popen, log_path)
    try:
        if ready is not None:
            proc.wait_for(ready, timeout)
        yield proc
    finally:
        proc.stop()


def run_to_completion(
    args: Sequence[str | os.PathLike[str]],
    *,
    log_path: Path,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
) -> tuple[int, str]:
    """Run ``args`` until it exits (killed by PID after ``timeout``); return (code, output)."""
    with running_process(args, log_path=log_path, env=env) as proc:
        try:
            proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            message = f"{proc.args[0]} still running after {timeout:.0f} s"
            raise ProcessFailed(message, proc.output()) from e
        return proc.popen.returncode, proc.output()
