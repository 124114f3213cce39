"""``--fit`` with a draft model or the MTP context (``common_fit_extra_model``) against llama-server.

Two ggml-rpc-servers report the machine's physical memory as free (as in ``test_fit_vs_llama``); a
``-fitt`` of (free - T) MiB makes the server fit into T MiB per device, ``-fitc 512`` lets the context
shrink.  The server runs with the fit on; ``core.fit`` gets the same free memory and arguments.  The
test checks that the fitted context equals the server's, that the extra model changed it (the fit
without the speculative flags chooses another), and that the fitted command, projected with its
draft/MTP context, gives every buffer per device and context that the server logs.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
from tests.support.procs import free_port, running_process
from tests.support.rpc import rpc_servers
from tests.support.server_buffers import mib, rpc_devices
from tests.support.spec_log import split_log

from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import DeviceSet
from offload_planner.core.engine import context_params, placement_options
from offload_planner.core.fit import SUCCESS, fit_for_args
from offload_planner.core.gguf_reader import open_model

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
RPC_FREE = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
KINDS = ("model", "kv", "output", "compute")

# (model, MiB each device may use, speculative arguments; DRAFT is the draft model's path)
CASES: list[tuple[str, int, str]] = [
    ("glm4moe", 30, "--spec-type draft-mtp"),
    ("glm4moe", 34, "--spec-type draft-mtp -fa off"),
    ("deepseek2-mtp", 30, "--spec-type draft-mtp"),
    ("llama", 20, "-md DRAFT"),
    ("llama", 26, "-md DRAFT -ctkd q8_0 -ctvd q8_0"),
    # no --spec-type: the server infers draft-mtp from the file's MTP head (MTPHEAD: deepseek2-mtp)
    ("deepseek2", 30, "-md MTPHEAD"),
]


@pytest.fixture(scope="module")
def rpc(llama_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with rpc_servers(llama_bin_dir, 2, tmp_path_factory.mktemp("rpc")) as eps:
        yield eps


def _fit(model_path: Path, devices: DeviceSet, argv: list[str]):  # type: ignore[no-untyped-def]
    model = open_model(model_path)
    parsed = parse_server_args(argv)
    assert not parsed.errors, parsed.errors
    popts = placement_options(model, devices, parsed, "llama.cpp")
    cparams, _ = context_params(model, parsed, "llama.cpp")
    return fit_for_args(model, devices, parsed, popts, cparams, free_bytes=[RPC_FREE] * len(devices.gpus))


@pytest.mark.parametrize(("name", "usable", "spec"), CASES, ids=[f"{m}:{u}MiB:{a}" for m, u, a in CASES])
def test_fit_counts_the_extra_model_as_llama_server(
    name: str, usable: int, spec: str, small_models: dict[str, Path], llama_server: Path,
    rpc: list[str], tmp_path: Path,
) -> None:
    devices = rpc_devices(rpc, RPC_FREE)
    base = ["--rpc", ",".join(rpc), "-fitt", str(RPC_FREE // MiB - usable), "-fitc", "512"]
    spec = spec.replace("MTPHEAD", str(small_models["deepseek2-mtp"]))
    spec_argv = shlex.split(spec.replace("DRAFT", str(small_models["llama-draft"])))
    ours = _fit(small_models[name], devices, [*base, *spec_argv])
    alone = _fit(small_models[name], devices, [*base, *(a for a in spec_argv if a.startswith("-fa") or
                                                         a in ("on", "off"))])
    assert ours is not None and alone is not None and ours.status == SUCCESS
    assert ours.n_ctx < alone.n_ctx, "the extra model should leave less room for the context"

    cmd = [str(llama_server), "-m", str(small_models[name]), "--host", "127.0.0.1", "--port",
           str(free_port()), "-lv", "4", "--no-warmup", *base, *spec_argv]
    with running_process(cmd, log_path=tmp_path / "server.log", ready=r"listening on http://",
                         timeout=180) as proc:
        pass
    lines = proc.output().splitlines()
    n_ctx = [int(m.group(1)) for line in lines if (m := re.search(r"llama_context: n_ctx\s+= (\d+)", line))]
    assert n_ctx and n_ctx[0] == ours.n_ctx, (n_ctx, ours.n_ctx)

    # the fitted command, with the fit off, projects every buffer the fitted server logs
    # (-ts written in full: llama-fit-params's print drops a split with one non-zero entry)
    names = devices.buffer_types()
    fitted = ["--rpc", ",".join(rpc), "-c", str(ours.n_ctx), "-ngl", str(ours.n_gpu_layers), "-fit", "off",
              *(["-ts", ",".join(str(x) for x in ours.tensor_split)] if ours.tensor_split else []),
              *(["-ot", ",".join(f"{o.pattern}={names[o.buft]}" for o in ours.overrides)] if ours.overrides
                else []), *spec_argv]
    result = analyse_command(open_model(small_models[name]), devices, parse_server_args(fitted))
    main, extra = split_log(lines, {ep: f"RPC{i}" for i, ep in enumerate(rpc)})
    owner = result.projection.extras[0].key
    mismatches = []
    for dm in result.projection.devices:
        for kind in KINDS:
            for want, actual in (("", main), (owner, extra)):
                proj = mib(sum(b.bytes for b in dm.buffers if b.kind == kind and b.owner == want))
                act = round(actual.get(dm.device.name, {}).get(kind, 0.0), 2)
                if abs(proj - act) > 0.011:
                    mismatches.append(f"{dm.device.name} {want or 'main'} {kind}: {proj} vs {act}")
    assert not mismatches, "\n".join(mismatches)
