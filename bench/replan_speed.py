"""Re-plan speed on the DeepSeek-V3 header with three devices (CUDA0, CUDA1 24 GiB, CPU).

Prints the time of a full first projection beside the median time of moving one layer's routed
experts to another device and re-projecting, split into placement + weights/KV/output (the part a
drag updates first) and the compute-buffer simulation. Target: a move re-projected in under 2 ms.

    python bench/replan_speed.py [--runs 200] [--compute-runs 10]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace

from offload_planner.cli import demo_model_path
from offload_planner.core.compute import compute_buffers
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import kv_buffers, output_buffer, resolve_context, weight_buffers
from offload_planner.core.plan import Plan, plan_from_args

GIB = 1024**3


def _median_ms(fn: Callable[[int], object], runs: int) -> float:
    times = []
    for i in range(runs):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--compute-runs", type=int, default=10)
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
        return plan.with_moves({n: "CUDA0" if i % 2 else "CUDA1" for n in exps[il]})

    ctx = resolve_context(plan.context, model.summary.n_ctx_train, model.summary.n_swa)

    def fast(i: int) -> None:
        p = moved(i)
        pl = p.placement()
        weight_buffers(model, pl, devices)
        kv_buffers(model, pl, ctx, p.context, devices)
        output_buffer(model, pl, p.context, devices)

    def full(i: int) -> None:
        p = moved(i)
        compute_buffers(model, devices, p.placement(), ctx, p.context)

    fast_ms = _median_ms(fast, args.runs)
    full_ms = _median_ms(full, args.compute_runs)
    print(f"DeepSeek-V3 header, {len(model.tensors)} tensors, devices CUDA0/CUDA1/CPU, -c 32768 -ub 2048")
    print(f"full first projection                 : {first:8.1f} ms")
    print(f"move one layer's experts: placement + weights/KV/output : median {fast_ms:7.2f} ms "
          f"over {args.runs} (target < 2 ms)")
    print(f"move one layer's experts: compute simulation            : median {full_ms:7.1f} ms "
          f"over {args.compute_runs}")


if __name__ == "__main__":
    main()
