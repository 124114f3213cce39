"""A one-shot ``offload-planner plan`` against opening the file plus one plain simulation, on every
model the catalogue writes.

The issue's target: "a one-shot ``plan`` costs at most opening the file plus one plain simulation".
Each catalogue model (``core/synth/catalog.py``, header-only, written into a temporary folder) is
planned as the README plans DeepSeek-V3: two declared 24 GiB GPUs, ``-ngl 999 -ts 1,1 -c 32768``
(MoE models ``-ot exps=CPU``), once with ``-fit off`` and once with the pinned build's default
``--fit`` (whose first dry run is one more, prompt-only, simulation).

* *plan*: the whole command, ``cli.main(["plan", FILE, --device ..., "--", ...])`` in this process
  with its output discarded: argument parsing, opening the file, the plan, its projection (the
  compute simulation included), warnings, the reproducing command, the fit report, the speed
  estimate and the text.  Every cache of the planner's modules is emptied first
  (:func:`fresh_caches`: the functools caches, the compute memo, the replay references), so nothing
  an earlier run computed applies; only the imports, the program's constant tables (a dialect's
  flag table) and the cached RAM-bandwidth probe stay, which a new process pays once:
  ``python bench/plan_speed.py --imports`` prints that apart.
* *open+sim* (the reference, measured in the same run on the same caches): ``open_model`` plus
  ``compute.simulate`` of the plan's placement (both reserved graphs, from scratch, no replay).

What the two do differently, besides the plan's own work: the plan's simulation is the engine's
one-shot path (``compute.one_shot``, sizes only), which leaves out the one-token reserve's allocator
walk where a bound of it from the scheduled graph proves it decides no size
(``core/compute/bound.py``: all but deepseek2-mtp and Qwen3-235B here), and ``plan`` keeps the cycle
collector off from its arguments to its text; the reference walks both reserves (``compute.simulate``
as the engine runs it plainly) and opens the file with the collector on (the simulation turns it off).

Target: the ``-fit off`` plan within the reference (ratio <= 1).  What the command does besides
(reading its arguments and the devices, placing, the reproducing command, the speed estimate, the
text) is a few ms whatever the model: a few per cent of a big model's simulation, as much as the
whole simulation of a small one.  Times are CPU time of this process (``time.process_time``), best
of ``--runs``, the three measures interleaved.

``--processes``: the same as new processes, the way a user runs the command (imports included; the
reference as a script importing only the library it calls).

    python bench/plan_speed.py [--only NAME ...] [--runs 3] [--imports] [--processes]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from offload_planner.cli import main as cli_main
from offload_planner.cli_plan import EXIT_OK, EXIT_OVER
from offload_planner.core import compute
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import resolve_context
from offload_planner.core.plan import plan_from_args
from offload_planner.core.synth import SMALL_MODELS, all_models, write_model

DEVICES = ["--no-detect", "--device", "CUDA0=24GiB", "--device", "CUDA1=24GiB", "--device", "CPU=512GiB"]


def server_args(path: Path) -> list[str]:
    moe = any(t.role.is_routed_expert for t in open_model(path).tensors)
    return ["-ngl", "999", "-ts", "1,1", "-c", "32768", *(["-ot", "exps=CPU"] if moe else [])]


#: functools caches of program constants, kept like the imports (built once a process, on first use)
STATIC = frozenset({"flag_table"})  # a dialect's flag table


#: the planner's module-level caches by model (``cache_clear`` finds the functools ones)
MODEL_CACHES = (("offload_planner.core.compute.incremental", "_REFS"),
                ("offload_planner.core.compute.incremental", "_SEEN"),
                ("offload_planner.core.compute.template", "_TEMPLATES"),
                ("offload_planner.core.placement", "_ITEMS"),
                ("offload_planner.core.rule_match", "_INDEXES"))


def fresh_caches() -> None:
    """Empty what earlier runs left in the planner's caches: every functools cache of its modules
    but the program constants' (:data:`STATIC`), the compute memo, the recorded replay references,
    the kept graphs and the per-model placement and rule caches (a new ``plan`` process has none, and
    what they hold would slow the garbage collector down)."""
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("offload_planner"):
            for name, v in list(vars(mod).items()):
                if name not in STATIC and callable(getattr(v, "cache_clear", None)):
                    v.cache_clear()
    compute.MEMO.clear()
    for mod_name, attr in MODEL_CACHES:
        cache = getattr(sys.modules.get(mod_name), attr, None)
        if cache is not None:  # an older tree may lack it
            cache.clear()


def plan_ms(path: Path, extra: list[str]) -> float:
    argv = ["plan", str(path), *DEVICES, "--", *server_args(path), *extra]
    fresh_caches()
    t0 = time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        code = cli_main(argv)
    assert code in (EXIT_OK, EXIT_OVER), code  # a plan over capacity is still a plan
    return (time.process_time() - t0) * 1000


def reference_ms(path: Path) -> float:
    """Open the file, then one plain simulation of the plan's placement."""
    return sum(reference_parts(path))


