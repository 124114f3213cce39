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

    python bench/fit_speed.py [--runs 3] [--gpus 4] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from offload_planner.cli import demo_model_path
from offload_planner.core import compute
from offload_planner.core.compute import incremental as ci
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.engine import context_params, placement_options
from offload_planner.core.fit import fit_params
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import resolve_context
from offload_planner.core.placement import place
from offload_planner.core.synth import BIG_MODELS, write_model

GIB = 1 << 30
TARGET = 5.0
DEEPSEEK = "DeepSeek-V3 (bundled header)"


def one_run(n_gpus: int, path: Path | None = None) -> tuple[float, float, int, int, int]:
    """From-scratch ms, fit ms, dry runs, reserves replayed, graphs re-used (bundled DeepSeek-V3 header
    unless ``path``)."""
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
    t0 = time.process_time()
    result = fit_params(model, devices, popts, cparams, free_bytes=[24 * GIB] * n_gpus)
    fit = time.process_time() - t0
    return (scratch * 1000, fit * 1000, result.measurements, ci.stats["replays"] - replays,
            ci.stats.get("graph_reuses", 0) - reuses)


def bench(name: str, path: Path | None, n_gpus: int, n_runs: int) -> float:
    runs = [one_run(n_gpus, path) for _ in range(n_runs)]
    scratch = min(r[0] for r in runs)
    fit = min(r[1] for r in runs)
    _, _, n, replayed, reused = runs[-1]
    ratio = fit / scratch
    print(f"{name:<28} {n:>8} {replayed:>8} {reused:>7} {scratch:>10.1f} {fit:>9.1f} {ratio:>8.1f}",
          flush=True)
    return ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--only", nargs="+", metavar="NAME", help=f"{DEEPSEEK!r} and/or catalogue names")
    args = ap.parse_args()
    names = args.only or [DEEPSEEK, *BIG_MODELS]
    print(f"{args.gpus} x CUDA 24 GiB, -c 32768, --fit on (load {os.getloadavg()[0]:.2f})")
    print(f"{'model':<28} {'dry runs':>8} {'replayed':>8} {'re-used':>7} {'scratch ms':>10} {'fit ms':>9} "
          f"{'fit/sim':>8}")
    ratios: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = None if name == DEEPSEEK else write_model(BIG_MODELS[name], Path(tmp) / f"{name}.gguf",
                                                             header_only=True)[0]
            ratios[name] = bench(name, path, args.gpus, args.runs)
    if DEEPSEEK in ratios:
        r = ratios[DEEPSEEK]
        print(f"DeepSeek-V3: fit = {r:.1f} from-scratch simulations (target <= {TARGET:.0f}: "
              f"{'met' if r <= TARGET else 'NOT MET'})")
    worst = max(ratios, key=ratios.__getitem__)
    print(f"worst: {worst}, {ratios[worst]:.1f} from-scratch simulations (load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
