"""A ``-dev`` list naming one device twice (``-dev CUDA0,CUDA0``).

The pinned build keeps every mention: ``parse_device_list`` (common/arg.cpp 1122-1142) and
``llama_prepare_model_devices`` (src/llama.cpp 180-183) push each, the context starts a backend for
each (llama-context.cpp 336-342), ``-ts`` takes a share per mention (llama-model.cpp 1559-1599), and
with everything offloaded two model devices turn pipeline parallelism on (llama-context.cpp 432-459):
the real llama-server with ``-dev RPC0,RPC0`` logs "pipeline parallelism enabled" and compute buffers
of 20.55 / 13.07 MiB where ``-dev RPC0`` has 7.01 / 4.02 (tests/integration/test_dev_repeated_vs_llama.py).
The planner deduplicated the list and projected the single device's figures.

ik_llama.cpp adds it twice too (src/llama.cpp 7822-7826 at 8337e4cd) but then holds the same backend
object twice in its context (8458-8467, reordered by name) and frees it once per entry
(``~llama_context`` 867-869): a double free, refused with the flag named.  A CPU-only ik build's
``-dev CPU,CPU`` is not a reordered backend and loads as ``-dev CPU`` (ik's library, checked in
tests/integration/test_ik_dev_names.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import check_semantics, parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet, build_device_set, parse_device_decl
from offload_planner.core.dialects import Dialect
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.units import GiB

QWEN = Path(__file__).resolve().parents[2] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf"
IK = Dialect("ik_llama.cpp")
MAINLINE = Dialect("llama.cpp")
DEVICES = build_device_set(cpu=Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), detected=[],
                           rpc_endpoints=[],
                           declared=[parse_device_decl("CUDA0=48GiB"), parse_device_decl("CUDA1=24GiB")])
BASE = ["-c", "4096", "-ngl", "99", "-np", "1", "-fit", "off"]


@pytest.fixture(scope="module")
def model() -> Model:
    return open_model(QWEN)


@pytest.mark.parametrize("dialect", [IK, Dialect("ik_llama.cpp-2026-08")])
@pytest.mark.parametrize(("args", "env", "flag"), [
    (["-dev", "CUDA0,CUDA0"], {}, "-dev"),
    (["-dev", "CUDA1,nosuch,CUDA0,CUDA1"], {}, "-dev"),
    (["-md", "d.gguf", "-devd", "CUDA0,CUDA0"], {}, "-devd"),
    (["--device", "CUDA0,CUDA0"], {"LLAMA_ARG_N_GPU_LAYERS": "99"}, "--device"),
])
def test_ik_refuses_a_device_named_twice(dialect: Dialect, args: list[str], env: dict[str, str],
                                         flag: str) -> None:
    parsed = parse_server_args([*BASE[:6], *args], dialect=dialect, env=env)
    assert not parsed.errors, parsed.errors
    errors = check_semantics(parsed, DEVICES.names, dialect=dialect)
    [err] = [e for e in errors if "twice" in e.message]
    assert err.flag == flag and err.message.startswith(f"{flag} "), err
    assert "double free" in err.message and "867-869" in err.message and "8458-8467" in err.message
    assert err.explanation.startswith(f"name each device once: {flag} ")


def test_ik_takes_names_that_reach_one_device_once(model: Model) -> None:
    """ik matches names exactly (a std::map): ``cuda0`` is skipped, so CUDA0 is in the list once; a
    CPU-only build's ``-dev CPU,CPU`` loads as ``-dev CPU``."""
    parsed = parse_server_args([*BASE[:6], "-dev", "CUDA0,cuda0"], dialect=IK)
    assert not check_semantics(parsed, DEVICES.names, dialect=IK)
    cpu = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), ())
    parsed = parse_server_args([*BASE[:6], "-dev", "CPU,CPU"], dialect=IK)
    assert not check_semantics(parsed, cpu.names, dialect=IK)


def _compute(model: Model, args: list[str]) -> tuple[list[str], dict[str, int], list[str]]:
    a = analyse_command(model, DEVICES, parse_server_args([*BASE, *args]), MAINLINE)
    assert a.projection is not None
    placement = a.plan.placement()
    compute = {dm.device.name: dm.total("compute") for dm in a.projection.devices}
    return placement.model_devices, compute, [*a.command_notes, *a.notes]


def test_pinned_build_keeps_every_mention_and_turns_pipeline_parallelism_on(model: Model) -> None:
    devs1, once, _ = _compute(model, ["-dev", "CUDA0"])
    devs2, twice, notes = _compute(model, ["-dev", "CUDA0,CUDA0"])
    assert devs1 == ["CUDA0"] and devs2 == ["CUDA0", "CUDA0"]
    assert twice["CUDA0"] > 1.5 * once["CUDA0"] and twice["CPU"] > 2 * once["CPU"], (once, twice)
    [note] = [n for n in notes if "2 times" in n]
    assert note.startswith("-dev CUDA0,CUDA0: llama.cpp takes CUDA0 2 times as the model's devices")
    assert "pipeline parallelism" in note
    # the fit's own reading of the list (each mention measures the whole device) is not modelled: said
    assert note.endswith("--fit measures CUDA0 once per mention, each seeing everything on it, which the "
                         "planner's fit does not model: with --fit on, what it changes is not projected "
                         "exactly")
    # -ts gives each mention a share; both land on CUDA0 (nothing on CUDA1)
    _, split, _ = _compute(model, ["-dev", "CUDA0,CUDA0", "-ts", "3,1"])
    assert split == twice


def test_pinned_build_draft_devices_named_twice(small_models: dict[str, Path]) -> None:
    """``-devd CUDA0,CUDA0``: the draft's model devices as ``-dev``'s (common_speculative_init_result loads it
    with them): the same weights and KV on CUDA0, its compute with pipeline parallelism (the real server:
    20.55 / 13.07 MiB against 7.01 / 4.02, tests/integration/test_dev_repeated_vs_llama.py); the GPU counted
    once (a first cut counted the draft's weights and KV twice)."""
    model = open_model(small_models["llama"])
    cpu = Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB)
    devices = DeviceSet(cpu, (parse_device_decl("CUDA0=24GiB"),))

    def draft(devd: str) -> dict[str, dict[str, int]]:
        argv = ["-md", str(small_models["llama-draft"]), "-devd", devd, "-c", "2048", "-fit", "off"]
        a = analyse_command(model, devices, parse_server_args(argv), MAINLINE)
        assert a.projection is not None
        (extra,) = a.projection.extras
        return {d: {k: sum(b.bytes for b in extra.buffers if b.device == d and b.kind == k)
                    for k in ("model", "kv", "compute")} for d in ("CUDA0", "CPU")}

    once, twice = draft("CUDA0"), draft("CUDA0,CUDA0")
    for dev in ("CUDA0", "CPU"):
        assert (twice[dev]["model"], twice[dev]["kv"]) == (once[dev]["model"], once[dev]["kv"]), (once, twice)
        assert twice[dev]["compute"] > 2 * once[dev]["compute"], (once, twice)