def reference_parts(path: Path) -> tuple[float, float]:
    """:func:`reference_ms` in its two parts: opening the file and the simulation, ms."""
    fresh_caches()
    t0 = time.process_time()
    model = open_model(path)
    t_open = time.process_time() - t0
    gib = 1 << 30
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 512 * gib, 512 * gib),
                        tuple(Device(f"CUDA{i}", DeviceKind.CUDA, 24 * gib, 24 * gib) for i in range(2)))
    moe = any(t.role.is_routed_expert for t in model.tensors)
    ot = [SimpleNamespace(pattern="exps", buft="CPU", source="-ot")] if moe else []
    args = SimpleNamespace(ctx_size=32768, n_gpu_layers=999, tensor_split=[1, 1], overrides=ot)
    plan = plan_from_args(model, devices, args)
    placement = plan.placement()
    ctx = resolve_context(plan.context, model.summary.n_ctx_train, model.summary.n_swa)
    t0 = time.process_time()
    compute.simulate(model, devices, placement, ctx, plan.context)
    return t_open * 1000, (time.process_time() - t0) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", metavar="NAME")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--imports", action="store_true", help="also what a new `plan` process pays first")
    ap.add_argument("--processes", action="store_true",
                    help="also a new `plan` process against the reference's own process (imports included)")
    args = ap.parse_args()
    specs = all_models()
    names = args.only or list(specs)
    head = ("model", "open+sim ms", "plan ms", "ratio", "plan --fit ms", "ratio")
    print(_row(head))
    with tempfile.TemporaryDirectory() as tmp:
        warm = write_model(SMALL_MODELS["qwen3moe"], Path(tmp) / "warm.gguf")[0]
        plan_ms(warm, ["-fit", "off"])  # imports and first-use costs, not the model's
        worst = (0.0, "")
        for name in names:
            path = write_model(specs[name], Path(tmp) / f"{name}.header.gguf", header_only=True)[0]
            runs = [(reference_ms(path), plan_ms(path, ["-fit", "off"]), plan_ms(path, []))
                    for _ in range(args.runs)]  # interleaved: a change of load hits all three alike
            ref, off, on = (min(r[i] for r in runs) for i in range(3))
            worst = max(worst, (off / ref, name))
            cells = (name, f"{ref:.1f}", f"{off:.1f}", f"{off / ref:.2f}", f"{on:.1f}", f"{on / ref:.2f}")
            print(_row(cells), flush=True)
        verdict = "met" if worst[0] <= 1 else "NOT MET"
        print(f"worst -fit off plan / (open + sim): {worst[0]:.2f} ({worst[1]}; target <= 1: {verdict})")
        if args.imports:
            print(imports_line(warm, args.runs))
        if args.processes:
            print(processes_line(warm, max(args.runs, 5)))


FRESH = """
import contextlib, io, sys, time
t0 = time.process_time()
from offload_planner.cli import main
argv = sys.argv[1:]
with contextlib.redirect_stdout(io.StringIO()):
    t1 = time.process_time(); main(argv); t2 = time.process_time(); main(argv); t3 = time.process_time()
print(t0, t1 - t0, (t2 - t1) - (t3 - t2))
"""


def imports_line(path: Path, runs: int) -> str:
    """A new process on a small model: the interpreter's start, importing the CLI, and what the first
    ``plan`` costs more than the second (the imports it makes and first-use costs), CPU ms."""
    argv = ["plan", str(path), *DEVICES, "--", *server_args(path), "-fit", "off"]
    got = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", FRESH, *argv], capture_output=True, text=True, check=True)
        got.append([float(x) * 1000 for x in out.stdout.split()])
    start, cli, first = (min(g[i] for g in got) for i in range(3))
    return (f"a new process (small qwen3moe): interpreter start {start:.0f} ms, import the CLI {cli:.0f} ms, "
            f"the first plan's imports and first use {first:.0f} ms (best of {runs})")


#: the reference (:func:`reference_parts`) as a script of its own, importing only the library's modules
#: it calls (not the CLI): what a program that opens a model and simulates it plainly pays in a new process
LIBRARY = """
import sys
from types import SimpleNamespace
from offload_planner.core import compute
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import resolve_context
from offload_planner.core.plan import plan_from_args
model = open_model(sys.argv[1])
gib = 1 << 30
devices = DeviceSet(Device("CPU", DeviceKind.CPU, 512 * gib, 512 * gib),
                    tuple(Device(f"CUDA{i}", DeviceKind.CUDA, 24 * gib, 24 * gib) for i in range(2)))
moe = any(t.role.is_routed_expert for t in model.tensors)
ot = [SimpleNamespace(pattern="exps", buft="CPU", source="-ot")] if moe else []
args = SimpleNamespace(ctx_size=32768, n_gpu_layers=999, tensor_split=[1, 1], overrides=ot)
plan = plan_from_args(model, devices, args)
ctx = resolve_context(plan.context, model.summary.n_ctx_train, model.summary.n_swa)
compute.simulate(model, devices, plan.placement(), ctx, plan.context)
"""


def _child_cpu_ms(cmd: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, capture_output=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000


def processes_line(path: Path, runs: int) -> str:
    """The command as a user runs it: a new ``plan -fit off`` process against a new process of the
    reference (:data:`LIBRARY`: the interpreter, the library's imports, opening, placing and one plain
    simulation), CPU ms of each, best of ``runs``, interleaved."""
    plan = [sys.executable, "-m", "offload_planner", "plan", str(path), *DEVICES, "--", *server_args(path),
            "-fit", "off"]
    library = [sys.executable, "-c", LIBRARY, str(path)]
    got = [(_child_cpu_ms(plan), _child_cpu_ms(library)) for _ in range(runs)]
    p, r = (min(g[i] for g in got) for i in range(2))
    return (f"new processes (small qwen3moe): plan -fit off {p:.0f} ms, the reference as a script of its own "
            f"{r:.0f} ms: {p / r:.2f} (best of {runs})")


def _row(cells: tuple[str, ...]) -> str:
    return "  ".join(f"{c:>13}" if i else f"{c:<24}" for i, c in enumerate(cells))


if __name__ == "__main__":
    main()
