"""Switching a plan to ik_llama.cpp drops mainline's unified-KV setting.

Mainline's server defaults to four slots sharing one unified KV cache (``-np`` unset: ``-np 4 -kvu``),
and ``-kvu`` can be asked for; ik has one KV stream and refuses the flag ("unknown argument: -kvu"; the
planner's ik parser says it is moved to nothing).  The window's build switch kept the setting, so the
command it exported for ik carried ``-kvu`` and did not parse (found by leftovers6).  Checked as
test_ik_mmap_edits checks its edits: the switched plan's command parses for ik and projects what the
plan projects, buffer by buffer."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.projected import buffer_counts

from offload_planner.core.analysis import analyse, analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet, parse_device_decl
from offload_planner.core.dialects import Dialect
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.plan_edits import with_dialect
from offload_planner.core.units import GiB

QWEN = Path(__file__).resolve().parents[2] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf"
IK = Dialect("ik_llama.cpp")
MAINLINE = Dialect("llama.cpp")
DEVICES = DeviceSet(Device("CPU", DeviceKind.CPU, 512 * GiB, 512 * GiB), (parse_device_decl("CUDA0=24GiB"),))


@pytest.fixture(scope="module")
def model() -> Model:
    return open_model(QWEN)



@pytest.mark.parametrize("args", [["-c", "4096", "-ngl", "99"],  # the server's -np 4 -kvu
                                  ["-c", "4096", "-ngl", "99", "-np", "2", "-kvu"]])
def test_switching_to_ik_exports_a_command_ik_reads(model: Model, args: list[str]) -> None:
    plan = plan_from_args(model, DEVICES, parse_server_args(args, dialect=MAINLINE).args, MAINLINE)
    assert plan.context.kv_unified
    ik = with_dialect(plan, IK)
    shown = analyse(ik)
    assert shown.projection is not None and not shown.error
    assert "-kvu" not in shown.command and not ik.context.kv_unified
    parsed = parse_server_args(shown.command, dialect=IK)
    assert not parsed.errors, parsed.errors
    exported = analyse_command(model, DEVICES, parsed.args, IK).projection
    assert buffer_counts(shown.projection) == buffer_counts(exported)


def test_switching_back_exports_the_slots_ik_had(model: Model) -> None:
    plan = plan_from_args(model, DEVICES, parse_server_args(["-c", "4096", "-np", "2"], dialect=IK).args, IK)
    back = with_dialect(plan, MAINLINE)
    command = analyse(back).command
    assert command[command.index("-np") + 1] == "2" and "-kvu" not in command
