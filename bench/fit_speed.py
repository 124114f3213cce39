"""The ``--fit`` port's time in from-scratch simulations: DeepSeek-V3 (the bundled header) on four
declared 24 GiB CUDA GPUs with ``-c 32768`` (the README's setting, ``--fit`` left on).

Per run the model is opened afresh (no reference, memo or cached placement of an earlier run
applies), ``fit_params`` runs llama.cpp's search (about 25 dry runs), and the reference is measured
in the same run: one from-scratch ``compute.simulate`` of the command as written (both reserved
graphs).  Prints the best of ``--runs`` of each, the dry runs counted, how many were replayed, and
fit / from-scratch against the target of 5.  Times are CPU time of this process.

    python bench/fit_speed.py [--runs 3] [--gpus 4]
"""

from __future__ import annotations

import argparse
import time
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

GIB = 1 << 30
TARGET = 5.0


def one_run(n_gpus: int) -> tuple[float, float, int, int]:
    model = open_model(demo_model_path())
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
    replays = ci.stats["replays"]
    t0 = time.process_time()
    result = fit_params(model, devices, popts, cparams, free_bytes=[24 * GIB] * n_gpus)
    fit = time.process_time() - t0
    return scratch * 1000, fit * 1000, result.measurements, ci.stats["replays"] - replays


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=4)
    args = ap.parse_args()
    runs = [one_run(args.gpus) for _ in range(args.runs)]
    scratch = min(r[0] for r in runs)
    fit = min(r[1] for r in runs)
    _, _, n, replayed = runs[-1]
    print(f"DeepSeek-V3 header, {args.gpus} x CUDA 24 GiB, -c 32768, --fit on: {n} dry runs, "
          f"{replayed} reserves replayed")
    print(f"from-scratch simulation : {scratch:8.1f} ms")
    print(f"fit                     : {fit:8.1f} ms  = {fit / scratch:.1f} simulations "
          f"(target <= {TARGET:.0f}: {'met' if fit / scratch <= TARGET else 'NOT MET'})")


if __name__ == "__main__":
    main()
