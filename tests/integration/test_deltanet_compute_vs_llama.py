"""The gated-delta-net hybrids' compute buffers (:mod:`offload_planner.core.compute.archs_deltanet`)
against the real llama-server on local ggml-rpc-server devices.

The small synth models of qwen3next (fused ``ssm_ba``, key heads repeated up to the value heads),
qwen35moe (split ``ssm_beta``/``ssm_alpha``, IMRoPE positions) and qwen35 (dense): 8 layers, every
fourth one full attention.  Each command line is projected as the planner projects it (its plan's
compute buffers) and must equal, per device, the compute buffer the server prints to its 0.01 MiB;
the graph's node and split counts must equal the ones ``sched_reserve`` logs.  With ``--spec-type
draft-mtp`` (the synth models with an MTP block after the trunk) the Qwen3.5 main context keeps
rollback snapshots (``n_rs_seq``), and the MTP context's compute buffers (its NextN block's graph,
:mod:`offload_planner.core.compute.mtp`) are compared the same way.  Measured: every case equal
(before the port these archs took the estimate: qwen3next all on RPC0 at -c 4096 -np 4 -kvu
estimates 8.52 / 6.00 MiB where the server reserves 7.51 / 6.02)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from tests.support.rpc import rpc_servers
from tests.support.server_buffers import mib, rpc_devices, server_output
from tests.support.spec_log import split_log

from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.compute import simulate
from offload_planner.core.extra_context import MTP
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import resolve_context
from offload_planner.core.synth import SMALL_MODELS, write_model

pytestmark = pytest.mark.integration

# (model, number of RPC devices, llama-server arguments)
CASES: list[tuple[str, int, str]] = [
    ("qwen3next", 1, "-c 4096 -ngl 999"),
    ("qwen3next", 2, "-c 4096 -ngl 999"),  # split by layer, pipeline parallelism
    ("qwen3next", 2, "-c 4096 -ngl 5"),  # three layers and the output on the CPU
    ("qwen3next", 1, "-c 4096 -ngl 4"),
    ("qwen3next", 1, "-c 4096 -ngl 999 -ot exps=CPU"),
    ("qwen3next", 1, "-c 4096 -ngl 999 -fa off"),
    ("qwen3next", 1, "-c 4096 -b 2048 -ub 2048 -ngl 999"),
    ("qwen3next", 2, "-c 4096 -b 1024 -ub 1024 -ngl 999 -fa off"),
    ("qwen3next", 1, "-c 4096 -ngl 999 -nkvo"),  # recurrent states on the host
    ("qwen3next", 1, "-c 4096 -ngl 999 -np 2"),
    ("qwen3next", 1, "-c 4096 -ngl 999 -ub 16"),  # norms forced onto their layer's device
    ("qwen35moe", 1, "-c 4096 -ngl 999"),
    ("qwen35moe", 2, "-c 4096 -ngl 999"),
    ("qwen35moe", 2, "-c 4096 -ngl 5"),
    ("qwen35moe", 1, "-c 4096 -ngl 4"),
    ("qwen35moe", 1, "-c 4096 -ngl 999 -ot exps=CPU"),
    ("qwen35moe", 1, "-c 4096 -ngl 999 -fa off"),
    ("qwen35moe", 1, "-c 4096 -b 2048 -ub 2048 -ngl 999"),
    ("qwen35moe", 2, "-c 4096 -b 1024 -ub 1024 -ngl 999 -fa off"),
    ("qwen35moe", 1, "-c 4096 -ngl 999 -nkvo"),
    ("qwen35moe", 1, "-c 4096 -ngl 999 -np 3"),
    ("qwen35moe", 1, "-c 4096 -ngl 999 -ctk q8_0 -ctv q8_0"),
    # draft-mtp: the main context keeps --spec-draft-n-max (3, or 5) rollback snapshots per sequence
    ("qwen35moe-mtp", 1, "-c 4096 -ngl 999 --spec-type draft-mtp"),
    ("qwen35moe-mtp", 2, "-c 4096 -ngl 999 -np 2 --spec-type draft-mtp"),
    ("qwen35moe-mtp", 2, "-c 4096 -ngl 7 --spec-type draft-mtp --spec-draft-n-max 5"),
    ("qwen35moe-mtp", 1, "-c 4096 -ngl 999 --spec-type draft-mtp -nkvo -fa off"),
    ("qwen35moe-mtp", 1, "-c 4096 -ngl 999 --spec-type draft-mtp -ub 2"),  # fewer tokens than slots
    # the catalogue's Qwen3-Next and dense Qwen3.5 with an MTP block the same way (``_MTP_OF``)
    ("qwen3next-mtp", 1, "-c 4096 -ngl 999 --spec-type draft-mtp"),
    ("qwen3next-mtp", 1, "-c 4096 -ngl 999 --spec-type draft-mtp -nkvo -fa off"),
    ("qwen35-mtp", 2, "-c 4096 -ngl 999 -np 2 --spec-type draft-mtp"),
    ("qwen35", 2, "-c 4096 -ngl 999"),
    ("qwen35", 1, "-c 4096 -ngl 4 -fa off"),
    # qwen4exp (archs_qwen4exp): hyper-connections, QSA k-pool indexer over llama_memory_hybrid_idx
    ("qwen4exp", 1, "-c 4096 -ngl 999"),
    ("qwen4exp", 2, "-c 4096 -ngl 999"),
    ("qwen4exp", 2, "-c 4096 -ngl 5"),
    ("qwen4exp", 1, "-c 4096 -ngl 999 -ot exps=CPU"),
    ("qwen4exp", 1, "-c 4096 -ngl 999 -fa off"),
    ("qwen4exp", 1, "-c 4096 -b 2048 -ub 2048 -ngl 999"),
    ("qwen4exp", 1, "-c 4096 -ngl 999 -ub 16"),
    ("qwen4exp", 2, "-c 4096 -ngl 999 -np 2 -kvu"),
    ("qwen4exp", 1, "-c 4096 -ngl 999 -np 2"),
    ("qwen4exp", 1, "-c 4096 -ngl 999 -nkvo"),
    ("qwen4exp", 1, "-c 4096 -ngl 999 -ctk q8_0 -ctv q8_0"),
    ("qwen4exp-mtp", 1, "-c 4096 -ngl 999"),  # the NextN block loaded, unused
    # draft-mtp: the MTP context's graph (graph_mtp: its QSA NextN block through the hyper-connections)
    ("qwen4exp-mtp", 1, "-c 4096 -ngl 999 --spec-type draft-mtp"),
    ("qwen4exp-mtp", 2, "-c 4096 -ngl 999 -np 2 --spec-type draft-mtp"),
    ("qwen4exp-mtp", 2, "-c 4096 -ngl 7 --spec-type draft-mtp --spec-draft-n-max 5"),
    ("qwen4exp-mtp", 1, "-c 4096 -ngl 999 --spec-type draft-mtp -fa off -ub 2048 -b 2048"),
    # the fused hyper-connection ops stay enabled with a CPU layer before GPU ones and with a layer's
    # mixer or projections on the host (unlike glm5-next's mHC post, below)
    ("qwen4exp", 2, "-c 4096 -ngl 8"),
    ("qwen4exp", 1, "-c 4096 -ngl 1"),
    ("qwen4exp", 2, "-c 4096 -ngl 999 -ot blk.2.hc_ffn=CPU"),
    ("qwen4exp", 2, "-c 4096 -ngl 999 -ot blk.5.hc_attn=CPU,blk.6.ffn=CPU"),
    # PLE n-gram embeddings on layer 1: the hashed rows, the gate, the dilated conv over cache_ple_r_l
    ("qwen4exp-ple", 1, "-c 4096 -ngl 999"),
    ("qwen4exp-ple", 2, "-c 4096 -ngl 999 -np 2 -kvu"),
    ("qwen4exp-ple", 2, "-c 4096 -ngl 2"),  # layer 1 (PLE) on the CPU
    ("qwen4exp-ple", 1, "-c 4096 -b 2048 -ub 2048 -ngl 999 -ot exps=CPU"),
    # glm5-next (archs_glm5_next): KDA layers, mHC streams, nope MLA with the k-pool DSA indexer
    ("glm5-next", 1, "-c 4096 -ngl 999"),
    ("glm5-next", 2, "-c 4096 -ngl 999 -np 2 -kvu"),
    ("glm5-next", 1, "-c 4096 -ngl 999 -ot exps=CPU"),
    ("glm5-next", 1, "-c 4096 -ngl 999 -fa off"),
    ("glm5-next", 1, "-c 4096 -b 2048 -ub 2048 -ngl 999"),
    ("glm5-next", 1, "-c 4096 -ngl 999 -ub 32"),
    ("glm5-next", 1, "-c 4096 -ngl 999 -nkvo"),
    ("glm5-next", 1, "-c 4096 -ngl 999 -np 2"),
    ("glm5-next", 1, "-c 4096 -ngl 0"),
    ("glm5-next", 2, "-c 4096 -ngl 999 -ctk q8_0 -ctv q8_0"),
    ("glm5-next-shared", 2, "-c 4096 -ngl 999"),  # layer 7 reuses layer 3's selection
]

_GRAPH = re.compile(r"sched_reserve: graph(?: \(pp bs=\d+, tg bs=\d+\))?: "
                    r"nodes = ([\d /]+), splits = ([\d /]+),")


#: small models this module writes from the catalogue's: an MTP block after the trunk, as qwen35moe-mtp
_MTP_OF = {"qwen3next-mtp": "qwen3next", "qwen35-mtp": "qwen35"}


@pytest.fixture(scope="module")
def models(small_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mtp_models")
    out = dict(small_models)
    for name, base in _MTP_OF.items():
        spec = replace(SMALL_MODELS[base], name=f"synth-{name}", n_layer=SMALL_MODELS[base].n_layer + 1,
                       n_nextn=1, nextn_embed_head=False)
        out[name] = write_model(spec, root / f"{name}.gguf")[0]
    return out


@pytest.fixture(scope="module")
def endpoints(llama_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    with rpc_servers(llama_bin_dir, 2, tmp_path_factory.mktemp("rpc")) as eps:
        yield eps


def _counts(text: str) -> list[int]:
    """``"736"`` or ``"736 / 740"`` (pp / tg): both reserves' counts."""
    parts = [int(x) for x in text.split("/")]
    return parts * 2 if len(parts) == 1 else parts


