"""Every process the planner starts goes through here, so that it dies with the planner however the
planner ends: Ctrl-C, SIGTERM, SIGHUP, SIGKILL or a crash.

* Linux: the child first runs :mod:`~offload_planner.backend.exec_guard` (a few milliseconds of
  Python, then ``exec``): the kernel SIGKILLs it when the thread that started it dies, and it leads
  its own process group, which :func:`kill_group` ends after the program itself has exited.  The
  death signal follows the starting *thread*, so it is armed only for children started from the
  main thread (where the runner and the CLI live); children of other threads still get the group.
* Windows: each child is assigned to one job object with ``JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE``
  whose only handle the planner holds, so Windows ends the children when the planner's handles
  close, however it exits.  This path is type-checked (``mypy --platform win32``) but not run by the
  tests, which run on Linux.
* macOS and other POSIX systems: own process group only (their kernels have no death signal).

QProcess users call :func:`guard` for the program and arguments to start and :func:`adopt` once
the process has a PID; :func:`popen`, :func:`run` and :func:`output_of` do both for ``subprocess``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from offload_planner.backend import exec_guard


@dataclass(frozen=True)
class GuardedCommand:
    """What to start instead of ``program arguments``."""

    program: str
    arguments: tuple[str, ...]
    own_group: bool  # the child leads its own process group (its PID is the group's ID)
    dies_with_parent: bool  # the kernel kills it when the starting thread dies


def _shim_prefix() -> list[str] | None:
    """How to run :mod:`exec_guard`: the frozen app's own entry point, else this interpreter."""
    if not sys.executable:
        return None
    if getattr(sys, "frozen", False):
        return [sys.executable, exec_guard.FLAG]
    return [sys.executable, "-I", "-S", os.path.abspath(exec_guard.__file__)]


def _resolve(program: str) -> str | None:
    """The executable ``program`` names (PATH is searched for bare names), or None."""
    if os.sep in program:
        return os.path.abspath(program) if os.path.isfile(program) and os.access(program, os.X_OK) else None
    return shutil.which(program)


def guard(program: str, arguments: Sequence[str], env: Mapping[str, str] | None = None) -> GuardedCommand:
    """The command that starts ``program arguments`` tied to this process.  A program that cannot be
    found is returned as is, so that the caller's own start-up error reports it."""
    resolved = _resolve(program)
    prefix = _shim_prefix() if sys.platform != "win32" else None
    if prefix is None or resolved is None:
        return GuardedCommand(program, tuple(arguments), False, sys.platform == "win32")
    main_thread = threading.current_thread() is threading.main_thread()
    parent = str(os.getpid()) if main_thread else exec_guard.NO_PARENT
    environ = os.environ if env is None else env
    lc_ctype = "=" + environ["LC_CTYPE"] if "LC_CTYPE" in environ else exec_guard.UNSET
    linux = sys.platform.startswith("linux")
    return GuardedCommand(prefix[0], (*prefix[1:], parent, lc_ctype, resolved, *arguments), True,
                          linux and main_thread)


def kill_group(pid: int | None) -> None:
    """SIGKILL what is left of the process group a guarded child led (call after it exited)."""
    if pid is None or sys.platform == "win32":
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


#: How long :func:`freeze_tree` waits for the processes it stopped to be stopped
FREEZE_WAIT = 0.5


def freeze_tree(pid: int, wait: float = FREEZE_WAIT) -> dict[int, float]:
    """Stop (SIGSTOP) ``pid`` and every process below it, listing them again until no new one appears,
    and return the descendants (PID -> start time) for a SIGKILL each. A list taken while they run
    misses a child forked between the list and the kill (in a session of its own it outlives the group
    kill too); stopped processes fork nothing. Windows: the list only (no SIGSTOP)."""
    import psutil

    seen: dict[int, float] = {}
    try:
        root = psutil.Process(pid)
    except psutil.Error:
        return seen
    sig = getattr(signal, "SIGSTOP", None)
    frozen: set[int] = set()
    deadline = time.monotonic() + wait
    while True:
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            tree = [root]
        for p in tree[1:]:
            with contextlib.suppress(psutil.Error):
                seen.setdefault(p.pid, p.create_time())
        new = [p for p in tree if p.pid not in frozen]
        if sig is None or not new:
            return seen
        for p in new:
            frozen.add(p.pid)
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)
        _wait_stopped(new, deadline)
        if time.monotonic() >= deadline:
            return seen


def _wait_stopped(procs: Sequence[Any], deadline: float) -> None:
    """Until each of ``procs`` is stopped or gone (a fork under way completes first), or ``deadline``."""
    import psutil

    done = (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD,
            getattr(psutil, "STATUS_TRACING_STOP", ""))
    waiting = list(procs)
    while waiting and time.monotonic() < deadline:
        still = []
        for p in waiting:
            try:
                if p.status() not in done:
                    still.append(p)
            except psutil.Error:
                pass
        waiting = still
        if waiting:
            time.sleep(0.001)


