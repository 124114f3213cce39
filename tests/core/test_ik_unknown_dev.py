"""``-dev``/``-devd`` names ik_llama.cpp has no device of: skipped at load, not refused.

ik's parser checks nothing but a blank or a ``-`` (common/common.cpp 573-578 ``parse_device_list`` at
8337e4cd; 2296-2307 stores ``-dev``/``-devd`` as given); the loader looks each name up, exactly as
written, among its devices' buffer-type names (src/llama.cpp 7788-7828: ``buffer_names``, a
``std::map``), logs ``"%s backend not available.\\n"`` for one it has not and goes on; with none left it
sets ``n_gpu_layers = 0`` and logs "CPU: using device CPU" (7830-7833).  ``-devd`` names reach the same
loader for the draft (common/speculative.cpp 1950).  The same loop since ``-dev`` came to ik (PR 866,
904e994bf) and in the PyPI wheel's 55d3c05 (src/llama.cpp 5217-5228); the wheel's log checked in
tests/integration/test_ik_dev_names.py.  The planner refused such names for ik with the pinned
build's "invalid device" (common/arg.cpp 1133-1135, which it keeps for mainline)."""

from __future__ import annotations

from pathlib import Path

import pytest

from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import check_semantics, parse_server_args, skipped_devices
from offload_planner.core.command_text import plan_from_command
from offload_planner.core.devices import Device, DeviceKind, build_device_set, parse_device_decl
from offload_planner.core.dialects import Dialect
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.units import GiB

QWEN = Path(__file__).resolve().parents[2] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf"
IK = Dialect("ik_llama.cpp")
MAINLINE = Dialect("llama.cpp")
DEVICES = build_device_set(cpu=Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), detected=[],
                           rpc_endpoints=[],
                           declared=[parse_device_decl("CUDA0=24GiB"), parse_device_decl("CUDA1=24GiB")])
BASE = ["-c", "4096", "-ngl", "99", "-np", "1"]


@pytest.fixture(scope="module")
def model() -> Model:
    return open_model(QWEN)


def _gpu_bytes(model: Model, args: list[str]) -> dict[str, int]:
    shown = analyse_command(model, DEVICES, parse_server_args([*BASE, *args], dialect=IK), IK)
    assert shown.projection is not None
    devices = shown.projection.devices
    return {d.device.name: sum(b.bytes for b in d.buffers) for d in devices if d.device.is_gpu}


@pytest.mark.parametrize("dialect", [IK, Dialect("ik_llama.cpp-2026-08")])
def test_ik_takes_an_unknown_name_and_says_it_skips_it(dialect: Dialect) -> None:
    parsed = parse_server_args([*BASE, "-dev", "cuda1,CUDA0"], dialect=dialect)
    assert not parsed.errors and not check_semantics(parsed, DEVICES.names, dialect=dialect)
    [warning] = skipped_devices(parsed, DEVICES.names)
    assert warning.message.startswith('-dev cuda1,CUDA0: ik_llama.cpp logs "cuda1 backend not available." '
                                      "and skips it"), warning
    assert "CPU only" not in warning.message  # CUDA0 is left
    assert dialect.selected_gpus(parsed.args.devices, DEVICES.gpus) == ("CUDA0",)


def test_none_left_loads_on_the_cpu(model: Model) -> None:
    """``-dev cuda1`` (ik matches names as written): nothing left, so ik loads the model on the CPU
    (n_gpu_layers = 0) and the plan puts nothing on either GPU; the note says so, in ik's words."""
    assert set(_gpu_bytes(model, ["-dev", "cuda1"]).values()) == {0}
    assert _gpu_bytes(model, ["-dev", "cuda1"]) == _gpu_bytes(model, ["-dev", "none"])
    assert _gpu_bytes(model, ["-dev", "CUDA1"])["CUDA1"] > 0
    shown = analyse_command(model, DEVICES, parse_server_args([*BASE, "-dev", "cuda1,XPU0"], dialect=IK), IK)
    said = [n for n in shown.command_notes if n.startswith("-dev cuda1,XPU0:")]
    assert said == ['-dev cuda1,XPU0: ik_llama.cpp logs "cuda1 backend not available.", "XPU0 backend not '
                    'available." and skips them (it looks -dev names up exactly as written among its devices '
                    'when it loads the model); no device is left, so the model loads on the CPU only '
                    '(n_gpu_layers = 0: "CPU: using device CPU") (its devices: CUDA0, CUDA1)'], \
        shown.command_notes