@pytest.mark.parametrize(("name", "n_rpc", "args"), CASES, ids=[f"{m}-rpc{n}-{a}" for m, n, a in CASES])
def test_compute_buffers_equal_the_servers(name: str, n_rpc: int, args: str, endpoints: list[str],
                                           models: dict[str, Path], llama_server: Path,
                                           tmp_path: Path) -> None:
    path = models[name]
    model = open_model(path)
    eps = endpoints[:n_rpc]
    devices = rpc_devices(eps)
    argv = ["--rpc", ",".join(eps), "-m", str(path), "-fit", "off", *shlex.split(args)]
    analysis = analyse_command(model, devices, parse_server_args(argv))
    assert analysis.projection is not None and analysis.plan is not None
    output = server_output(llama_server, argv, tmp_path / "server.log", timeout=180)
    assert "listening on http://" in output, output[-3000:]
    main, extra = split_log(output.splitlines(), {ep: f"RPC{i}" for i, ep in enumerate(eps)})
    rows = []
    for owner, actual in (("", main), (MTP, extra)):
        for dm in analysis.projection.devices:
            compute = [b for b in dm.buffers if b.kind == "compute" and b.owner == owner]
            assert not any(b.why.startswith("estimate") for b in compute), [b.why for b in compute]
            ours = mib(sum(b.bytes for b in compute))
            rows.append((owner, dm.device.name, ours, actual.get(dm.device.name, {}).get("compute", 0.0)))
    assert all(abs(ours - theirs) <= 0.011 for _, _, ours, theirs in rows), rows
    plan = analysis.plan
    ctx = resolve_context(plan.context, model.summary.n_ctx_train, model.summary.n_swa)
    sim = simulate(model, devices, plan.placement(), ctx, plan.context)
    assert sim is not None
    m = _GRAPH.search(output)
    assert m is not None, output[-3000:]
    assert [r.n_nodes for r in sim.reserves] == _counts(m.group(1))
    assert [r.n_splits for r in sim.reserves] == _counts(m.group(2))


