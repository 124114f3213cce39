"""ik_llama.cpp's mmap follows the window's edits (leftovers6).

ik from PR 1510 (2026-03-26) turns mmap off when a weight's ``-ot`` rule names the CPU
(``use_mmap_buffer &= !has_buft_overrides``): the weights on the host then sit in pinned host buffers
(``CUDA_Host``), not in the mapped file.  The plan worked the flag out once, from the command it was
read from; the window's edits change what it depends on (a tensor moved to the CPU, which the exported
command sends there with an ``-ot ...=CPU`` rule; the mmap box; the build), and the projection kept the
old flag while the exported command said ``--no-mmap``: the window projected a mapped model of GBs the
command would copy into host buffers.  Each edit here is checked the way
tests/ui/test_projection_is_the_commands.py checks mainline's: the projection of the edited plan
equals the projection of the command the window exports for it, buffer by buffer."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.projected import buffer_counts

from offload_planner.core import presets
from offload_planner.core.analysis import analyse, analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet, parse_device_decl
from offload_planner.core.dialects import Dialect
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.placement import CPU
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.plan_edits import with_dialect, with_option
from offload_planner.core.units import GiB

QWEN = Path(__file__).resolve().parents[2] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf"
IK = Dialect("ik_llama.cpp")
MAINLINE = Dialect("llama.cpp")
DEVICES = DeviceSet(Device("CPU", DeviceKind.CPU, 512 * GiB, 512 * GiB), (parse_device_decl("CUDA0=24GiB"),))
OT = ["-c", "4096", "-ngl", "99", "-np", "1", "-ot", "exps=CPU"]  # -np 1: ik has one KV stream


@pytest.fixture(scope="module")
def model() -> Model:
    return open_model(QWEN)


def _plan(model: Model, args: list[str], dialect: Dialect) -> Plan:
    return plan_from_args(model, DEVICES, parse_server_args(args, dialect=dialect).args, dialect)



def _projected_as_exported(model: Model, plan: Plan) -> list[str]:
    """The edited plan's exported command, after checking that its projection is the plan's."""
    shown = analyse(plan)
    assert shown.projection is not None and not shown.error
    parsed = parse_server_args(shown.command, dialect=plan.dialect)
    assert not parsed.errors, parsed.errors
    exported = analyse_command(model, DEVICES, parsed.args, plan.dialect).projection
    assert buffer_counts(shown.projection) == buffer_counts(exported), shown.command
    return shown.command


def test_a_move_to_the_cpu_turns_mmap_off(model: Model) -> None:
    plan = _plan(model, ["-c", "4096", "-ngl", "99"], IK)
    assert plan.placement_options.use_mmap
    moved = plan.with_moves(dict(presets.layers_to(plan, plan.placement(), 10, 20, CPU, experts_only=True)))
    command = _projected_as_exported(model, moved)
    assert "--no-mmap" in command and not moved.placement_options.use_mmap
    back = moved.with_moves(dict.fromkeys(moved.moves))  # every move undone: mapped again
    assert back.placement_options.use_mmap and "--no-mmap" not in _projected_as_exported(model, back)


def test_moves_between_gpus_keep_mmap(model: Model) -> None:
    two = DeviceSet(DEVICES.cpu, (parse_device_decl("CUDA0=24GiB"), parse_device_decl("CUDA1=24GiB")))
    plan = plan_from_args(model, two, parse_server_args(["-c", "4096", "-ngl", "99"], dialect=IK).args, IK)
    moved = plan.with_moves(dict(presets.layers_to(plan, plan.placement(), 5, 5, "CUDA1")))
    assert moved.placement_options.use_mmap


def test_the_mmap_box_cannot_map_what_ik_copies(model: Model) -> None:
    plan = _plan(model, OT, IK)
    assert not plan.placement_options.use_mmap
    ticked = with_option(plan, "placement.use_mmap", True)
    assert "--no-mmap" in _projected_as_exported(model, ticked)
    assert not ticked.placement_options.use_mmap
    undone = with_option(ticked, "placement.use_mmap", False)  # the window's undo of the tick
    assert undone == plan and with_dialect(undone, MAINLINE).placement_options.use_mmap


def test_switching_to_ik_turns_mmap_off(model: Model) -> None:
    plan = _plan(model, OT, MAINLINE)
    assert plan.placement_options.use_mmap
    ik = with_dialect(plan, IK)
    assert "--no-mmap" in _projected_as_exported(model, ik) and not ik.placement_options.use_mmap


def test_switching_back_from_ik_maps_the_model_again(model: Model) -> None:
    """The command asked for mmap; ik turned it off for the -ot rule; mainline keeps it on.  The slots
    at ik's default (one) take the pinned build's on the switch (its -np auto: four sharing one cache,
    core.plan_edits._default_slots, session 11's newcomer7), so the mainline plan compared is the
    command's without ``-np 1``."""
    back = with_dialect(_plan(model, OT, IK), MAINLINE)
    command = _projected_as_exported(model, back)
    assert back.placement_options.use_mmap and "-lm" not in command and "--no-mmap" not in command
    at_default = [a for i, a in enumerate(OT) if "-np" not in OT[max(0, i - 1):i + 1]]
    assert at_default == ["-c", "4096", "-ngl", "99", "-ot", "exps=CPU"]
    assert buffer_counts(back.projection()) == buffer_counts(_plan(model, at_default, MAINLINE).projection())


def test_no_mmap_asked_for_stays_off(model: Model) -> None:
    plan = _plan(model, [*OT, "--no-mmap"], IK)
    back = with_dialect(plan, MAINLINE)
    assert not back.placement_options.use_mmap and not plan.mmap_off_by_overrides
    unticked = with_option(with_dialect(_plan(model, OT, MAINLINE), IK), "placement.use_mmap", False)
    assert unticked.mmap_off_by_overrides  # the box showed ik's mmap, off: unticking it asks for nothing
