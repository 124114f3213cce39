"""DeepSeek Sparse Attention models (deepseek32, glm-dsa) on the real llama-server: the weights, both
caches of ``llama_kv_cache_dsa`` (the K-only MLA cache, then the lightning indexer's key cache, each its
own "KV buffer size" line per device) and the output buffer, held to the printed MiB per device and per
cache, on two local ggml-rpc-servers with the layers split RPC0 / RPC1 / CPU; and the compute buffers of
the DSA graph (core.compute.dsa: the lightning indexer, top-k and the sparse MLA mask) to the same 0.01 MiB.
"""

from __future__ import annotations

import re
import shlex
from collections import defaultdict
from pathlib import Path

import pytest
from tests.support.rpc import rpc_servers
from tests.support.server_buffers import KINDS, buffer_rows, mib, rpc_devices, server_output
from tests.support.spec_log import split_log

from offload_planner.backend.log_parser import parse_log
from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.extra_context import MTP
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import Projection

pytestmark = pytest.mark.integration

CASES: list[tuple[str, str]] = [
    ("deepseek32", "-ngl 3 -ts 1,1 -c 2048 -np 2 -ctk q8_0 -ctv q8_0"),
    ("deepseek32", "-ngl 4 -ts 1,3 -c 2048 -np 2 -ctk q8_0 -ctv q8_0"),  # trunk layers on CPU, RPC0, RPC1
    ("glm-dsa", "-ngl 5 -ts 2,3 -c 3072 -np 3 -fa off"),  # trunk layers on CPU, RPC0, RPC1
    ("deepseek32", "-ngl 999 -ts 1,1 -c 3000 -np 3 -kvu"),
    ("deepseek32", "-ngl 999 -ts 2,1 -c 2048 -nkvo -fa off"),
    ("glm-dsa", "-ngl 3 -ts 1,1 -c 2048 -np 2 -ctk q8_0 -ctv q8_0"),
    ("glm-dsa", "-ngl 999 -ts 1,3 -c 4096"),
    ("deepseek32", "-ngl 999 -ts 1,1 -c 2048 -ub 128 -ot exps=CPU"),
    ("glm-dsa", "-ngl 999 -ts 1,1 -c 1024 -np 4 --n-cpu-moe 2 -b 256"),
]

_CACHE = re.compile(r"llama_kv_cache_dsa: creating (main|indexer) KV cache, size = (\d+) cells")
_KV_LINE = re.compile(r"llama_kv_cache:\s+(\S+) KV buffer size =\s+([\d.]+) MiB")


def _logged_caches(output: str, rpc: list[str]) -> dict[str, dict[str, float]]:
    """MiB per cache ("main" / "indexer") and device, from the lines after each "creating" line."""
    names = {f"RPC0[{ep}]": f"RPC{i}" for i, ep in enumerate(rpc)}
    out: dict[str, dict[str, float]] = defaultdict(dict)
    cache = ""
    for line in output.splitlines():
        if m := _CACHE.search(line):
            cache = m.group(1)
        elif cache and (m := _KV_LINE.search(line)):
            out[cache][names.get(m.group(1), m.group(1))] = float(m.group(2))
        elif "sched_reserve" in line:
            cache = ""
    return dict(out)


def _projected_caches(projection: Projection) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for dm in projection.devices:
        for b in dm.buffers:
            if b.kind == "kv" and not b.owner:
                cache = "indexer" if "lightning indexer" in b.why else "main"
                out[cache][dm.device.name] += b.bytes
    return {c: {d: mib(n) for d, n in per.items()} for c, per in out.items()}


