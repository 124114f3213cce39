"""Hybrid (attention + recurrent) models' memory against the real llama-server.

The pinned build gives qwen3next / qwen35(moe) / nemotron_h_moe / kimi-linear / kimi-k3 a hybrid memory:
a KV cache of the attention layers only and a recurrent state (``RS buffer size``) per buffer type
of the recurrent layers' devices.  Each case runs the real server (-lv 4) with two local
ggml-rpc-servers (RPC0, RPC1) on the project's small hybrid models and compares, per device, the
weights, KV, RS and output buffers with the projection to llama.cpp's printed precision (0.01 MiB).
The compute buffers are compared the same way where the graph is simulated (qwen3next, qwen35,
qwen35moe: core/compute/archs_deltanet.py; not with a draft-mtp context), printed where they are not.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from tests.support.rpc import rpc_servers
from tests.support.server_buffers import mib, rpc_devices, server_output

from offload_planner.backend.log_parser import parse_log
from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.compute import graph_builder
from offload_planner.core.compute.archs_glm5_next import glm5_simulated
from offload_planner.core.gguf_reader import open_model

pytestmark = pytest.mark.integration

EXACT = ("model", "kv", "rs", "output")

# 8 layers: 0-2 and 4-6 recurrent, 3 and 7 attention (full_attention_interval 4)
CASES: list[tuple[str, str]] = [
    ("qwen3next", "-ngl 999 -ts 1,1 -c 4096"),
    ("qwen3next", "-ngl 5 -ts 1,1 -c 4096"),  # layers 0-3 on the CPU, 4-7 over RPC0/RPC1
    ("qwen3next", "-ngl 999 -ts 1,3 -c 4096 -np 2"),
    ("qwen3next", "-ngl 999 -ts 1,1 -c 4096 -np 3 -kvu"),
    ("qwen3next", "-ngl 999 -ts 1,1 -c 2048 -nkvo"),
    ("qwen3next", "-ngl 999 -ts 1,1 -c 2048 -ctk q8_0 -ctv q8_0"),
    ("qwen35moe", "-ngl 999 -ts 1,1 -c 4096"),
    ("qwen35moe", "-ngl 6 -ts 1,1 -c 4096 -np 2"),
    ("qwen35moe", "-ngl 999 -ts 3,1 -c 4096 -np 2 -ot exps=CPU"),
    ("qwen35moe", "-ngl 999 -ts 1,1 -c 2048 -fa off"),
    ("qwen35", "-ngl 999 -ts 1,1 -c 4096 -np 2"),
    # draft-mtp: the main context keeps --spec-draft-n-max (default 3) rollback snapshots per sequence
    # (n_rs_seq), the MTP context a plain KV cache of the NextN layer (layer 8)
    ("qwen35moe-mtp", "-ngl 999 -ts 1,1 -c 4096 -np 2 --spec-type draft-mtp"),
    ("qwen35moe-mtp", "-ngl 7 -ts 1,2 -c 4096 --spec-type draft-mtp --spec-draft-n-max 5"),
    # Nemotron-H MoE "MEM*EME*": Mamba2 layers 0, 2, 5 (RS), attention 3 and 7 (KV), MoE 1, 4, 6 (neither)
    ("nemotron_h_moe", "-ngl 999 -ts 1,1 -c 4096 -np 2"),
    ("nemotron_h_moe", "-ngl 5 -ts 2,1 -c 4096 -np 3 -kvu"),
    ("nemotron_h_moe", "-ngl 999 -ts 1,1 -c 2048 -nkvo"),
    # Kimi-Linear: KDA layers 0-2 and 4-6 (RS: q/k/v conv states and a 32x32 state per head), MLA layers
    # 3 and 7 (a K-only 160-wide cache)
    ("kimi-linear", "-ngl 999 -ts 1,1 -c 4096 -np 2"),
    ("kimi-linear", "-ngl 6 -ts 1,3 -c 4096 -np 4 -ctk q8_0 -ctv q8_0"),
    ("kimi-linear", "-ngl 999 -ts 1,1 -c 2048 -fa off"),
    ("kimi-k3", "-ngl 999 -ts 1,1 -c 4096 -np 2"),
    ("kimi-k3", "-ngl 5 -ts 3,1 -c 4096 -np 4 -kvu"),
    # Granite hybrid: Mamba2 layers 0-2 and 4-6, attention 3 and 7
    ("granitehybrid", "-ngl 999 -ts 1,1 -c 4096 -np 2"),
    ("granitehybrid", "-ngl 4 -ts 1,2 -c 4096 -np 3 -ot exps=CPU"),
    # qwen4exp (llama_memory_hybrid_idx): qwen35moe's layers; the attention layers 3 and 7 also keep an
    # indexer cache (a second KV buffer on their device) of 32 x 2 keys per cell in -ctk's type
    ("qwen4exp", "-ngl 999 -ts 1,1 -c 4096 -np 2 -ctk q8_0"),
    ("qwen4exp", "-ngl 4 -ts 1,1 -c 4096 -np 2 -ctk q8_0"),  # layers 0-3 on the CPU, 4-7 over RPC0/RPC1
    ("qwen4exp", "-ngl 6 -ts 2,1 -c 4096 -np 2 -ctk q8_0 -ctv q8_0"),  # 0-1 CPU, 2-7 RPC0/RPC1
    ("qwen4exp", "-ngl 999 -ts 1,3 -c 4096 -np 3 -kvu"),
    ("qwen4exp", "-ngl 999 -ts 1,1 -c 2048 -nkvo"),
    # PLE on layer 1: its own conv-history row (cache_ple_r_l) in the RS buffer of the layer's device
    ("qwen4exp-ple", "-ngl 999 -ts 1,1 -c 4096 -np 2 -ctk q8_0"),
    ("qwen4exp-ple", "-ngl 7 -ts 1,1 -c 4096 -np 3"),  # layers 0-1 on the CPU
    # draft-mtp: the MTP context's llama_memory_hybrid_idx holds the NextN layer (8) alone: its KV and
    # indexer keys, no recurrent state; the main context keeps the rollback snapshots
    ("qwen4exp-mtp", "-ngl 999 -ts 1,1 -c 4096 -np 2 -ctk q8_0 --spec-type draft-mtp"),
    ("qwen4exp-mtp", "-ngl 7 -ts 1,2 -c 4096 --spec-type draft-mtp --spec-draft-n-max 5"),
    # glm5-next: KDA layers 0-2, 4-6 (RS), nope MLA on 3 and 7 (a K-only 128-wide cache) with an indexer
    # cache of 32 x 3 (key | gate | pooled) per cell; -shared: layer 7 shares layer 3's indexer (no keys)
    # (an MLA model: -ctk and -ctv must agree)
    ("glm5-next", "-ngl 999 -ts 1,1 -c 4096 -np 2 -ctk q8_0 -ctv q8_0"),
    ("glm5-next", "-ngl 4 -ts 1,1 -c 4096 -np 2 -ctk q8_0 -ctv q8_0"),  # layers 0-3 CPU, 4-7 RPC0/RPC1
    ("glm5-next", "-ngl 999 -ts 1,3 -c 4096 -np 3 -kvu"),
    ("glm5-next", "-ngl 999 -ts 1,1 -c 2048 -nkvo"),
    ("glm5-next-shared", "-ngl 999 -ts 1,1 -c 4096 -np 2 -ctk q8_0 -ctv q8_0"),
]


@pytest.fixture(scope="module")
def rpc(llama_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with rpc_servers(llama_bin_dir, 2, tmp_path_factory.mktemp("rpc")) as eps:
        yield eps


@pytest.mark.parametrize(("model_name", "args"), CASES, ids=[f"{m}:{a}" for m, a in CASES])
def test_hybrid_projection_equals_llama_server(
    model_name: str, args: str, small_models: dict[str, Path], llama_server: Path,
    rpc: list[str], tmp_path: Path,
) -> None:
    argv = [re.sub(r"=RPC(\d)$", lambda m: f"=RPC0[{rpc[int(m.group(1))]}]", tok)
            for tok in ["--rpc", ",".join(rpc), *shlex.split(args)]]
    model = open_model(small_models[model_name])
    parsed = parse_server_args(argv)
    assert not parsed.errors, parsed.errors
    analysis = analyse_command(model, rpc_devices(rpc), parsed)
    projection = analysis.projection

    output = server_output(llama_server, ["-m", str(small_models[model_name]), "-fit", "off", *argv],
                           tmp_path / "server.log", timeout=120)
    assert "RS buffer size" in output  # the server made a hybrid memory
    if model.arch in ("qwen4exp", "glm5-next"):  # ... a llama_memory_hybrid_idx, with its indexer cache
        assert "creating indexer KV cache" in output
    actual = parse_log(output.splitlines()).by_device({ep: f"RPC{i}" for i, ep in enumerate(rpc)})

    # a simulated graph: compute too, but the MTP context's compute on RPC devices is not yet exact
    # (qwen35moe-mtp: RPC1 28.16 MiB projected, 43.21 logged; on the CPU alone both contexts are)
    simulated = graph_builder(model) is not None and "--spec-type" not in args
    if model.arch == "glm5-next":  # a CPU layer before a GPU one: the fused mHC post is refused
        assert analysis.plan is not None
        simulated = simulated and glm5_simulated(analysis.plan.placement())
    exact = (*EXACT, "compute") if simulated else EXACT
    rows, bad = [], []
    for dm in projection.devices:
        for kind in (*EXACT, "compute"):
            ours, theirs = mib(dm.total(kind)), actual.get(dm.device.name, {}).get(kind, 0.0)
            rows.append(f"{dm.device.name:5} {kind:8} projected {ours:9.2f}  actual {theirs:9.2f}"
                        + ("" if kind in exact else "  (estimate, not compared)"))
            if kind in exact and abs(ours - theirs) > 0.011:
                bad.append(rows[-1])
    print(f"\n{model_name} {args}\n" + "\n".join(rows))
    assert not bad, "\n".join(bad)
