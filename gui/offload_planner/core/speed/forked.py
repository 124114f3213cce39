"""One piece of work run beside the caller in a forked child process (the model already open, nothing
to load again), on a second core.

Used by ``offload-planner fit`` for llama.cpp's ``--fit`` baseline: its port's dry runs are a chain
(each depends on the last) that takes longer than the search itself, and neither reads the other's
state, so the two run at once.  Only where it is safe and useful: Linux (``fork`` without ``exec``;
macOS and Windows run the work in the caller), a process with one thread (a fork copies no other
thread, so any lock they hold would stay held in the child) and more than one core to run on.

Robust by construction:

- the child dies with its parent (``PR_SET_PDEATHSIG``), and the parent kills and reaps it when it
  leaves early (an exception, Ctrl-C; see :meth:`Forked.close`);
- the child never writes to the parent's streams: its result (or nothing) goes through a pipe and it
  leaves with ``os._exit``, flushing no buffer it inherited;
- anything else than a clean result from the child (an exception, a crash, a result that does not
  pickle) makes :meth:`Forked.result` run the work again in the caller, which then returns the same
  value or raises the very error (with its traceback) that running it there in the first place
  would have: one message, never two, and a result identical to the sequential one, as the work
  is a function of the state both processes share at the fork.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Generic, TypeVar

T = TypeVar("T")

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def fork_useful() -> bool:
    """Forking is safe here (Linux, one thread) and a second core can take the work."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False
    if threading.active_count() != 1:
        return False
    try:
        return len(os.sched_getaffinity(0)) > 1
    except (AttributeError, OSError):
        return (os.cpu_count() or 1) > 1


def _die_with_parent(parent: int) -> None:
    """Ask the kernel to kill this child when its parent dies; leave at once if it already has."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the work is short and a closed pipe ends it
        pass
    if os.getppid() != parent:
        os._exit(1)


def _child(fn: Callable[[], object], w: int, parent: int) -> None:
    """Run ``fn`` and send ``(value, CPU seconds)`` through ``w``; never returns."""
    code = 1
    try:
        _die_with_parent(parent)
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C ends the child quietly; the parent reports
        c0 = time.process_time()
        value = fn()
        data = pickle.dumps((value, time.process_time() - c0), protocol=pickle.HIGHEST_PROTOCOL)
        with os.fdopen(w, "wb") as f:
            f.write(data)
        code = 0
    except BaseException:  # whatever it is, the parent runs the work again and says it
        pass
    finally:
        os._exit(code)


class Forked(Generic[T]):
    """``fn()`` started in a forked child (where :func:`fork_useful`), else run when asked for.

    ``with Forked(fn) as job: ... value = job.result()``; :attr:`cpu_seconds` is the work's CPU time
    (the child's when it ran there), :attr:`forked` says whether a child was started and
    :attr:`in_child` whether the value came from it."""

    def __init__(self, fn: Callable[[], T], *, fork: bool = True) -> None:
        self._fn = fn
        self._pid = 0
        self._r = -1
        self.cpu_seconds = 0.0
        self.in_child = False  # the value came from the child
        self._done: tuple[T] | None = None
        if fork and fork_useful():
            parent = os.getpid()
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                _child(fn, w, parent)
            os.close(w)
            self._pid, self._r = pid, r
        self.forked = bool(self._pid)  # a child was started

    def result(self) -> T:
        """The work's value: the child's, else (no child, or it failed) computed here; once."""
        if self._done is None:
            self._done = (self._result(),)
        return self._done[0]

    def pending(self) -> bool:
        """A child is still at work (its result not yet written)."""
        if not self._pid or self._r < 0:
            return False
        return not select.select([self._r], [], [], 0)[0]

    def _result(self) -> T:
        if self._pid:
            try:
                with os.fdopen(self._r, "rb") as f:
                    self._r = -1
                    data = f.read()
            except BaseException:  # Ctrl-C while waiting: the child goes too
                self.close()
                raise
            if self._reap(kill=False) and data:
                loaded: tuple[T, float] = pickle.loads(data)
                self.in_child = True
                self.cpu_seconds = loaded[1]
                return loaded[0]
        c0 = time.process_time()
        value = self._fn()
        self.cpu_seconds = time.process_time() - c0
        return value

    def _reap(self, *, kill: bool) -> bool:
        """Wait for the child (killing it first with ``kill``): True when it exited cleanly."""
        pid, self._pid = self._pid, 0
        if not pid:
            return False
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            return False
        return os.waitstatus_to_exitcode(status) == 0

    def close(self) -> None:
        """Kill and reap a child whose result was not asked for."""
        if self._r >= 0:
            os.close(self._r)
            self._r = -1
        self._reap(kill=True)

    def __enter__(self) -> Forked[T]:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
