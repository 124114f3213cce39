"""The fit's MTP extra (``fit_extra.extra_measure``) for ik_llama.cpp's ``--spec-type mtp``: ik's MTP
context as the dialect projects it (its KV of the NextN layers in the main cache types, its output with
the embeddings, its own MTP graph's compute: ``IkLlamaCpp.mtp_buffers``), not mainline's MTP graph.
The projection is checked against ik's library in tests/integration/test_ik_mtp.py, the fit's measure
at the library's figures in tests/integration/test_ik_fit_mtp.py.  Real GGUF files from the synth."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.dialects import IK
from offload_planner.core.engine import placement_options
from offload_planner.core.extra_context import MTP
from offload_planner.core.fit import device_memory, fit_for_args
from offload_planner.core.fit_extra import ExtraMeasured, extra_measure
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import Projection
from offload_planner.core.model import Model
from offload_planner.core.placement import CPU
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.speculative import load_spec

GiB = 1024**3


def _devices(n_gpu: int) -> DeviceSet:
    gpus = tuple(Device(f"CUDA{i}", DeviceKind.CUDA, 24 * GiB, 24 * GiB) for i in range(n_gpu))
    return DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), gpus)


def _plan(model: Model, ds: DeviceSet, line: str) -> tuple[Plan, object]:
    parsed = parse_server_args(line.split(), dialect=IK)
    assert parsed.errors == [], parsed.errors
    return plan_from_args(model, ds, parsed, IK), parsed


def _measured(model: Model, ds: DeviceSet, plan: Plan, parsed: object, n_ctx: int) -> ExtraMeasured:
    spec = load_spec(ds, parsed, IK, placement_options)
    measure = extra_measure(model, ds, plan.placement_options, plan.context, spec, device_memory)
    assert measure is not None
    return measure(n_ctx)


def _mtp_split(proj: Projection) -> tuple[dict[str, int], int]:
    """The projection's MTP context: bytes per GPU, and on the host."""
    used: dict[str, int] = {}
    host = 0
    for b in proj.buffers():
        if b.owner != MTP:
            continue
        if b.device == CPU:
            host += b.bytes
        else:
            used[b.device] = used.get(b.device, 0) + b.bytes
    return used, host


@pytest.mark.parametrize("n_gpu", [0, 1, 2])
@pytest.mark.parametrize("line", ["-c 1100 --spec-type mtp",
                                  "-c 1100 -fa off -ub 128 --spec-type mtp:n_max=1",
                                  "-c 4096 -ctk q8_0 -ctv q8_0 --spec-type mtp"])
def test_ik_fit_measures_the_mtp_context_the_plan_projects(small_models: dict[str, Path], n_gpu: int,
                                                           line: str) -> None:
    """At the plan's context the fit's dry run of ik's MTP context is the projection's MTP extra, per GPU
    and on the host; at another context it is that context's plan's (the fit measures it again at each
    context it tries)."""
    model = open_model(small_models["glm4moe"])
    ds = _devices(n_gpu)
    plan, parsed = _plan(model, ds, line)
    used, host = _mtp_split(plan.projection())
    assert host > 0 and (used if n_gpu else True)
    m = _measured(model, ds, plan, parsed, plan.context.n_ctx)
    assert (m.used, m.model, m.host) == (used, {}, host)
    bigger = replace(plan, context=replace(plan.context, n_ctx=2 * plan.context.n_ctx))
    used2, host2 = _mtp_split(bigger.projection())
    m2 = _measured(model, ds, plan, parsed, 2 * plan.context.n_ctx)
    assert (m2.used, m2.host) == (used2, host2) and sum(used2.values()) + host2 > sum(used.values()) + host


def test_ik_fit_counts_the_projected_mtp_context(small_models: dict[str, Path]) -> None:
    """``fit_for_args`` with ik's ``--spec-type mtp`` on two GPUs with room: the fit changes nothing and
    counts on each GPU what the plan projects for the MTP context there (the NextN layer's GPU)."""
    model = open_model(small_models["glm4moe"])
    ds = _devices(2)
    plan, parsed = _plan(model, ds, "-c 1100 --spec-type mtp")
    result = fit_for_args(model, ds, parsed, plan.placement_options, plan.context,
                          free_bytes=[g.capacity or 0 for g in ds.gpus])
    assert result is not None and not result.layers_changed
    used, _ = _mtp_split(plan.projection())
    assert {d: n for d, n in result.extra_counted.items() if n} == used and used
