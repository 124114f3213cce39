"""A window records each topology's reference at its first simulation (every edit is re-projected
and replayed against it) only while it is open: once the last document shuts down, a simulation of
a new topology in the same process records nothing the first time, as a one-shot ``plan`` does.
(A window left that mode on for the rest of the process: core tests of the one-shot path failed
when they ran after window tests.)"""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.compute import incremental as CI
from offload_planner.core.compute import simulate
from offload_planner.core.devices import Device, DeviceKind, DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import resolve_context
from offload_planner.core.plan import plan_from_args
from offload_planner.core.units import GiB
from offload_planner.ui.document import PlanDocument


def _references_after_one_simulation(path: Path) -> int:
    model = open_model(path)
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB),
                        (parse_device_decl("CUDA0=24GiB"), parse_device_decl("CUDA1=24GiB")))
    plan = plan_from_args(model, devices, parse_server_args(["-c", "2048", "-ot", "exps=CPU"]))
    ctx = resolve_context(plan.context, model.summary.n_ctx_train, model.summary.n_swa)
    CI._REFS.clear()
    CI._SEEN.clear()
    simulate(model, devices, plan.placement(), ctx, plan.context, incremental=True)
    return sum(map(len, CI._REFS.values()))


def test_the_last_document_to_close_ends_recording_at_first_sight(qtbot: QtBot, qwen3moe_path: Path) -> None:
    first, second = PlanDocument(), PlanDocument()
    try:
        assert _references_after_one_simulation(qwen3moe_path) == 2  # open: prompt and one-token graphs
        first.shutdown()
        first.shutdown()  # counted once
        assert _references_after_one_simulation(qwen3moe_path) == 2  # the second one is still open
    finally:
        second.shutdown()
        first.shutdown()
    assert _references_after_one_simulation(qwen3moe_path) == 0
