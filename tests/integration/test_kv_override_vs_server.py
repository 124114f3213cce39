"""``--override-kv`` against the real llama-server: the items it refuses are refused in its words, and
the overrides the projection models (the experts a token uses, the trained context under ``-c 0``)
load with the buffers the projection gives them, on two ggml-rpc-server devices.

Each buffer case also checks that the override changes what the server allocates beyond the
comparison's tolerance, so the projection of the file's values (what the planner gave before) fails.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
from tests.support.rpc import rpc_servers
from tests.support.server_buffers import buffer_rows, rpc_devices, server_output

from offload_planner.backend.log_parser import parse_log
from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.gguf_reader import open_model

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("value", ["noequals", "k=long:1", "k=bool:yes", "a=int:1,bad",
                                   "k=str:" + "v" * 128])
def test_an_item_the_server_refuses_is_refused_in_its_words(value: str, llama_server: Path,
                                                            tmp_path: Path) -> None:
    r = subprocess.run([str(llama_server), "-m", str(tmp_path / "absent.gguf"), "--override-kv", value],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    said = r.stdout + r.stderr
    ours = parse_server_args(["--override-kv", value]).errors
    assert r.returncode != 0 and len(ours) == 1, said[-1500:]
    assert ours[0].message in said, (ours[0].message, said[-1500:])


@pytest.mark.parametrize("value", ["k=int:x", "k=float:", '"k=str:a,b"', "a=int:1,b=bool:false"])
def test_an_item_the_server_reads_passes(value: str, llama_server: Path, tmp_path: Path) -> None:
    r = subprocess.run([str(llama_server), "-m", str(tmp_path / "absent.gguf"), "--override-kv", value],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    said = r.stdout + r.stderr
    assert "Invalid type for KV override" not in said and "absent.gguf" in said, said[-1500:]
    assert parse_server_args(["--override-kv", value]).ok


@pytest.fixture(scope="module")
def rpc(llama_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with rpc_servers(llama_bin_dir, 2, tmp_path_factory.mktemp("rpc")) as eps:
        yield eps


CASES = [
    # all 8 experts of the small Qwen3 MoE instead of its 2: the MoE activations of a 2048-token ubatch
    ("qwen3moe", "-ngl 999 -ts 1,1 -c 4096 -b 2048 -ub 2048", "qwen3moe.expert_used_count=int:8", "compute"),
    # -c 0 takes the trained context: 1024 cells instead of the file's 4096
    ("qwen3moe", "-ngl 999 -ts 1,1 -c 0 -np 1", "qwen3moe.context_length=int:1024", "kv"),
]


@pytest.mark.parametrize(("model_name", "args", "override", "kind"), CASES, ids=[c[2] for c in CASES])
def test_the_override_loads_as_projected(model_name: str, args: str, override: str, kind: str,
                                         small_models: dict[str, Path], llama_server: Path,
                                         rpc: list[str], tmp_path: Path) -> None:
    path = small_models[model_name]
    model = open_model(path)
    names = {ep: f"RPC{i}" for i, ep in enumerate(rpc)}
    runs = {}
    for label, extra in (("file", []), ("override", ["--override-kv", override])):
        argv = ["--rpc", ",".join(rpc), *shlex.split(args), *extra]
        parsed = parse_server_args(argv)
        assert parsed.ok, parsed.errors
        projection = analyse_command(model, rpc_devices(rpc), parsed).projection
        output = server_output(llama_server, ["-m", str(path), "-fit", "off", *argv],
                               tmp_path / f"{label}.log", timeout=120)
        actual = parse_log(output.splitlines()).by_device(names)
        rows, mismatches = buffer_rows(projection, actual)
        print(f"\n{model_name} {' '.join(argv)}\n" + "\n".join(rows))
        assert not mismatches, "\n".join(mismatches)
        runs[label] = actual
    # the override changed what the server allocates on some device beyond buffer_rows' tolerance: the
    # projection of the file's values fails there
    changed = {}
    for dev in runs["file"].keys() | runs["override"].keys():
        before = runs["file"].get(dev, {}).get(kind, 0.0)
        after = runs["override"].get(dev, {}).get(kind, 0.0)
        if abs(after - before) > (max(0.05 * after, 2.0) if kind == "compute" else 0.011):
            changed[dev] = (before, after)
    print(f"{kind} changed by the override: {changed}")
    assert changed, runs