#: prctl option: orphans below this process are reparented to it rather than to init (Linux 3.4+)
PR_SET_CHILD_SUBREAPER = 36


#: PIDs of the children the planner started (POSIX: recorded by :func:`adopt`)
_spawned: set[int] = set()
_subreaper = [False]


def become_subreaper() -> bool:
    """Linux: make this process the child subreaper of what it starts, so that a grandchild whose parent
    exits (a child llama-server started with ``setsid``, outside the group :func:`kill_group` ends)
    becomes this process's child, which :func:`end_adopted` can find; False elsewhere (Windows's job
    object already holds such grandchildren; macOS has no subreaper: they escape). ``launch`` and the
    window call it once at start; the runner then ends such orphans when its server has finished."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        _subreaper[0] = bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False
    return _subreaper[0]


def is_subreaper() -> bool:
    return _subreaper[0]


def children_now() -> frozenset[int]:
    """This process's children now (to pass to :func:`end_adopted` as those to leave alone)."""
    import psutil

    try:
        return frozenset(c.pid for c in psutil.Process().children())
    except psutil.Error:
        return frozenset()


def end_adopted(keep: frozenset[int] = frozenset(), wait: float = FREEZE_WAIT) -> list[int]:
    """Stop (SIGSTOP), SIGKILL and reap every child of this process that it did not start (:func:`adopt`)
    and that is not in ``keep``, and everything below it: after :func:`become_subreaper`, the orphans a
    finished server left.  Returns their PIDs."""
    if not sys.platform.startswith("linux"):
        return []
    import psutil

    me = psutil.Process()
    frozen: dict[int, Any] = {}
    deadline = time.monotonic() + wait
    _spawned.intersection_update(c.pid for c in _children(me))  # the others ended (their PIDs may return)
    while True:
        try:
            tops = [c for c in me.children() if c.pid not in keep and c.pid not in _spawned]
            tree = [p for c in tops for p in (c, *_below(c))]
        except psutil.Error:
            tree = []
        new = [p for p in tree if p.pid not in frozen]
        if not new or time.monotonic() >= deadline:
            break
        for p in new:
            frozen[p.pid] = p
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGSTOP)
        _wait_stopped(new, deadline)
    for p in frozen.values():
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
    _reap(set(frozen), time.monotonic() + 2.0)
    return sorted(frozen)


def _children(proc: Any) -> list[Any]:
    import psutil

    try:
        return list(proc.children())
    except psutil.Error:
        return []


def _below(proc: Any) -> list[Any]:
    import psutil

    try:
        return list(proc.children(recursive=True))
    except psutil.Error:
        return []


def _reap(pids: set[int], deadline: float) -> None:
    """Wait for each of ``pids`` that is (or becomes, as its killed parent is reaped) this process's child."""
    if not sys.platform.startswith("linux"):
        return
    while pids and time.monotonic() < deadline:
        for pid in list(pids):
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    pids.discard(pid)
            except ChildProcessError:  # not (yet) ours: gone, or its killed parent not reaped yet
                if not _exists(pid):
                    pids.discard(pid)
        if pids:
            time.sleep(0.005)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _start(args: Sequence[str], **kwargs: Any) -> tuple[subprocess.Popen[Any], GuardedCommand]:
    cmd = guard(args[0], args[1:], kwargs.get("env"))
    proc = subprocess.Popen([cmd.program, *cmd.arguments], **kwargs)
    adopt(proc.pid)
    return proc, cmd


