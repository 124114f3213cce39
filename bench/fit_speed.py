"""The ``--fit`` port's time in from-scratch simulations, on every model the catalogue writes: four
declared 24 GiB CUDA GPUs with ``-c 32768`` (the README's setting, ``--fit`` left on).

Models: DeepSeek-V3 (the bundled header, the target's case) and each of the catalogue's big models
(``core/synth/catalog.py``, written header-only into a temporary folder).  Per run the model is
opened afresh (no reference, kept graph, memo or cached placement of an earlier run applies),
``fit_params`` runs llama.cpp's search (DeepSeek-V3: 24 dry runs), and the reference is measured in
the same run: one from-scratch ``compute.simulate`` of the command as written (both reserved graphs).
Prints per model the best of ``--runs`` of each, the dry runs counted, how many reserves were
replayed against a recorded one and how many re-used a kept graph (``compute.template``), and fit /
from-scratch; the last line is the worst model.  Target: at most 5 on DeepSeek-V3.  Times are CPU
time of this process (``time.process_time``).

``--dry-runs``: then, per model, one more run with a line per dry run (its -ngl/-ts/-ot, how its reserve
was made: ``plain`` on the kept graph, ``pipeline`` (4 copies, never replayed), ``record``, ``replay``,
``far``; its time in from-scratch simulations), the time the fit spends outside its dry runs and, of
it, in the cyclic garbage collector (which runs when ``fit_params`` turns it back on).

    python bench/fit_speed.py [--runs 3] [--gpus 4] [--only NAME ...] [--dry-runs]
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from offload_planner.cli import demo_model_path
from offload_planner.core import compute
from offload_planner.core.compute import incremental as ci
from offload_planner.core.compute.simulate import freezing_after_simulations
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.engine import context_params, placement_options
from offload_planner.core.fit import Measured, device_memory, fit_params
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import ContextParams, resolve_context
from offload_planner.core.model import Model
from offload_planner.core.placement import PlacementOptions, place
from offload_planner.core.synth import BIG_MODELS, write_model

GIB = 1 << 30
TARGET = 5.0
DEEPSEEK = "DeepSeek-V3 (bundled header)"


def one_run(n_gpus: int, path: Path | None = None, *, dry_runs: list[tuple[float, str, str]] | None = None,
            gc_ms: list[float] | None = None, cli: bool = False) -> tuple[float, float, int, int, int]:
    """From-scratch ms, fit ms, dry runs, reserves replayed, graphs re-used (bundled DeepSeek-V3 header
    unless ``path``).  ``dry_runs``: filled with (ms, path, parameters) per dry run; ``gc_ms``: with the
    time the fit spends in the cyclic garbage collector; ``cli``: the fit run as the CLI's commands run
    it (``freezing_after_simulations``)."""
    model = open_model(path or demo_model_path())
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 512 * GIB, 512 * GIB),
                        tuple(Device(f"CUDA{i}", DeviceKind.CUDA, 24 * GIB, 24 * GIB) for i in range(n_gpus)))
    args = SimpleNamespace(ctx_size=32768)
    popts = placement_options(model, devices, args, "llama.cpp")
    cparams, _ = context_params(model, args, "llama.cpp")
    placement = place(model, devices, popts)
    ctx = resolve_context(cparams, model.summary.n_ctx_train, model.summary.n_swa)
    t0 = time.process_time()
    compute.simulate(model, devices, placement, ctx, cparams)
    scratch = time.process_time() - t0
    replays, reuses = ci.stats["replays"], ci.stats.get("graph_reuses", 0)
    measure = None if dry_runs is None else _timed_measure(model, devices, dry_runs)
    on_gc = None if gc_ms is None else _gc_timer(gc_ms)
    if on_gc is not None:
        gc.callbacks.append(on_gc)
    t0 = time.process_time()
    try:
        with freezing_after_simulations(cli):
            result = fit_params(model, devices, popts, cparams, free_bytes=[24 * GIB] * n_gpus,
                                measure=measure)
        fit = time.process_time() - t0
    finally:
        if on_gc is not None:
            gc.callbacks.remove(on_gc)
    return (scratch * 1000, fit * 1000, result.measurements, ci.stats["replays"] - replays,
            ci.stats.get("graph_reuses", 0) - reuses)


def _timed_measure(model: Model, devices: DeviceSet, out: list[tuple[float, str, str]]
                   ) -> Callable[[PlacementOptions, ContextParams], Measured]:
    """``device_memory`` timed, with the way its reserve was made (from the replay's counters)."""

    def measure(po: PlacementOptions, cp: ContextParams) -> Measured:
        before = dict(ci.stats)
        t0 = time.process_time()
        m = device_memory(model, devices, po, cp)
        ms = (time.process_time() - t0) * 1000
        d = {k: v - before[k] for k, v in ci.stats.items() if v != before[k]}
        how = ("replay" if d.get("replays") else "far" if d.get("far") else "record" if d.get("full")
               else "plain" if d.get("plain") else "pipeline")
        ts = ",".join(f"{x:g}" for x in po.tensor_split) or "-"
        out.append((ms, how, f"-ngl {po.n_gpu_layers} -ts {ts} -ot x{len(po.overrides)} -c {cp.n_ctx}"))
        return m

    return measure


def _gc_timer(total: list[float]) -> Callable[[str, dict[str, int]], None]:
    """A ``gc.callbacks`` entry adding the milliseconds of each collection to ``total[0]``."""
    started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.process_time()
        else:
            total[0] += (time.process_time() - started[0]) * 1000

    return on_gc


def dry_run_table(name: str, path: Path | None, n_gpus: int, scratch: float) -> None:
    """One more run of the model with a line per dry run, in from-scratch simulations of ``scratch`` ms
    (the best of the timed runs: this run's own may have met a collection)."""
    runs: list[tuple[float, str, str]] = []
    gc_ms = [0.0]
    _, fit, *_ = one_run(n_gpus, path, dry_runs=runs, gc_ms=gc_ms)
    print(f"{name}: dry runs (from scratch {scratch:.1f} ms, fit {fit:.1f} ms = {fit / scratch:.2f})")
    totals: dict[str, tuple[int, float]] = {}
    for i, (ms, how, params) in enumerate(runs):
        print(f"  {i:>2} {how:<8} {ms:>7.1f} ms {ms / scratch:>5.2f}  {params}")
        n, t = totals.get(how, (0, 0.0))
        totals[how] = (n + 1, t + ms)
    for how, (n, t) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        print(f"  {how:<8} x{n:<3} {t / scratch:>5.2f} from-scratch simulations")
    outside = fit - sum(r[0] for r in runs)
    print(f"  outside the dry runs {outside / scratch:.2f} (of it the cyclic garbage collector "
          f"{gc_ms[0] / scratch:.2f}); objects the collector tracks after it: {len(gc.get_objects())}")
    runs.clear()
    gc_ms[0] = 0.0
    _, fit, *_ = one_run(n_gpus, path, dry_runs=runs, gc_ms=gc_ms, cli=True)
    outside = fit - sum(r[0] for r in runs)
    print(f"  as the CLI runs it: fit {fit / scratch:.2f}, outside the dry runs {outside / scratch:.2f} "
          f"(of it the collector {gc_ms[0] / scratch:.2f}); objects it tracks after it: "
          f"{len(gc.get_objects())}, frozen {gc.get_freeze_count()}")


def bench(name: str, path: Path | None, n_gpus: int, n_runs: int) -> tuple[float, float, float]:
    """fit / from scratch with the collector on, the same as the CLI runs it, from-scratch ms (the two
    alternate; the objects a CLI run freezes are not walked by the collections of the next run, which
    if anything favours the runs with the collector on)."""
    runs: list[tuple[float, float, int, int, int]] = []
    cli: list[tuple[float, float, int, int, int]] = []
    for _ in range(n_runs):
        runs.append(one_run(n_gpus, path))
        cli.append(one_run(n_gpus, path, cli=True))
    scratch = min(r[0] for r in runs + cli)
    fit = min(r[1] for r in runs)
    fit_cli = min(r[1] for r in cli)
    _, _, n, replayed, reused = runs[-1]
    print(f"{name:<28} {n:>8} {replayed:>8} {reused:>7} {scratch:>10.1f} {fit:>9.1f} {fit / scratch:>8.1f} "
          f"{fit_cli:>9.1f} {fit_cli / scratch:>8.1f}", flush=True)
    return fit / scratch, fit_cli / scratch, scratch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--only", nargs="+", metavar="NAME", help=f"{DEEPSEEK!r} and/or catalogue names")
    ap.add_argument("--dry-runs", action="store_true", help="then a line per dry run of each model")
    args = ap.parse_args()
    names = args.only or [DEEPSEEK, *BIG_MODELS]
    print(f"{args.gpus} x CUDA 24 GiB, -c 32768, --fit on (load {os.getloadavg()[0]:.2f})")
    print(f"{'model':<28} {'dry runs':>8} {'replayed':>8} {'re-used':>7} {'scratch ms':>10} {'fit ms':>9} "
          f"{'fit/sim':>8} {'CLI ms':>9} {'CLI/sim':>8}")
    ratios: dict[str, float] = {}
    lib_ratios: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = None if name == DEEPSEEK else write_model(BIG_MODELS[name], Path(tmp) / f"{name}.gguf",
                                                             header_only=True)[0]
            lib_ratios[name], ratios[name], scratch = bench(name, path, args.gpus, args.runs)
            if args.dry_runs:
                dry_run_table(name, path, args.gpus, scratch)
    if DEEPSEEK in ratios:
        r = ratios[DEEPSEEK]
        print(f"DeepSeek-V3: fit as the CLI runs it = {r:.1f} from-scratch simulations (target <= "
              f"{TARGET:.0f}: {'met' if r <= TARGET else 'NOT MET'}); with the collector on "
              f"{lib_ratios[DEEPSEEK]:.1f}")
    worst = max(ratios, key=ratios.__getitem__)
    print(f"worst: {worst}, {ratios[worst]:.1f} from-scratch simulations as the CLI runs it "
          f"(load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