@pytest.mark.parametrize(("n_rpc", "args", "fused"), [
    (2, "-c 4096 -ngl 5", False),  # layers 0-3 on the CPU, then RPC0: the layer-3 combine lands on RPC0
    (1, "-c 4096 -ngl 8", False),  # layer 0 on the CPU
    (2, "-c 4096 -ngl 999", True),
    (1, "-c 4096 -ngl 999 -ot exps=CPU", True),
])
def test_glm5_next_simulated_where_the_fused_mhc_post_is_enabled(
        n_rpc: int, args: str, fused: bool, endpoints: list[str], models: dict[str, Path],
        llama_server: Path, tmp_path: Path) -> None:
    """glm5-next's graph is built with the fused mHC ops: llama.cpp's fused-op resolution disables the
    fused post when a CPU layer precedes a GPU one (the unfused combine, not built), and the plan then
    takes the estimate (``glm5_simulated``)."""
    from offload_planner.core.compute.archs_glm5_next import glm5_simulated

    path = models["glm5-next"]
    eps = endpoints[:n_rpc]
    argv = ["--rpc", ",".join(eps), "-m", str(path), "-fit", "off", *shlex.split(args)]
    analysis = analyse_command(open_model(path), rpc_devices(eps), parse_server_args(argv))
    assert analysis.plan is not None
    output = server_output(llama_server, argv, tmp_path / "server.log", timeout=180)
    assert "listening on http://" in output, output[-3000:]
    assert ("fused DeepSeek V4 HC post enabled" in output) is fused
    assert glm5_simulated(analysis.plan.placement()) is fused