def popen(args: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """:class:`subprocess.Popen` of a guarded command (``kwargs`` as for Popen, no shell)."""
    return _start(args, **kwargs)[0]


def run(args: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
        cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """:func:`subprocess.run` with ``capture_output=True, text=True`` (undecodable bytes replaced):
    on :class:`subprocess.TimeoutExpired` the child and its group are killed."""
    proc, cmd = _start(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, errors="replace", env=env, cwd=cwd)
    out, err = _communicate(proc, cmd, timeout)
    return subprocess.CompletedProcess(list(args), proc.returncode, out, err)


#: The most output :func:`output_of` keeps (llama-server's --help is about 40 KB)
OUTPUT_LIMIT = 4 << 20


def output_of(args: Sequence[str], timeout: float, limit: int = OUTPUT_LIMIT) -> str:
    """Run ``args`` to completion and return stdout and stderr (merged, decoded with replacement).
    Raises OSError when it cannot start or prints more than ``limit`` characters (a program flooding
    its output was read whole into memory until the timeout: 100 MB took 8 s, an endless one filled
    the memory), and :class:`subprocess.TimeoutExpired` after ``timeout`` seconds; in both the child
    and its group are killed."""
    if _resolve(args[0]) is None:
        raise FileNotFoundError(2, "not found or not executable", args[0])
    proc, cmd = _start(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, errors="replace")
    read: list[str] = []
    size = [0]

    def pump() -> None:
        assert proc.stdout is not None
        while size[0] <= limit:
            chunk = proc.stdout.read(1 << 16)
            if not chunk:
                return
            read.append(chunk)
            size[0] += len(chunk)

    reader = threading.Thread(target=pump, name="offload-planner output", daemon=True)
    deadline = time.monotonic() + timeout
    with proc:
        reader.start()
        reader.join(timeout)
        exited = not reader.is_alive() and size[0] <= limit and _waited(proc, deadline - time.monotonic())
        if cmd.own_group:  # what it left running (a child holding its output, one it let go of)
            kill_group(proc.pid)
        if not exited:  # still printing, or it closed its output and did not exit (it was waited for
            proc.kill()  # without a limit: a --version that closed its output hung launch for ever)
            proc.wait()
            reader.join(5)
            if size[0] > limit:
                raise OSError(errno.EFBIG, f"printed more than {limit >> 20} MiB for {' '.join(args[1:])} "
                                           "(not a llama-server?)")
            raise subprocess.TimeoutExpired([cmd.program, *cmd.arguments], timeout)
    return "".join(read)


def _waited(proc: subprocess.Popen[Any], seconds: float) -> bool:
    """``proc`` exited within ``seconds`` (reaped)."""
    try:
        proc.wait(max(0.0, seconds))
    except subprocess.TimeoutExpired:
        return False
    return True


def _communicate(proc: subprocess.Popen[str], cmd: GuardedCommand, timeout: float) -> tuple[str, str]:
    with proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            if cmd.own_group:
                kill_group(proc.pid)  # not reaped yet: the group ID is still this child's
            proc.kill()
            proc.wait()
            raise
    return out or "", err or ""


if sys.platform == "win32":
    import ctypes
    from ctypes import wintypes

    _JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS = 9
    _JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE = 0x2000
    _PROCESS_SET_QUOTA = 0x0100
    _PROCESS_TERMINATE = 0x0001

    class _BasicLimits(ctypes.Structure):
        _fields_ = [
            ("PerProcessUserTimeLimit", ctypes.c_int64),
            ("PerJobUserTimeLimit", ctypes.c_int64),
            ("LimitFlags", wintypes.DWORD),
            ("MinimumWorkingSetSize", ctypes.c_size_t),
            ("MaximumWorkingSetSize", ctypes.c_size_t),
            ("ActiveProcessLimit", wintypes.DWORD),
            ("Affinity", ctypes.c_size_t),
            ("PriorityClass", wintypes.DWORD),
            ("SchedulingClass", wintypes.DWORD),
        ]

    class _IoCounters(ctypes.Structure):
        _fields_ = [(name, ctypes.c_uint64) for name in (
            "ReadOperationCount", "WriteOperationCount", "OtherOperationCount",
            "ReadTransferCount", "WriteTransferCount", "OtherTransferCount")]

    class _ExtendedLimits(ctypes.Structure):
        _fields_ = [
            ("BasicLimitInformation", _BasicLimits),
            ("IoInfo", _IoCounters),
            ("ProcessMemoryLimit", ctypes.c_size_t),
            ("JobMemoryLimit", ctypes.c_size_t),
            ("PeakProcessMemoryUsed", ctypes.c_size_t),
            ("PeakJobMemoryUsed", ctypes.c_size_t),
        ]

    _job_handle: int | None = None

    def _kill_on_close_job() -> int | None:
        """The planner's job (created once; its handle is never closed while the planner lives)."""
        global _job_handle
        if _job_handle is None:
            kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
            job = kernel32.CreateJobObjectW(None, None)
            if not job:
                return None
            info = _ExtendedLimits()
            info.BasicLimitInformation.LimitFlags = _JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
            if not kernel32.SetInformationJobObject(job, _JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS,
                                                    ctypes.byref(info), ctypes.sizeof(info)):
                kernel32.CloseHandle(job)
                return None
            _job_handle = int(job)
        return _job_handle

    def adopt(pid: int | None) -> None:
        """Put the child in the planner's kill-on-close job (children it starts later follow)."""
        job = _kill_on_close_job() if pid else None
        if job is None:
            return
        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
        handle = kernel32.OpenProcess(_PROCESS_SET_QUOTA | _PROCESS_TERMINATE, False, pid)
        if handle:
            kernel32.AssignProcessToJobObject(job, handle)
            kernel32.CloseHandle(handle)

else:

    def adopt(pid: int | None) -> None:
        """Remember ``pid`` as started by the planner (:func:`end_adopted` leaves it alone); the child
        tied itself to the planner (:mod:`exec_guard`)."""
        if pid:
            _spawned.add(pid)
