"""``-dev`` with RPC devices in ik_llama.cpp: ik names them by their buffer type, ``RPC<d>[host:port]``
(``d``: the device's number on its server; src/llama.cpp ``create_rpc_name`` and the ``-dev`` lookup
among the buffer types' names, 7790-7823 at 8337e4cd, from ik PR 1024 of 2025-11-30), where the pinned
build numbers them over the servers, ``RPC0``, ``RPC1``.  The planner resolved and wrote ik's ``-dev``
in mainline's spelling: ``-dev 'RPC0[127.0.0.1:50053]'`` was refused ("invalid device") and a plan's
``-dev RPC1`` was exported to ik, which logs "RPC1 backend not available", skips it and loads the
model on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.projected import buffer_counts

from offload_planner.core.analysis import analyse, analyse_command
from offload_planner.core.cmdline import check_semantics, parse_server_args
from offload_planner.core.devices import Device, DeviceKind, build_device_set, parse_device_decl
from offload_planner.core.dialects import Dialect
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.units import GiB

QWEN = Path(__file__).resolve().parents[2] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf"
IK = Dialect("ik_llama.cpp")
MAINLINE = Dialect("llama.cpp")
EPS = ["127.0.0.1:50052", "127.0.0.1:50053"]
DEVICES = build_device_set(cpu=Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), detected=[],
                           rpc_endpoints=EPS,
                           declared=[parse_device_decl("RPC0=24GiB"), parse_device_decl("RPC1=24GiB")])
BASE = ["--rpc", ",".join(EPS), "-c", "4096", "-ngl", "99", "-np", "1"]


@pytest.fixture(scope="module")
def model() -> Model:
    return open_model(QWEN)


def _used(projection: object) -> set[str]:
    return {dev for (dev, _, _), n in buffer_counts(projection).items() if n and dev != "CPU"}


def test_ik_selects_an_rpc_device_by_its_buffer_type(model: Model) -> None:
    parsed = parse_server_args([*BASE, "-dev", "RPC0[127.0.0.1:50053]"], dialect=IK)
    assert not check_semantics(parsed, DEVICES.names, dialect=IK, arch=model.arch)
    shown = analyse_command(model, DEVICES, parsed, IK, command=True)
    assert shown.projection is not None and _used(shown.projection) == {"RPC1"}
    command = shown.command
    assert command[command.index("-dev") + 1] == "RPC0[127.0.0.1:50053]"
    said = "-dev RPC0[127.0.0.1:50053]: llama-server uses RPC1 only"
    assert any(n.startswith(said) for n in shown.command_notes), shown.command_notes
    again = parse_server_args(command, dialect=IK)  # the exported command selects the same device
    exported = analyse_command(model, DEVICES, again, IK).projection
    assert buffer_counts(exported) == buffer_counts(shown.projection)


def test_ik_has_no_mainline_rpc_numbers(model: Model) -> None:
    """ik skips ``RPC1`` ("RPC1 backend not available.") and, with nothing left, loads on the CPU; the
    note names ik's spelling of the devices it has."""
    from offload_planner.core.cmdline import skipped_devices

    parsed = parse_server_args([*BASE, "-dev", "RPC1"], dialect=IK)
    assert not check_semantics(parsed, DEVICES.names, dialect=IK, arch=model.arch)
    [warning] = skipped_devices(parsed, DEVICES.names)
    assert warning.message.startswith('-dev RPC1: ik_llama.cpp logs "RPC1 backend not available."')
    assert "RPC0[127.0.0.1:50053]" in warning.explanation
    shown = analyse_command(model, DEVICES, parsed, IK)
    assert shown.projection is not None and _used(shown.projection) == set()


def test_a_switch_to_ik_writes_the_selection_as_ik_reads_it(model: Model) -> None:
    from offload_planner.core.plan_edits import with_dialect

    plan = plan_from_args(model, DEVICES, parse_server_args([*BASE, "-dev", "RPC1"], dialect=MAINLINE).args,
                          MAINLINE)
    assert analyse(plan).command[analyse(plan).command.index("-dev") + 1] == "RPC1"  # mainline: unchanged
    command = analyse(with_dialect(plan, IK)).command
    assert command[command.index("-dev") + 1] == "RPC0[127.0.0.1:50053]"


def test_devd_is_matched_as_the_build_matches_dev() -> None:
    """The draft's ``-devd`` names: ik's spelling and exact case (``-dev``'s lookup), the pinned build's
    numbers ignoring case; ``none`` keeps the draft on the CPU."""
    from offload_planner.core.speculative import draft_devices

    def names(wanted: list[str], dialect: Dialect) -> list[str]:
        return [g.name for g in draft_devices(DEVICES, wanted, dialect).gpus]

    assert names(["RPC0[127.0.0.1:50053]"], IK) == ["RPC1"]
    assert names(["RPC0[127.0.0.1:50053]", "RPC0[127.0.0.1:50052]"], IK) == ["RPC1", "RPC0"]
    assert names(["rpc0[127.0.0.1:50053]"], IK) == []  # ik: as written
    assert names(["rpc1", "RPC0"], MAINLINE) == ["RPC1", "RPC0"]
    assert names(["none"], IK) == [] and draft_devices(DEVICES, None, IK) is DEVICES