@pytest.fixture(scope="module")
def rpc(llama_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with rpc_servers(llama_bin_dir, 2, tmp_path_factory.mktemp("rpc")) as eps:
        yield eps


@pytest.mark.parametrize(("model_name", "args"), CASES, ids=[f"{m}:{a}" for m, a in CASES])
def test_dsa_caches_equal_llama_server(model_name: str, args: str, small_models: dict[str, Path],
                                       llama_server: Path, rpc: list[str], tmp_path: Path) -> None:
    argv = ["--rpc", ",".join(rpc), *shlex.split(args)]
    model = open_model(small_models[model_name])
    parsed = parse_server_args(argv)
    assert not parsed.errors, parsed.errors
    projection = analyse_command(model, rpc_devices(rpc), parsed).projection
    assert projection is not None
    output = server_output(llama_server, ["-m", str(small_models[model_name]), "-fit", "off", *argv],
                           tmp_path / "server.log", timeout=180)
    assert "listening on http://" in output, output[-3000:]
    actual = parse_log(output.splitlines()).by_device({ep: f"RPC{i}" for i, ep in enumerate(rpc)})
    rows, mismatches = buffer_rows(projection, actual)
    theirs, ours = _logged_caches(output, rpc), _projected_caches(projection)
    rows += [f"{cache:7} KV {dev:5} projected {ours.get(cache, {}).get(dev, 0.0):9.2f}  actual {v:9.2f}"
             for cache, per in theirs.items() for dev, v in per.items()]
    print(f"\n{model_name} {args}\n" + "\n".join(rows))
    assert set(theirs) == {"main", "indexer"}
    assert ours == theirs
    assert mismatches == []
    compute = [(mib(dm.total("compute")), round(actual.get(dm.device.name, {}).get("compute", 0.0), 2))
               for dm in projection.devices]
    assert all(abs(a - b) <= 0.011 for a, b in compute), compute  # the DSA graph, to the printed MiB


MTP_CASES: list[tuple[str, str]] = [
    ("deepseek32", "-ngl 999 -ts 1,1 -c 2048 --spec-type draft-mtp -np 2"),
    ("glm-dsa", "-ngl 4 -ts 1,1 -c 2048 --spec-type draft-mtp -ctk q8_0 -ctv q8_0"),
]


@pytest.mark.parametrize(("model_name", "args"), MTP_CASES, ids=[f"{m}:{a}" for m, a in MTP_CASES])
def test_dsa_mtp_context_equals_llama_server(model_name: str, args: str, small_models: dict[str, Path],
                                             llama_server: Path, rpc: list[str], tmp_path: Path) -> None:
    """``--spec-type draft-mtp``: the MTP context's plain cache of the NextN layer (no indexer), its
    output and its compute (the NextN block's dense MLA graph) to the printed MiB; the main context's
    weights, KV (both caches) and output too."""
    argv = ["--rpc", ",".join(rpc), *shlex.split(args)]
    parsed = parse_server_args(argv)
    assert not parsed.errors, parsed.errors
    projection = analyse_command(open_model(small_models[model_name]), rpc_devices(rpc), parsed).projection
    assert projection is not None and [e.key for e in projection.extras] == [MTP]
    output = server_output(llama_server, ["-m", str(small_models[model_name]), "-fit", "off", *argv],
                           tmp_path / "server.log", timeout=180)
    main, extra = split_log(output.splitlines(), {ep: f"RPC{i}" for i, ep in enumerate(rpc)})
    assert extra, "the server created no MTP context"
    rows, bad = [], []
    for dm in projection.devices:
        for kind in KINDS:
            for owner, actual in (("", main), (MTP, extra)):
                proj = mib(sum(b.bytes for b in dm.buffers if b.kind == kind and b.owner == owner))
                act = round(actual.get(dm.device.name, {}).get(kind, 0.0), 2)
                label = f"{dm.device.name:5} {owner or 'main':5} {kind:8}"
                rows.append(f"{label} projected {proj:9.2f}  actual {act:9.2f}")
                if abs(proj - act) > 0.011:
                    bad.append(rows[-1])
    print(f"\n{model_name} {args}\n" + "\n".join(rows))
    assert not bad, "\n".join(bad)
