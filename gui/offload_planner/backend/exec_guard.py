"""The first thing a child of the planner runs on Linux: tie it to the planner's life, then become the
program.

``python -I -S exec_guard.py PARENT_PID LC_CTYPE PROGRAM [ARGS...]`` (frozen app:
``offload-planner --exec-guard PARENT_PID ...``) asks the kernel to SIGKILL this process when the
thread that started it dies (``prctl(PR_SET_PDEATHSIG)``), gives up if the planner is already gone,
puts itself in a new process group, restores what the Python interpreter changed (``LC_CTYPE``, the
ignored SIGPIPE and SIGXFSZ) and ``exec``\\ s PROGRAM, which keeps the PID, the death signal and the
group.  ``PARENT_PID`` 0 skips the death signal (the starter was a thread that may end first).
``LC_CTYPE`` is ``-`` when it was unset, else ``=`` and its value.

Standard library only, no package imports: it runs under ``-I -S`` and in the frozen app before
anything else.  :mod:`offload_planner.backend.child_guard` builds these command lines.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

FLAG = "--exec-guard"
NO_PARENT = "0"
UNSET = "-"
PR_SET_PDEATHSIG = 1
EXIT_PARENT_GONE = 137  # as if the death signal had killed it
EXIT_CANNOT_RUN = 127


def set_parent_death_signal(sig: int) -> bool:
    """Ask Linux to send ``sig`` when the starting thread dies; False where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def restore_environment(lc_ctype: str) -> None:
    """Undo the interpreter's start-up changes the program would inherit."""
    if lc_ctype == UNSET:
        os.environ.pop("LC_CTYPE", None)
    else:
        os.environ["LC_CTYPE"] = lc_ctype[1:]
    for name in ("SIGPIPE", "SIGXFSZ"):
        sig = getattr(signal, name, None)
        if sig is not None:
            signal.signal(sig, signal.SIG_DFL)


def main(argv: Sequence[str]) -> NoReturn:
    if sys.platform == "win32":  # Windows children are tied to the planner by a job object instead
        raise SystemExit("exec_guard: POSIX only")
    if len(argv) < 3:
        sys.stderr.write("exec_guard: usage: PARENT_PID LC_CTYPE PROGRAM [ARGS...]\n")
        os._exit(2)
    parent, lc_ctype, program, *args = argv
    if parent != NO_PARENT:
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != int(parent):  # the planner died before the death signal was armed
            os._exit(EXIT_PARENT_GONE)
    os.setpgid(0, 0)
    restore_environment(lc_ctype)
    try:
        os.execv(program, [program, *args])
    except OSError as e:
        sys.stderr.write(f"cannot run {program}: {e.strerror or e}\n")
        sys.stderr.flush()
        os._exit(EXIT_CANNOT_RUN)


if __name__ == "__main__":
    main(sys.argv[1:])
