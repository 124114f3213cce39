"""DeepSeek V4's memory (core/compressed_kv.py) against the real llama-server.

The pinned build gives deepseek4 a ``llama_kv_cache_dsv4``: a K-only raw window cache of every block,
K-only compressed caches of the ratio-4 (CSA) and ratio-128 (HCA) blocks, the lightning indexer's cache
of the CSA blocks (four ``KV buffer size`` lines per buffer type) and three compressor states (``DSV4
csa|hca|lid state buffer size``, kind ``rs`` here).  Each case runs the real server (-lv 4) with two
local ggml-rpc-servers (RPC0, RPC1) on the project's small deepseek4 model (8 blocks: 0-1 window only,
2/4/6 CSA, 3/5/7 HCA) and compares, per device, the weights, KV, state and output buffers with the
projection to llama.cpp's printed precision (0.01 MiB).  Compute is the planner's estimate (the
deepseek4 graph is not simulated): printed, not compared.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from tests.support.rpc import rpc_servers
from tests.support.server_buffers import mib, rpc_devices, server_output

from offload_planner.backend.log_parser import parse_log
from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.gguf_reader import open_model

pytestmark = pytest.mark.integration

EXACT = ("model", "kv", "rs", "output")

CASES: list[tuple[str, str]] = [
    ("deepseek4", "-ngl 999 -ts 1,1 -c 4096"),
    ("deepseek4", "-ngl 5 -ts 1,1 -c 4096 -np 2"),  # blocks 0-2 on the CPU, 3-7 over RPC0/RPC1
    ("deepseek4", "-ngl 6 -ts 1,3 -c 8192 -np 2 -ctk q8_0 -ctv q8_0"),
    ("deepseek4", "-ngl 999 -ts 1,1 -c 4096 -fa off"),
    ("deepseek4", "-ngl 999 -ts 2,1 -c 6000 -np 3 -kvu"),  # -kvu: the DSV4 caches stay per sequence
    ("deepseek4", "-ngl 999 -ts 1,1 -c 2048 -nkvo"),
    ("deepseek4", "-ngl 999 -ts 1,1 -c 4096 -ub 128 --swa-full"),
    # draft-mtp: the main context's raw cache holds the NextN block (block 4) too and its compressor states
    # keep --spec-draft-n-max (default 3) rollback planes per sequence; the MTP context a plain ISWA cache
    # (K and V) of the NextN block
    ("deepseek4-mtp", "-ngl 999 -ts 1,1 -c 4096 -np 2 --spec-type draft-mtp"),
    ("deepseek4-mtp", "-ngl 3 -ts 1,2 -c 4096 --spec-type draft-mtp --spec-draft-n-max 5"),
]


@pytest.fixture(scope="module")
def rpc(llama_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with rpc_servers(llama_bin_dir, 2, tmp_path_factory.mktemp("rpc")) as eps:
        yield eps


@pytest.mark.parametrize(("model_name", "args"), CASES, ids=[f"{m}:{a}" for m, a in CASES])
def test_dsv4_projection_equals_llama_server(
    model_name: str, args: str, small_models: dict[str, Path], llama_server: Path, rpc: list[str],
    tmp_path: Path,
) -> None:
    argv = ["--rpc", ",".join(rpc), *shlex.split(args)]
    path = small_models[model_name]
    model = open_model(path)
    parsed = parse_server_args(argv)
    assert not parsed.errors, parsed.errors
    projection = analyse_command(model, rpc_devices(rpc), parsed).projection

    output = server_output(llama_server, ["-m", str(path), "-fit", "off", *argv], tmp_path / "server.log",
                           timeout=120)
    assert "creating DSV4 lightning-indexer KV cache" in output  # the server made the DSV4 memory
    actual = parse_log(output.splitlines()).by_device({ep: f"RPC{i}" for i, ep in enumerate(rpc)})

    rows, bad = [], []
    for dm in projection.devices:
        for kind in (*EXACT, "compute"):
            ours, theirs = mib(dm.total(kind)), actual.get(dm.device.name, {}).get(kind, 0.0)
            rows.append(f"{dm.device.name:5} {kind:8} projected {ours:9.2f}  actual {theirs:9.2f}"
                        + ("" if kind in EXACT else "  (estimate, not compared)"))
            if kind in EXACT and abs(ours - theirs) > 0.011:
                bad.append(rows[-1])
    print(f"\n{model_name} {args}\n" + "\n".join(rows))
    assert not bad, "\n".join(bad)


def test_different_k_and_v_types_refused_like_llama_server(
    small_models: dict[str, Path], llama_server: Path, tmp_path: Path,
) -> None:
    """deepseek4's caches are K only: llama_init_from_model refuses -ctk without the same -ctv, and the
    planner says so with the server's words."""
    from tests.support.procs import ProcessFailed

    from offload_planner.core.cmdline.semantics import check_semantics

    argv = ["-c", "2048", "-ctk", "q8_0"]
    with pytest.raises(ProcessFailed) as failed:
        server_output(llama_server, ["-m", str(small_models["deepseek4"]), "-fit", "off", *argv],
                      tmp_path / "server.log", timeout=120)
    said = "model does not support different K (q8_0) and V (f16) cache types"
    assert said in str(failed.value)
    errors = check_semantics(parse_server_args(argv), (), arch="deepseek4")
    assert any(said in e.message for e in errors), errors