def test_the_cpu_is_not_one_of_iks_offload_devices() -> None:
    """ik's ``-dev`` names are its offload devices' buffer types (src/llama.cpp 7795-7801): with a GPU the
    CPU is not among them (a CPU-only build lists it as its one device)."""
    parsed = parse_server_args(["-dev", "CPU,CUDA1"], dialect=IK)
    [warning] = skipped_devices(parsed, DEVICES.names)
    assert '"CPU backend not available."' in warning.message
    cpu_only = build_device_set(cpu=Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), detected=[],
                                rpc_endpoints=[], declared=[])
    assert not skipped_devices(parse_server_args(["-dev", "CPU"], dialect=IK), cpu_only.names)


def test_devd_names_are_skipped_for_the_draft() -> None:
    parsed = parse_server_args(["-md", "d.gguf", "--spec-type", "draft", "-devd", "cuda0"], dialect=IK)
    assert not check_semantics(parsed, DEVICES.names, dialect=IK)
    [warning] = skipped_devices(parsed, DEVICES.names)
    assert warning.flag == "-devd"
    assert warning.message.startswith('-devd cuda0: ik_llama.cpp logs "cuda0 backend not available."')
    assert warning.message.endswith("no device is left, so the draft model loads on the CPU only "
                                    '(n_gpu_layers = 0: "CPU: using device CPU")')


def test_rpc_names_are_looked_up_at_load_in_any_order() -> None:
    """ik resolves ``-dev`` when it loads the model, after reading every argument: an RPC device named
    before ``--rpc`` is found (the pinned build resolves it while parsing: ``--rpc`` must come first)."""
    ep = "127.0.0.1:50052"
    rpc = build_device_set(cpu=Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), detected=[],
                           rpc_endpoints=[ep], declared=[parse_device_decl("RPC0=24GiB")])
    parsed = parse_server_args(["-dev", f"RPC0[{ep}]", "--rpc", ep], dialect=IK)
    assert not check_semantics(parsed, rpc.names, dialect=IK) and not skipped_devices(parsed, rpc.names)
    mainline = parse_server_args(["-dev", "RPC0", "--rpc", ep], dialect=MAINLINE)
    assert check_semantics(mainline, rpc.names, dialect=MAINLINE)


def test_mainline_still_refuses_an_unknown_name() -> None:
    parsed = parse_server_args(["-dev", "cuda1,XPU0"], dialect=MAINLINE)
    [error] = check_semantics(parsed, DEVICES.names, dialect=MAINLINE)
    assert error.message == 'error while handling argument "-dev": invalid device: XPU0'
    assert not skipped_devices(parsed, DEVICES.names)


def test_a_pasted_ik_command_says_it_in_the_notes(model: Model) -> None:
    """The window's Paste command: ik's note among the notes the Problems tab lists, no refusal."""
    plan = plan_from_args(model, DEVICES, parse_server_args(BASE, dialect=IK), IK)
    new, notes = plan_from_command(plan, "llama-server -m x.gguf -c 4096 -ngl 99 -dev CUDA1,Cuda0")
    assert new.placement_options.selected == ("CUDA1",)
    assert not [n for n in notes if "refuse" in n], notes
    assert [n for n in notes if n.startswith(
        'pasted command: -dev CUDA1,Cuda0: ik_llama.cpp logs "Cuda0 backend not available." and skips it')]
