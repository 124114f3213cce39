"""Speculative decoding against the real llama-server: a draft model (``-md``, the catalogue's
``llama-draft``: the ``llama`` vocabulary with two layers) and the MTP context (``--spec-type
draft-mtp``) on the GLM-4.5-style and DeepSeek-V3-style test models, on one and two ggml-rpc-server
devices, with and without flash attention.

Each case runs the server (-lv 4), splits its log into the main context and the draft/MTP context
(:mod:`tests.support.spec_log`) and compares every kind of buffer per device, for each context,
with ``analyse_command`` on the same argument list (the projection's buffers carry their owner): equal to
the 0.01 MiB the server prints, compute included.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from tests.support.rpc import rpc_servers
from tests.support.server_buffers import KINDS, mib, rpc_devices, server_output
from tests.support.spec_log import split_log

from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.extra_context import DRAFT, MTP
from offload_planner.core.gguf_reader import open_model

pytestmark = pytest.mark.integration

MTP_ARGS = "-ngl 999 -c 2048 --spec-type draft-mtp"
DRAFT_ARGS = "-ngl 999 -c 2048 -md DRAFT"

# (model, number of RPC devices, llama-server arguments; DRAFT is the draft model's path)
CASES: list[tuple[str, int, str]] = [
    *((m, n, f"{MTP_ARGS} -fa {fa}") for m in ("glm4moe", "deepseek2-mtp") for n in (1, 2)
      for fa in ("on", "off")),
    ("glm4moe", 2, f"{MTP_ARGS} -ts 1,3 -ctkd q8_0 -ctvd q8_0 --spec-draft-n-max 5"),
    ("glm4moe", 2, f"{MTP_ARGS} -ts 1,1 -ot exps=CPU -np 2"),
    *(("llama", n, f"{DRAFT_ARGS} -fa {fa}") for n in (1, 2) for fa in ("on", "off")),
    ("llama", 2, f"{DRAFT_ARGS} -devd RPC1 -ctkd q8_0 -ctvd q8_0 --spec-type draft-simple"),
    ("llama", 2, f"{DRAFT_ARGS} -ngld 1 --spec-type draft-simple --spec-draft-n-max 6 -fa off"),
    ("llama", 2, rf"{DRAFT_ARGS} -otd blk\.0\.=CPU -ts 3,1"),
    ("llama", 1, f"{DRAFT_ARGS} -devd none"),
    # the anchored, escaped rule the window writes when a draft tensor is moved (core.draft_moves)
    ("llama", 2, rf"{DRAFT_ARGS} -ngld 0 -otd blk\.1\.=CPU,^blk\.0\.attn_q\.weight$=RPC1"),
    # a -md file with an MTP head and no --spec-type: the server infers draft-mtp (common/arg.cpp) and
    # runs an MTP context on the draft model (MTPHEAD is deepseek2-mtp's path)
    *(("deepseek2", n, f"-ngl 999 -c 2048 -md MTPHEAD -fa {fa}") for n, fa in ((1, "on"), (2, "off"))),
    ("deepseek2-mtp", 2, "-ngl 999 -c 2048 -md MTPHEAD --spec-type draft-mtp -devd RPC1 -np 2"),
    # -dev: the draft takes the main model's devices unless -devd names its own
    # (common_base_params_to_speculative: "default to global devices value"); MTP runs on the main's
    ("llama", 2, f"{DRAFT_ARGS} -dev RPC1"),
    ("llama", 2, f"{DRAFT_ARGS} -dev RPC1 -devd RPC0"),
    ("glm4moe", 2, f"{MTP_ARGS} -dev RPC1"),
]


@pytest.fixture(scope="module")
def rpc(llama_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with rpc_servers(llama_bin_dir, 2, tmp_path_factory.mktemp("rpc")) as eps:
        yield eps


@pytest.mark.parametrize(("model_name", "n_rpc", "args"), CASES, ids=[f"{m}:{n}rpc:{a}" for m, n, a in CASES])
def test_speculative_buffers_equal_llama_server(
    model_name: str, n_rpc: int, args: str, small_models: dict[str, Path], llama_server: Path,
    rpc: list[str], tmp_path: Path,
) -> None:
    eps = rpc[:n_rpc]
    args = args.replace("DRAFT", str(small_models["llama-draft"]))
    args = args.replace("MTPHEAD", str(small_models["deepseek2-mtp"]))
    argv = [re.sub(r"=RPC(\d)$", lambda m: f"=RPC0[{eps[int(m.group(1))]}]", tok)
            for tok in ["--rpc", ",".join(eps), *shlex.split(args)]]
    parsed = parse_server_args(argv)
    assert not parsed.errors, parsed.errors
    result = analyse_command(open_model(small_models[model_name]), rpc_devices(eps), parsed)
    owner = DRAFT if "-md" in args else MTP
    assert [e.key for e in result.projection.extras] == [owner]

    output = server_output(llama_server, ["-m", str(small_models[model_name]), "-fit", "off", *argv],
                           tmp_path / "server.log", timeout=120)
    main, extra = split_log(output.splitlines(), {ep: f"RPC{i}" for i, ep in enumerate(eps)})
    assert extra, "the server created no draft/MTP context"

    rows, mismatches = [], []
    for dm in result.projection.devices:
        name = dm.device.name
        for kind in KINDS:
            for label, want, actual in (
                ("main", "", main), (owner, owner, extra),
            ):
                proj = mib(sum(b.bytes for b in dm.buffers if b.kind == kind and b.owner == want))
                act = round(actual.get(name, {}).get(kind, 0.0), 2)
                rows.append(f"{name:5} {label:5} {kind:8} projected {proj:9.2f}  actual {act:9.2f}")
                if abs(proj - act) > 0.011:
                    mismatches.append(rows[-1])
    print(f"\n{model_name} {n_rpc} RPC: {args}\n" + "\n".join(rows))
    assert not mismatches, "\n".join(mismatches)
