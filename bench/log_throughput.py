"""Reading a backend's output: time per MiB when it prints 4, 8, 16 and 32 MiB without a newline.

A fake "llama-server" (a Python script) prints N MiB of ``x`` in 64 KiB writes and exits; the
planner's :class:`~offload_planner.backend.runner.ServerProcess` reads it (as ``offload-planner
launch`` and the window do) with every line handed on to a sink.  The time is from start to the
``finished`` signal, less that of a run printing nothing (the fake's start-up), measured in the same
run.  Linear reading gives a 32 MiB / 4 MiB time ratio near 8; issue 12 measured 0.5/1.9/9.1/31.6 s
before (ratio 63, quadratic).  The same for binary garbage (random bytes, escaped on the way).

    python bench/log_throughput.py [--sizes 4 8 16 32] [--mode flood|garbage|both]
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


def _seconds(exe: Path, mode: str, mib: int) -> float:
    sp = ServerProcess()
    received = [0]
    sp.linesReceived.connect(lambda lines: received.__setitem__(0, received[0] + sum(map(len, lines))))
    loop = QEventLoop()
    sp.finished.connect(lambda _outcome: loop.quit())
    cfg = LaunchConfig(executable=str(exe), dialect=Dialect.LLAMA_CPP, host=None, verbose_log=False,
                       health_check=False, env={"MODE": mode, "MIB": str(mib)})
    t0 = time.perf_counter()
    sp.start(cfg)
    loop.exec()
    elapsed = time.perf_counter() - t0
    sp.shutdown(2.0)
    sp.deleteLater()
    return elapsed


def _report(exe: Path, mode: str, sizes: list[int]) -> None:
    base = min(_seconds(exe, mode, 0) for _ in range(3))
    times = {n: max(_seconds(exe, mode, n) - base, 1e-6) for n in sizes}
    print(f"{mode}: start-up of the fake {base * 1000:.0f} ms (subtracted)")
    for n, t in times.items():
        print(f"  {n:>3} MiB  {t:7.3f} s  {t / n * 1000:7.1f} ms/MiB")
    lo, hi = min(sizes), max(sizes)
    print(f"  ratio {hi} MiB / {lo} MiB: {times[hi] / times[lo]:.1f} (linear: {hi / lo:.0f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--mode", choices=["flood", "garbage", "both"], default="both")
    args = ap.parse_args()
    _app = QCoreApplication.instance() or QCoreApplication([])
    with tempfile.TemporaryDirectory(prefix="log-throughput-") as tmp:
        exe = _fake(Path(tmp))
        for mode in ("flood", "garbage") if args.mode == "both" else (args.mode,):
            _report(exe, mode, args.sizes)


if __name__ == "__main__":
    main()
