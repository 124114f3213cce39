"""Reading a backend's output: time per MiB when it prints 4, 8, 16 and 32 MiB without a newline.

A fake "llama-server" (a Python script) prints N MiB of ``x`` in 64 KiB writes and exits; the
planner's :class:`~offload_planner.backend.runner.ServerProcess` reads it (as ``offload-planner
launch`` and the window do) with every line handed on to a sink.  The time is the planner's CPU
time from start to the ``finished`` signal (the fake runs in its own process; other load on the
machine does not count), less that of a run printing nothing, measured in the same run; the wall
time is printed too.  Linear reading gives a 32 MiB / 4 MiB ratio near 8; issue 12 measured
0.5/1.9/9.1/31.6 s before (ratio 63, quadratic).  Then binary garbage (seeded random bytes, lines of
~256 bytes, every control byte escaped and every line parsed) at 1/2/4/8 MiB.

    python bench/log_throughput.py [--sizes 4 8 16 32] [--garbage-sizes 1 2 4 8]
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import tempfile
import textwrap
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QCoreApplication, QEventLoop

from offload_planner.backend.runner import LaunchConfig, ServerProcess
from offload_planner.core.cmdline import Dialect

FAKE = """
import os, random, sys
mode, mib = os.environ["MODE"], int(os.environ["MIB"])
out = sys.stdout.buffer
rng = random.Random(7)
for _ in range(mib * 16):
    out.write(b"x" * 65536 if mode == "flood" else rng.randbytes(65536))
out.flush()
"""


def _fake(folder: Path) -> Path:
    exe = folder / "llama-server"
    exe.write_text(f"#!{sys.executable}\n" + textwrap.dedent(FAKE))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def _seconds(exe: Path, mode: str, mib: int) -> tuple[float, float]:
    """(CPU seconds of this process, wall seconds) for one run."""
    sp = ServerProcess()
    received = [0]
    sp.linesReceived.connect(lambda lines: received.__setitem__(0, received[0] + sum(map(len, lines))))
    loop = QEventLoop()
    sp.finished.connect(lambda _outcome: loop.quit())
    cfg = LaunchConfig(executable=str(exe), dialect=Dialect.LLAMA_CPP, host=None, verbose_log=False,
                       health_check=False, env={"MODE": mode, "MIB": str(mib)})
    cpu, wall = time.process_time(), time.perf_counter()
    sp.start(cfg)
    loop.exec()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    sp.shutdown(2.0)
    sp.deleteLater()
    return cpu, wall


def _report(exe: Path, mode: str, sizes: list[int]) -> None:
    base = min(_seconds(exe, mode, 0)[0] for _ in range(3))
    runs = {n: _seconds(exe, mode, n) for n in sizes}
    cpu = {n: max(c - base, 1e-6) for n, (c, _) in runs.items()}
    print(f"{mode}: planner CPU time of a run printing nothing {base * 1000:.0f} ms (subtracted)")
    for n, (_, wall) in runs.items():
        print(f"  {n:>3} MiB  CPU {cpu[n]:7.3f} s  {cpu[n] / n * 1000:7.1f} ms/MiB   wall {wall:7.3f} s")
    lo, hi = min(sizes), max(sizes)
    print(f"  ratio {hi} MiB / {lo} MiB: {cpu[hi] / cpu[lo]:.1f} (linear: {hi / lo:.0f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--garbage-sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    args = ap.parse_args()
    _app = QCoreApplication.instance() or QCoreApplication([])
    with tempfile.TemporaryDirectory(prefix="log-throughput-") as tmp:
        exe = _fake(Path(tmp))
        _report(exe, "flood", args.sizes)
        _report(exe, "garbage", args.garbage_sizes)


if __name__ == "__main__":
    main()
