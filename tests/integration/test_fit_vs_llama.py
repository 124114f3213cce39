"""``core.fit`` (llama.cpp's ``--fit``) against the real ``llama-fit-params``.

Offload devices are local ggml-rpc-servers (RPC0, RPC1).  Each reports the machine's physical
memory as free and total (``ggml_backend_cpu_device_get_memory``: pages x page size, not what is
actually free), so the free memory the tool fits against is known to the byte; the test reads it
from ``os.sysconf`` and checks it against the tool's own log line ("... MiB of free device memory").
A target margin ``-fitt`` of (free - T) MiB makes the tool fit the model into T MiB per device.

Each case feeds the same free memory, margins and arguments to :func:`offload_planner.core.fit.
fit_params` and compares what the tool prints on stdout (``-c N -ngl M [-ts ...] [-ot "..."]``)
with ours: the same context, -ngl and -ts, and the same device for every tensor when both
override lists are applied (the -ot text is shown, not compared).  Cases where the fit gives up
(user-set -ngl) compare the status only: the tool prints nothing then.

Models: the project's small models (a few MB, margins of a few MiB; ``-fitc 512`` lets the
context shrink below their 4096-8192 trained length) and header-only copies of Qwen3-30B-A3B,
Llama-3.1-70B and DeepSeek-V3 written as sparse files of their full size.  The table prints at the
end with ``pytest -s`` or in the terminal summary.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.procs import run_to_completion
from tests.support.rpc import rpc_servers
from tests.support.server_buffers import rpc_devices

from offload_planner.core.devices import DeviceSet
from offload_planner.core.fit import (
    DEFAULT_N_CTX_MIN,
    FAILURE,
    NGL_DEFAULT,
    SUCCESS,
    UINT32_MAX,
    FitResult,
    fit_params,
)
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import ContextParams
from offload_planner.core.model import Model
from offload_planner.core.placement import Override, PlacementOptions, place, resolve_ngl
from offload_planner.core.synth import BIG_MODELS, write_model
from offload_planner.core.units import MiB

pytestmark = pytest.mark.integration

#: what a local ggml-rpc-server reports as free (and total) memory
RPC_FREE = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")

# (model, number of RPC devices, MiB each device may use (free - -fitt), arguments, what it shows)
CASES: list[tuple[str, int, tuple[int, ...], str, str]] = [
    ("qwen3moe", 1, (30,), "", "no change"),
    ("qwen3moe", 1, (15,), "", "MoE: experts of 2 layers to CPU, -ngl 3"),
    ("qwen3moe", 1, (10,), "-fitc 512", "context to 512, then expert overrides"),
    ("llama", 1, (10,), "", "dense: layers"),
    ("llama", 2, (10,) * 2, "", "dense: layers over 2 devices"),
    ("llama", 2, (25,) * 2, "-fitc 512", "context reduction + layers, 2 devices"),
    ("gemma3", 1, (15,), "", "context reduction only"),
    ("gemma3", 2, (7,) * 2, "", "dense SWA, 2 devices: layers"),
    ("qwen3moe", 2, (25,) * 2, "", "MoE: overflow of one layer to RPC1"),
    ("qwen3moe", 2, (7,) * 2, "-fitc 512", "MoE: overflow to RPC1 and to CPU"),
    ("deepseek2", 2, (25,) * 2, "", "MLA MoE: attention+up overflow"),
    ("deepseek32", 2, (25,) * 2, "", "DSA MoE: indexer cache and graph"),
    ("deepseek32", 1, (20,), "-fitc 512", "DSA: context reduction + experts"),
    ("glm-dsa", 2, (12,) * 2, "-fitc 512", "DSA (shared indexers), 2 devices"),
    ("DeepSeek-V3.2-Q8_0", 2, (48000, 48000), "", "full size DeepSeek-V3.2, 2 devices"),
    ("GLM-5.1-Q8_0", 2, (40000, 40000), "", "full size GLM-5.1, 2 devices"),
    ("glm4moe", 2, (10,) * 2, "", "MoE: dense-only layers"),
    ("gpt-oss", 2, (5,) * 2, "-fitc 512", "SWA MoE, 2 devices"),
    ("glm4moe", 1, (12,), "-c 2048", "user context kept; up+gate overflow"),
    ("qwen3moe", 1, (15,), "-ngl 99", "user -ngl: gives up"),
    ("Qwen3-30B-A3B-Q4_K_M", 1, (20000,), "", "full size: context 40960 -> 22784"),
    ("Llama-3.1-70B-Q4_K_M", 2, (16000, 16000), "", "full size dense, 2 devices"),
    ("Qwen3-30B-A3B-Q4_K_M", 2, (6000, 6000), "", "full size MoE, 2 devices"),
    ("DeepSeek-V3-Q4_K_M", 2, (24000, 24000), "", "full size DeepSeek-V3, 2 devices"),
    # hybrid: KV of the 12 attention layers only, the recurrent state of the 36 others on their devices
    ("Qwen3-Next-80B-A3B-Q4_K_M", 2, (30000, 30000), "-c 65536", "hybrid, user context, 2 devices"),
    ("Qwen3-Next-80B-A3B-Q4_K_M", 2, (22000, 22000), "-c 65536", "hybrid: experts overflow to CPU"),
    ("Qwen3-Next-80B-A3B-Q4_K_M", 2, (16000, 20000), "-c 131072", "hybrid: more overflow, uneven"),
    ("Qwen3-Next-80B-A3B-Q4_K_M", 1, (23500,), "-c 262144", "hybrid: one device, full context"),
    # -dev: the fit's devices are the model's, in -dev's order (-fitt's i-th value is the i-th's)
    ("qwen3moe", 2, (15,), "-dev RPC1", "-dev: one of two devices"),
    ("qwen3moe", 2, (7, 25), "-dev RPC1,RPC0 -fitc 512", "-dev order: RPC1 first, tight"),
    ("llama", 2, (10, 5), "-dev RPC1,RPC0", "-dev order, dense: layers"),
    ("llama", 2, (5, 10), "-sm none -mg 1", "-sm none: the main GPU takes -fitt's first"),
    # gated-delta-net hybrids: the dry run's compute from their graph, the recurrent state with the KV
    ("qwen3next", 1, (15,), "", "hybrid MoE"),
    ("qwen35moe", 1, (10,), "-fitc 512", "hybrid MoE, tight"),
    ("qwen35moe", 2, (8,) * 2, "", "hybrid MoE, 2 devices"),
    ("qwen35", 2, (8,) * 2, "-fitc 512", "hybrid dense, 2 devices"),
    ("Qwen3-Next-80B-A3B-Q4_K_M", 2, (20000, 20000), "", "full size Qwen3-Next, 2 devices"),
    ("Qwen3-Next-80B-A3B-Q4_K_M", 2, (24000, 24000), "", "full size Qwen3-Next: context shrunk"),
]

_FREE_LINE = re.compile(r"projected to use \d+ MiB of device memory vs\. (\d+) MiB of free device memory")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("-c", type=int, default=None)
    p.add_argument("-fitc", type=int, default=None)
    p.add_argument("-ngl", type=int, default=None)
    p.add_argument("-ts", default="")
    p.add_argument("-dev", default=None)
    p.add_argument("-sm", default="layer")
    p.add_argument("-mg", type=int, default=0)
    return p


def _ours(model: Model, devices: DeviceSet, usable: tuple[int, ...], args: str) -> FitResult:
    """The fit for llama-fit-params' defaults (1 sequence, no unified KV, n_outputs = n_batch)."""
    a = _parser().parse_args(shlex.split(args))
    n_ctx_min = a.fitc if a.fitc is not None else (UINT32_MAX if a.c == 0 else DEFAULT_N_CTX_MIN)
    ngl = NGL_DEFAULT if a.ngl is None else a.ngl
    split = tuple(float(x) for x in a.ts.split(",")) if a.ts else ()
    popts = PlacementOptions(n_gpu_layers=resolve_ngl(ngl, model.summary.n_layer, has_gpu=True),
                             tensor_split=split, selected=_selected(args), split_mode=a.sm, main_gpu=a.mg)
    cparams = ContextParams(n_ctx=a.c or 0, n_seq_max=1, kv_unified=False, flash_attn=True,
                            n_outputs_max=2048)
    margins = [(RPC_FREE // MiB - u) * MiB for u in usable]  # -fitt is in whole MiB
    return fit_params(model, devices, popts, cparams, free_bytes=[RPC_FREE] * len(devices.gpus),
                      margins=margins, n_gpu_layers=ngl, user_tensor_split=split, n_ctx_min=n_ctx_min)


def _parse_printed(line: str, devices: DeviceSet) -> tuple[int, int, tuple[float, ...], tuple[Override, ...]]:
    """``-c N -ngl M [-ts a,b] [-ot "p=buft,..."]`` as llama-fit-params prints it."""
    toks = shlex.split(line)
    c = int(toks[toks.index("-c") + 1])
    ngl = int(toks[toks.index("-ngl") + 1])
    ts = tuple(float(x) for x in toks[toks.index("-ts") + 1].split(",")) if "-ts" in toks else ()
    ot: list[Override] = []
    if "-ot" in toks:
        for entry in toks[toks.index("-ot") + 1].split(","):
            pattern, buft = entry.rsplit("=", 1)
            dev = devices.resolve_buffer_type(buft)
            assert dev is not None, buft
            ot.append(Override(pattern, dev))
    return c, ngl, ts, tuple(ot)


def _selected(args: str) -> tuple[str, ...] | None:
    """The GPUs ``-dev`` selects in ``args`` (None: no -dev)."""
    dev = _parser().parse_known_args(shlex.split(args))[0].dev
    return tuple(dev.split(",")) if dev else None


def _placement(model: Model, devices: DeviceSet, ngl: int, ts: tuple[float, ...],
               ot: tuple[Override, ...], selected: tuple[str, ...] | None = None) -> dict[str, str]:
    opts = PlacementOptions(n_gpu_layers=resolve_ngl(ngl, model.summary.n_layer, has_gpu=True),
                            tensor_split=ts, overrides=ot, selected=selected)
    return place(model, devices, opts).tensor_devices()


@pytest.fixture(scope="module")
def table(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    rows: list[str] = []
    yield rows
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and rows:
        reporter.write_line("")
        reporter.write_line("--fit: ours vs llama-fit-params (-ot shown as the number of entries)")
        for row in rows:
            reporter.write_line(row)


@pytest.fixture(scope="module")
def rpc(llama_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two ggml-rpc-servers for the whole module, stopped by PID."""
    with rpc_servers(llama_bin_dir, 2, tmp_path_factory.mktemp("rpc")) as endpoints:
        yield endpoints


@pytest.fixture(scope="module")
def model_files(small_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small models as written for the session; big ones as sparse full-size files (headers only)."""
    root = tmp_path_factory.mktemp("fit_big_models")
    big = sorted({name for name, *_ in CASES if name in BIG_MODELS})
    return {**small_models, **{n: write_model(BIG_MODELS[n], root / f"{n}.gguf")[0] for n in big}}


def _summary(c: int, ngl: int, ts: tuple[float, ...], ot: tuple[Override, ...]) -> str:
    s = f"-c {c} -ngl {ngl}"
    if ts:
        s += " -ts " + ",".join(str(int(x)) for x in ts)
    if ot:
        s += f" -ot[{len(ot)}]"
    return s


@pytest.mark.parametrize(("name", "n_rpc", "usable", "args", "what"), CASES,
                         ids=[f"{m}:{n}rpc:{'+'.join(map(str, u))}MiB:{a}" for m, n, u, a, _ in CASES])
def test_fit_matches_llama_fit_params(name: str, n_rpc: int, usable: tuple[int, ...], args: str, what: str,
                                      model_files: dict[str, Path], llama_bin_dir: Path, rpc: list[str],
                                      tmp_path: Path, table: list[str]) -> None:
    model = open_model(model_files[name])
    devices = rpc_devices(rpc[:n_rpc], RPC_FREE)
    t0 = time.perf_counter()
    ours = _ours(model, devices, usable, args)
    t_ours = time.perf_counter() - t0

    fitt = ",".join(str(RPC_FREE // MiB - u) for u in usable)
    cmd = [str(llama_bin_dir / "llama-fit-params"), "-m", str(model_files[name]),
           "--rpc", ",".join(rpc[:n_rpc]), "-fitt", fitt, "-lv", "5", *shlex.split(args)]
    t0 = time.perf_counter()
    code, out = run_to_completion(cmd, log_path=tmp_path / "fit.log", timeout=120)
    t_llama = time.perf_counter() - t0
    m = _FREE_LINE.search(out)
    # llama.cpp logs from a worker thread: a run that gives up and exits at once can lose its last
    # lines, so the free-memory check is made when the line made it to the log
    if m is not None:
        n_model = len(ours.devices)  # the model's devices (-dev, -sm none: fewer than the servers)
        assert int(m.group(1)) == n_model * RPC_FREE // MiB, "the RPC servers report other free memory"
    else:
        assert code != 0, out[-2000:]

    printed = [ln for ln in out.splitlines() if ln.startswith("-c ")]
    label = f"{name} [{n_rpc} rpc] use<={','.join(map(str, usable))} MiB {args}".strip()
    if code != 0:
        theirs_s = "failed (exit 1)"
        ok = ours.status == FAILURE and not printed
    else:
        assert printed, out[-2000:]
        theirs = _parse_printed(printed[-1], devices)
        ours_t = _parse_printed(shlex.join(ours.cli_args({d.name: d.buffer_type for d in devices})), devices)
        theirs_s = _summary(*theirs)
        ok = (ours.status == SUCCESS and ours_t[:3] == theirs[:3]
              and _placement(model, devices, *ours_t[1:], _selected(args))
              == _placement(model, devices, *theirs[1:], _selected(args)))
    ours_s = "failed" if ours.status == FAILURE else _summary(*_parse_printed(
        shlex.join(ours.cli_args({d.name: d.buffer_type for d in devices})), devices))
    table.append(f"{'ok' if ok else 'XX'} {label:62.62} {what:40.40} ours: {ours_s:28} llama: {theirs_s:28} "
                 f"({ours.measurements} dry runs, {t_ours:.2f}s vs {t_llama:.2f}s)")
    print(table[-1])
    assert ok, (f"{table[-1]}\nours: {ours.cli_args()}\n{ours.message}\nllama: {printed}\n"
                + "\n".join(ours.log))
