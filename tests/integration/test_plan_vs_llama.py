"""The engine's projection against the real llama-server, per device and per buffer.

Two local ggml-rpc-servers give llama-server the offload devices RPC0 and RPC1. Each case runs the
real server (-lv 4) on one of the project's small models with a command line, parses the buffer
sizes it logs, and compares them with `analyse_command` on the same argument list:
model, KV and output buffers must equal llama.cpp's to its printed precision (0.01 MiB), compute
buffers be within 5% or 2 MiB (the compute model is in fact exact on these cases).
The table of projected against actual is printed so a regression shows where it is.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from tests.support.rpc import rpc_servers
from tests.support.server_buffers import buffer_rows, rpc_devices, server_output

from offload_planner.backend.log_parser import parse_log
from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.gguf_reader import open_model

pytestmark = pytest.mark.integration

# (model, llama-server arguments). Each runs against RPC0 and RPC1.
CASES: list[tuple[str, str]] = [
    ("qwen3moe", "-ngl 999 -ts 1,1 -c 4096"),
    ("qwen3moe", "-ngl 3 -ts 1,1 -c 4096"),
    ("qwen3moe", "-ngl 2 -ts 1,3 -c 2048"),
    ("qwen3moe", "-ngl 999 -ts 1,1 -c 4096 -ot exps=CPU"),
    ("qwen3moe", "-ngl 999 -ts 1,1 -c 4096 --cpu-moe"),
    ("qwen3moe", "-ngl 999 -ts 1,1 -c 4096 --n-cpu-moe 2"),
    ("qwen3moe", r"-ngl 999 -ts 3,1 -c 4096 -ot blk\.1\.=RPC1 -ot blk\.[0-9]\.ffn_up_exps=CPU"),
    ("qwen3moe", r"-ngl 999 -ts 1,1 -c 4096 -ot blk\.[23]\.ffn_(up|down)_exps=RPC0 -ot exps=CPU"),
    ("qwen3moe", "-ngl 999 -ts 1,1 -c 4096 -b 256 -ub 128"),
    ("qwen3moe", "-ngl 999 -ts 1,1 -c 4096 -lm none -ot exps=CPU"),
    ("deepseek2", "-ngl 999 -ts 1,1 -c 2048"),
    ("deepseek2", "-ngl 999 -ts 1,0 -c 2048 -ctk q8_0 -ctv q8_0"),
    ("deepseek2", "-ngl 4 -ts 1,1 -c 2048 --n-cpu-moe 3"),
    ("glm4moe", "-ngl 999 -ts 1,1 -c 2048"),
    ("glm4moe", "-ngl 3 -ts 1,1 -c 2048 -ot exps=CPU"),
    ("gpt-oss", "-ngl 999 -ts 1,1 -c 4096 -ub 256"),
    ("gpt-oss", "-ngl 999 -ts 1,1 -c 4096 --swa-full"),
    ("gpt-oss", "-ngl 999 -ts 1,1 -c 4096 --cpu-moe -lm none"),
    ("gemma3", "-ngl 999 -ts 1,1 -c 8192"),
    ("gemma3", "-ngl 999 -ts 2,1 -c 8192 -np 2"),
    ("llama", "-ngl 999 -ts 1,1 -c 2048 -nkvo"),
    ("llama", "-ngl 2 -ts 1,1 -c 2048 -lm none"),
    ("llama", "-ngl 999 -ts 1,1 -c 2048 -ctk q8_0 -ctv q8_0 -fa on"),
    ("llama", "-ngl 999 -ts 1,1 -c 1000 -np 3"),
    ("llama", "-ngl 999 -ts 1,1 -c 1000 -np 3 -kvu"),
    ("llama", "-ngl 999 -sm none -mg 1 -c 2048"),
    ("llama", "-ngl 0 -c 2048"),
    ("llama", "-ngl 999 -ts 1,1 -c 2048 -fa off"),
    ("llama", "-ngl 999 -ts 1,1 -c 2048 --no-host -nr"),
    ("qwen3moe", "-ngl 999 -ts 1,1 -c 4096 -np 1"),
    # -dev: the model's devices are the selected ones, in -dev's order (-ts and -mg count them)
    ("qwen3moe", "-ngl 999 -dev RPC1 -c 4096"),
    ("qwen3moe", "-ngl 999 -dev RPC1,RPC0 -ts 3,1 -c 4096"),
    ("qwen3moe", "-ngl 3 -dev RPC1 -c 4096 -ot exps=CPU"),
    ("deepseek2", "-ngl 999 -dev RPC1 -ts 2 -c 2048"),
    ("llama", "-ngl 999 -dev RPC1,RPC0 -sm none -mg 0 -c 2048"),
    ("llama", "-ngl 999 -dev none -c 2048"),
]


@pytest.fixture(scope="module")
def rpc(llama_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with rpc_servers(llama_bin_dir, 2, tmp_path_factory.mktemp("rpc")) as eps:
        yield eps


@pytest.mark.parametrize(("model_name", "args"), CASES, ids=[f"{m}:{a}" for m, a in CASES])
def test_projection_equals_llama_server(
    model_name: str, args: str, small_models: dict[str, Path], llama_server: Path,
    rpc: list[str], tmp_path: Path,
) -> None:
    # -ot names an RPC device's buffer type RPC0[host:port] (each server has one device)
    argv = [re.sub(r"=RPC(\d)$", lambda m: f"=RPC0[{rpc[int(m.group(1))]}]", tok)
            for tok in ["--rpc", ",".join(rpc), *shlex.split(args)]]
    model = open_model(small_models[model_name])
    parsed = parse_server_args(argv)
    assert not parsed.errors, parsed.errors
    result = analyse_command(model, rpc_devices(rpc), parsed)

    output = server_output(llama_server, ["-m", str(small_models[model_name]), "-fit", "off", *argv],
                           tmp_path / "server.log", timeout=120)
    report = parse_log(output.splitlines())
    actual = report.by_device({ep: f"RPC{i}" for i, ep in enumerate(rpc)})

    rows, mismatches = buffer_rows(result.projection, actual)
    print(f"\n{model_name} {args}\n" + "\n".join(rows))
    assert not mismatches, "\n".join(mismatches)


def test_an_exported_command_with_dev_loads_as_projected(
    small_models: dict[str, Path], llama_server: Path, rpc: list[str], tmp_path: Path,
) -> None:
    """The command a plan with a -dev selection exports (``--rpc`` for every server, ``-dev`` in its
    order, ``-ts`` over the selected devices only) loads on the real server as the plan projects it."""
    model = open_model(small_models["qwen3moe"])
    args = shlex.split("-ngl 999 -dev RPC1,RPC0 -ts 3,1 -c 4096")
    parsed = parse_server_args(["--rpc", ",".join(rpc), *args])
    result = analyse_command(model, rpc_devices(rpc), parsed, command=True)
    command = result.command
    assert command[command.index("--rpc") + 1] == ",".join(rpc)
    assert command[command.index("-dev") + 1] == "RPC1,RPC0"
    output = server_output(llama_server, command, tmp_path / "server.log", timeout=120)
    actual = parse_log(output.splitlines()).by_device({ep: f"RPC{i}" for i, ep in enumerate(rpc)})
    rows, mismatches = buffer_rows(result.projection, actual)
    print("\n" + " ".join(command) + "\n" + "\n".join(rows))
    assert not mismatches, "\n".join(mismatches)
