"""Re-plan speed on the DeepSeek-V3 header with three devices (CUDA0, CUDA1 24 GiB, CPU).

Prints the time of a full first projection (the compute buffers simulated from scratch and recorded as
the reference the later moves replay against, with allocator checkpoints; the weight buffers recorded
as the reference later placements are corrected from), then the median time of moving one layer's
routed experts to a GPU and re-projecting, split into placement + weights/KV/output (weights: the
reference's per-buffer totals corrected for the items that differ), the compute buffers
(``_compute_buffers``: the memo of whole results is bypassed, every move is really simulated, by
replay against the reference where it proves equal), and the whole re-projection (``project``
with the memo cleared).  Runs go through the MoE layers and then again to the other GPU (116
distinct moves on DeepSeek-V3; nothing is remembered between runs but the references of the base
plan).  Target: a move re-projected in under 2 ms.  For comparison, the compute
buffers simulated from scratch (``simulate`` without replay) for a few moves.

    python bench/replan_speed.py [--runs 200] [--full-runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace

from offload_planner.cli import demo_model_path
from offload_planner.core import compute
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import kv_buffers, output_buffer, project, resolve_context, weight_buffers
from offload_planner.core.plan import Plan, plan_from_args

GIB = 1024**3
TARGET_MS = 2.0


def _median_ms(fn: Callable[[int], object], runs: int, prepare: Callable[[int], object]) -> float:
    times = []
    for i in range(runs):
        arg = prepare(i)
        t0 = time.perf_counter()
        fn(arg)  # type: ignore[arg-type]
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--full-runs", type=int, default=5)
    args = ap.parse_args()
    model = open_model(demo_model_path())
    devices = DeviceSet(
        Device("CPU", DeviceKind.CPU, 512 * GIB, 480 * GIB),
        tuple(Device(f"CUDA{i}", DeviceKind.CUDA, 24 * GIB, 23 * GIB) for i in range(2)),
    )
    server_args = SimpleNamespace(ctx_size=32768, tensor_split=[1, 1], ubatch_size=2048,
                                  overrides=[SimpleNamespace(pattern="exps", buft="CPU", source="-ot")])
    plan = plan_from_args(model, devices, server_args)
    t0 = time.perf_counter()
    plan.projection()
    first = (time.perf_counter() - t0) * 1000
    layers = [il for il in range(model.summary.n_layer) if il >= model.summary.n_layer_dense_lead]
    exps = {il: [t.name for t in model.tensors if t.layer == il and t.role.is_routed_expert] for il in layers}

    def moved(i: int) -> Plan:
        il = layers[i % len(layers)]
        return plan.with_moves({n: "CUDA0" if (i // len(layers)) % 2 else "CUDA1" for n in exps[il]})

    ctx = resolve_context(plan.context, model.summary.n_ctx_train, model.summary.n_swa)

    def fast(p: Plan) -> None:
        pl = p.placement()
        weight_buffers(model, pl, devices)
        kv_buffers(model, pl, ctx, p.context, devices)
        output_buffer(model, pl, p.context, devices)

    def comp(p: Plan) -> None:
        compute._compute_buffers(model, devices, p.placement(), ctx, p.context)

    def whole(p: Plan) -> None:
        project(model, devices, p.placement(), p.context)

    def scratch(p: Plan) -> None:
        compute.simulate(model, devices, p.placement(), ctx, p.context)

    def fresh(i: int) -> Plan:
        compute._MEMO.clear()  # no whole-result memo hits: every run simulates
        return moved(i)

    fast_ms = _median_ms(fast, args.runs, moved)
    comp_ms = _median_ms(comp, args.runs, fresh)
    whole_ms = _median_ms(whole, args.runs, fresh)
    scratch_ms = _median_ms(scratch, args.full_runs, moved)
    print(f"DeepSeek-V3 header, {len(model.tensors)} tensors, devices CUDA0/CUDA1/CPU, -c 32768 -ub 2048")
    print(f"full first projection (records the replay reference): {first:8.1f} ms")
    print(f"move one layer's experts, median over {args.runs}:")
    print(f"  placement + weights/KV/output          : {fast_ms:7.2f} ms")
    print(f"  compute buffers (replayed)             : {comp_ms:7.2f} ms")
    print(f"  whole re-projection (all together)     : {whole_ms:7.2f} ms  (target < {TARGET_MS:.0f} ms: "
          f"{'met' if whole_ms < TARGET_MS else 'not met'})")
    print(f"  compute simulated from scratch ({args.full_runs} runs) : {scratch_ms:7.1f} ms")


if __name__ == "__main__":
    main()
