"""A one-shot ``offload-planner plan`` against opening the file plus one plain simulation, per big
catalogue model.

Each of the catalogue's big models (header-only, written into a temporary folder) is planned as the
README plans DeepSeek-V3: two declared 24 GiB GPUs, ``-ngl 999 -ts 1,1 -c 32768`` (MoE models
``-ot exps=CPU``), once with ``-fit off`` and once with the pinned build's default ``--fit`` (whose
first dry run is one more, prompt-only, simulation).  The reference is measured in the same run:
``open_model`` plus ``compute.simulate`` (both reserved graphs, from scratch, no replay reference).
Target: the ``-fit off`` plan within that (ratio <= 1; what is left is the text, the weights and the
placement).  Times are CPU time of this process, best of ``--runs``; each ``plan`` runs in process on a
freshly opened model (nothing cached from an earlier run applies to it).

    python bench/plan_speed.py [--only NAME ...] [--runs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
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
from offload_planner.core.synth import BIG_MODELS, SMALL_MODELS, write_model

DEVICES = ["--no-detect", "--device", "CUDA0=24GiB", "--device", "CUDA1=24GiB", "--device", "CPU=512GiB"]


def server_args(path: Path) -> list[str]:
    moe = any(t.role.is_routed_expert for t in open_model(path).tensors)
    return ["-ngl", "999", "-ts", "1,1", "-c", "32768", *(["-ot", "exps=CPU"] if moe else [])]


def plan_ms(path: Path, extra: list[str]) -> float:
    argv = ["plan", str(path), *DEVICES, "--", *server_args(path), *extra]
    t0 = time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        code = cli_main(argv)
    assert code in (EXIT_OK, EXIT_OVER), code  # a plan over capacity is still a plan
    return (time.process_time() - t0) * 1000


def reference_ms(path: Path) -> float:
    """Open the file, then one plain simulation of the plan's placement."""
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
    return (t_open + time.process_time() - t0) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", metavar="NAME")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    names = args.only or list(BIG_MODELS)
    head = ("model", "open+sim ms", "plan ms", "ratio", "plan --fit ms", "ratio")
    print(_row(head))
    with tempfile.TemporaryDirectory() as tmp:
        warm = write_model(SMALL_MODELS["qwen3moe"], Path(tmp) / "warm.gguf")[0]
        plan_ms(warm, ["-fit", "off"])  # imports and first-use costs, not the model's
        for name in names:
            path = write_model(BIG_MODELS[name], Path(tmp) / f"{name}.header.gguf", header_only=True)[0]
            ref = min(reference_ms(path) for _ in range(args.runs))
            off = min(plan_ms(path, ["-fit", "off"]) for _ in range(args.runs))
            on = min(plan_ms(path, []) for _ in range(args.runs))
            cells = (name, f"{ref:.0f}", f"{off:.0f}", f"{off / ref:.2f}", f"{on:.0f}", f"{on / ref:.2f}")
            print(_row(cells), flush=True)


def _row(cells: tuple[str, ...]) -> str:
    return "  ".join(f"{c:>13}" if i else f"{c:<24}" for i, c in enumerate(cells))


if __name__ == "__main__":
    main()
