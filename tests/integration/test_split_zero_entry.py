"""A ``-ts`` with a 0 entry, on the real llama-server with four RPC devices.

llama.cpp's own ``--fit`` writes such entries (a GPU it leaves empty), and the plans the engine
writes pin ``-ts`` to the layers each GPU holds, so a GPU that holds none gets a 0. Four local
ggml-rpc-servers give llama-server RPC0..RPC3; each case plans a command with a 0 entry in its
split (first, middle, last, two of them), checks that the command the planner writes for it keeps
the 0 and the same placement, runs that command, and compares every buffer llama-server logs on
every device with the projection: model, KV and output to llama.cpp's printed 0.01 MiB, compute
within 5% or 2 MiB (as ``test_plan_vs_llama``). The device the split leaves empty must hold
nothing in either.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from tests.support.rpc import rpc_servers
from tests.support.server_buffers import buffer_rows, rpc_devices, server_output

from offload_planner.backend.log_parser import parse_log
from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_command, plan_from_args

pytestmark = pytest.mark.integration

N_RPC = 4

# (model, llama-server arguments, the devices the split leaves empty)
CASES: list[tuple[str, str, tuple[str, ...]]] = [
    ("qwen3moe", "-ngl 999 -ts 0,1,1,1 -c 4096", ("RPC0",)),
    ("qwen3moe", "-ngl 999 -ts 1,0,1,1 -c 4096 --n-cpu-moe 1", ("RPC1",)),
    ("llama", "-ngl 999 -ts 1,1,1,0 -c 2048", ("RPC3",)),  # the output layer: on RPC2, not the last
    ("deepseek2", "-ngl 999 -ts 0,1,0,1 -c 2048", ("RPC0", "RPC2")),
    ("gemma3", "-ngl 999 -ts 1,0,0,1 -c 8192", ("RPC1", "RPC2")),
]


@pytest.fixture(scope="module")
def rpc(llama_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with rpc_servers(llama_bin_dir, N_RPC, tmp_path_factory.mktemp("rpc4")) as eps:
        yield eps


def _split(argv: list[str]) -> list[str]:
    return argv[argv.index("-ts") + 1].split(",")


@pytest.mark.parametrize(("model_name", "args", "empty"), CASES, ids=[f"{m}:{a}" for m, a, _ in CASES])
def test_a_zero_split_entry_loads_as_projected(
    model_name: str, args: str, empty: tuple[str, ...], small_models: dict[str, Path],
    llama_server: Path, rpc: list[str], tmp_path: Path,
) -> None:
    model = open_model(small_models[model_name])
    devices = rpc_devices(rpc)
    parsed = parse_server_args(["--rpc", ",".join(rpc), *shlex.split(args)])
    assert not parsed.errors, parsed.errors
    plan = plan_from_args(model, devices, parsed)
    command = plan_command(plan)
    split = _split(command)
    assert [f"RPC{i}" for i, n in enumerate(split) if n == "0"] == list(empty), command
    # the planned command is what runs: it must place every tensor as the command it came from
    planned = parse_server_args(command)
    assert not planned.errors, planned.errors
    assert plan_from_args(model, devices, planned).placement().tensor_devices() == \
        plan.placement().tensor_devices()
    projection = analyse_command(model, devices, planned).projection

    output = server_output(llama_server, command, tmp_path / "server.log", timeout=180)
    report = parse_log(output.splitlines())
    assert report.listening_url, output[-3000:]
    actual = report.by_device({ep: f"RPC{i}" for i, ep in enumerate(rpc)})

    rows, mismatches = buffer_rows(projection, actual)
    print(f"\n{model_name} {shlex.join(command[2:])}\n" + "\n".join(rows))
    assert not mismatches, "\n".join(mismatches)
    for name in empty:  # nothing of the model on the device the split leaves empty
        assert not any(actual.get(name, {}).get(k) for k in ("model", "kv")), (name, actual.get(name))
        assert projection.device(name).total("model") == projection.device(name).total("kv") == 0
