"""Compute buffers projected by :mod:`offload_planner.core.compute` against the real llama.cpp.

Two parts, both printing a table of projected against actual MiB per device and buffer:

* ``llama-server -lv 4`` on the project's small models of six architectures, CPU only or with one or
  two local ggml-rpc-servers as offload devices (RPC0, RPC1; two devices with every layer offloaded
  and no overrides = pipeline parallelism), over command lines that vary -ngl, -ot, -c, -b, -ub,
  -fa, -ctk/-ctv, -np/-kvu, -nkvo and --swa-full.  The servers never load real weights: the models
  are a few MB.
* ``llama-fit-params -lv 5`` (a no-alloc dry run) on header-shaped copies of DeepSeek-V3,
  Qwen3-30B-A3B, gpt-oss-120b and GLM-4.5-Air, written as sparse files of their full size, to show
  the model holds at 61 layers and 129k-200k vocabularies.  The dry run drops the backends llama.cpp
  forces for ``norm`` tensors (``ggml_backend_sched_reserve_size`` resets the scheduler), so it is
  compared with ``simulate(..., no_alloc=True)``; the server keeps them.

Tolerance: within 5% or 2 MiB of what llama.cpp prints (in practice the values are equal to the
printed 0.01 MiB).  The whole table prints at the end of the module with ``pytest -s``.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.procs import free_port, run_to_completion, running_process
from tests.support.rpc import rpc_servers

from offload_planner.backend.log_parser import parse_log
from offload_planner.core.compute import compute_buffers, simulate
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import ContextParams, resolve_context
from offload_planner.core.model import Model
from offload_planner.core.placement import Override, Placement, PlacementOptions, place, resolve_ngl
from offload_planner.core.synth import BIG_MODELS, write_model
from offload_planner.core.units import MiB

pytestmark = pytest.mark.integration

RPC_FREE = 24 * 1024**3

# (model, number of RPC devices, llama-server arguments)
SERVER_CASES: list[tuple[str, int, str]] = [
    ("llama", 0, "-c 4096"),
    ("llama", 0, "-c 4096 -fa off -ub 256"),
    ("qwen3moe", 0, "-c 8192 -np 2"),
    ("deepseek2", 0, "-c 4096 -fa off"),
    ("gemma3", 0, "-c 8192 --swa-full"),
    ("gpt-oss", 0, "-c 4096 -ctk q8_0 -ctv q8_0"),
    ("qwen3moe", 1, "-ngl 999 -c 4096"),
    ("qwen3moe", 1, "-ngl 2 -c 4096"),
    ("qwen3moe", 1, "-ngl 999 -c 4096 -ot exps=CPU"),
    ("qwen3moe", 1, "-ngl 999 -c 4096 -nkvo -fa off"),
    ("qwen3moe", 2, "-ngl 999 -ts 1,1 -c 4096"),
    ("qwen3moe", 2, "-ngl 999 -ts 1,1 -c 4096 -fa off"),
    ("qwen3moe", 2, "-ngl 3 -ts 1,1 -c 4096"),
    ("qwen3moe", 2, "-ngl 999 -ts 1,1 -c 4096 -ot exps=CPU"),
    ("qwen3moe", 2, "-ngl 999 -ts 1,1 -c 4096 -b 256 -ub 128"),
    ("qwen3moe", 2, "-ngl 999 -ts 1,1 -c 4096 -ub 16"),
    ("llama", 2, "-ngl 999 -ts 1,1 -c 2048 -ctk q8_0 -ctv q8_0"),
    ("llama", 2, "-ngl 999 -ts 1,1 -c 1000 -np 3"),
    ("llama", 2, "-ngl 999 -ts 1,1 -c 4096 -np 3 -kvu -fa off"),
    ("llama", 2, "-ngl 2 -ts 1,1 -c 4096 -ub 16"),
    ("deepseek2", 2, "-ngl 999 -ts 1,1 -c 2048"),
    ("deepseek2", 1, "-ngl 999 -c 2048 -ot exps=CPU -fa off"),
    ("glm4moe", 2, "-ngl 999 -ts 1,1 -c 4096"),
    ("glm4moe", 1, "-ngl 3 -c 4096 -ot exps=CPU"),
    ("gpt-oss", 2, "-ngl 999 -ts 1,1 -c 16384 -ub 1024 -b 1024"),
    ("gpt-oss", 2, "-ngl 999 -ts 1,1 -c 4096 -fa off --swa-full"),
    ("gemma3", 2, "-ngl 999 -ts 2,1 -c 8192 -np 2"),
    ("gemma3", 1, "-ngl 4 -c 8192 -ub 256"),
]

# (big model, number of RPC devices, llama-fit-params arguments)
FIT_CASES: list[tuple[str, int, str]] = [
    ("Qwen3-30B-A3B-Q4_K_M", 0, "-c 8192"),
    ("Qwen3-30B-A3B-Q4_K_M", 0, "-c 32768 -ub 2048"),
    ("DeepSeek-V3-Q4_K_M", 0, "-c 8192"),
    ("DeepSeek-V3-Q4_K_M", 0, "-c 32768 -ub 1024"),
    ("gpt-oss-120b-MXFP4", 0, "-c 131072 -ub 2048"),
    ("GLM-4.5-Air-Q4_K_M", 0, "-c 16384 -fa off"),
    ("Qwen3-30B-A3B-Q4_K_M", 2, "-ngl 99 -c 16384"),
    ("DeepSeek-V3-Q4_K_M", 2, "-ngl 99 -c 8192"),
    ("DeepSeek-V3-Q4_K_M", 1, "-ngl 99 -c 16384 -ot exps=CPU"),
    ("gpt-oss-120b-MXFP4", 2, "-ngl 99 -c 32768 -ub 1024"),
    ("GLM-4.5-Air-Q4_K_M", 2, "-ngl 99 -c 16384"),
    ("GLM-4.5-Air-Q4_K_M", 1, "-ngl 30 -c 16384"),
    # gated-delta-net hybrids at full size (48 and 60 layers, every fourth full attention)
    ("Qwen3-Next-80B-A3B-Q4_K_M", 0, "-c 16384"),
    ("Qwen3-Next-80B-A3B-Q4_K_M", 2, "-ngl 99 -c 32768 -ub 2048"),
    ("Qwen3.5-397B-A17B-Q4_K_M", 1, "-ngl 99 -c 16384 -ot exps=CPU"),
    ("Qwen3.5-397B-A17B-Q4_K_M", 2, "-ngl 40 -c 65536 -fa off"),
]

_SCHED = re.compile(r"sched_reserve:\s+(\S+) compute buffer size =\s+([\d.]+) MiB")


# --- the few flags the cases use, as llama-server reads them ---------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("-c", type=int, default=0)
    p.add_argument("-b", type=int, default=2048)
    p.add_argument("-ub", type=int, default=512)
    p.add_argument("-np", type=int, default=None)
    p.add_argument("-kvu", action="store_true")
    p.add_argument("-fa", default="on")
    p.add_argument("-ctk", default="f16")
    p.add_argument("-ctv", default="f16")
    p.add_argument("-nkvo", action="store_true")
    p.add_argument("--swa-full", action="store_true")
    p.add_argument("-ngl", type=int, default=None)
    p.add_argument("-ts", default="")
    p.add_argument("-ot", action="append", default=[])
    return p


def _devices(n_rpc: int) -> DeviceSet:
    gpus = tuple(Device(f"RPC{i}", DeviceKind.RPC, RPC_FREE, RPC_FREE, source="rpc") for i in range(n_rpc))
    return DeviceSet(Device("CPU", DeviceKind.CPU), gpus)


def _setup(model: Model, n_rpc: int, args: str, *,
           server: bool) -> tuple[DeviceSet, Placement, ContextParams]:
    a = _parser().parse_args(shlex.split(args))
    devices = _devices(n_rpc)
    ngl = resolve_ngl(a.ngl, model.summary.n_layer, has_gpu=n_rpc > 0)
    overrides = tuple(Override(*o.split("=", 1)) for o in a.ot)
    split = tuple(float(x) for x in a.ts.split(",")) if a.ts else ()
    opts = PlacementOptions(n_gpu_layers=ngl, tensor_split=split, overrides=overrides)
    placement = place(model, devices, opts)
    if a.np is None:  # the server's -np auto: 4 slots, unified KV; other tools: 1 slot
        n_seq, kvu = (4, True) if server else (1, False)
    else:
        n_seq, kvu = a.np, a.kvu
    n_ctx = a.c or model.summary.n_ctx_train
    n_batch = min(n_ctx, a.b)
    params = ContextParams(
        n_ctx=a.c, n_batch=a.b, n_ubatch=a.ub, n_seq_max=n_seq, kv_unified=kvu, flash_attn=a.fa != "off",
        type_k=a.ctk, type_v=a.ctv, offload_kqv=not a.nkvo, swa_full=a.swa_full,
        n_outputs_max=min(n_batch, n_seq) if server else n_batch,
    )
    return devices, placement, params


def _projected(model: Model, n_rpc: int, args: str, *, server: bool) -> dict[str, float]:
    devices, placement, params = _setup(model, n_rpc, args, server=server)
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    if server:
        return {b.device: b.bytes / MiB for b in compute_buffers(model, devices, placement, ctx, params)}
    sim = simulate(model, devices, placement, ctx, params, no_alloc=True)
    assert sim is not None, model.arch
    return {be.name: size / MiB for be, size in zip(sim.backends, sim.sizes, strict=True) if size > 1}


def _rpc_args(endpoints: list[str], n_rpc: int, args: str) -> list[str]:
    """The case's arguments for the real tool: --rpc first, -ot RPCi=... as its logged buffer name."""
    out = ["--rpc", ",".join(endpoints[:n_rpc])] if n_rpc else []
    for tok in shlex.split(args):
        out.append(re.sub(r"=RPC(\d)$", lambda m: f"=RPC0[{endpoints[int(m.group(1))]}]", tok))
    return out


def _device_name(buffer: str, endpoints: list[str]) -> str:
    m = re.match(r"^RPC\d*\[(.+)\]$", buffer)
    return f"RPC{endpoints.index(m.group(1))}" if m else "CPU" if buffer.endswith("Host") else buffer


# --- comparison and the table ------------------------------------------------------------------------


def _compare(label: str, projected: dict[str, float], actual: dict[str, float],
             table: list[str]) -> list[str]:
    bad = []
    for dev in sorted(set(projected) | set(actual), key=lambda d: (d == "CPU", d)):
        p, a = projected.get(dev), actual.get(dev)
        ok = p is not None and a is not None and abs(p - a) <= max(0.05 * a, 2.0)
        exact = ok and p is not None and a is not None and abs(p - a) < 0.006
        mark = "" if exact else (" ~" if ok else " XX")
        ps = "-" if p is None else f"{p:.2f}"
        as_ = "-" if a is None else f"{a:.2f}"
        table.append(f"{label:72.72} {dev:5} compute {ps:>9} {as_:>9}{mark}")
        if not ok:
            bad.append(table[-1])
    return bad


@pytest.fixture(scope="module")
def table(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    rows: list[str] = []
    yield rows
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and rows:
        reporter.write_line("")
        reporter.write_line(f"{'case':72} {'dev':5} buffer  {'projected':>9} {'actual':>9}  (MiB)")
        for row in rows:
            reporter.write_line(row)


@pytest.fixture(scope="module")
def rpc(llama_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two ggml-rpc-servers for the whole module, stopped by PID."""
    with rpc_servers(llama_bin_dir, 2, tmp_path_factory.mktemp("rpc")) as endpoints:
        yield endpoints


@pytest.fixture(scope="module")
def small(small_models: dict[str, Path]) -> dict[str, Model]:
    return {name: open_model(path) for name, path in small_models.items()}


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The big models at full size as sparse files (llama-fit-params checks data bounds): a few MB
    of header each on disk, no data read."""
    root = tmp_path_factory.mktemp("big_models")
    names = sorted({name for name, _, _ in FIT_CASES})
    return {name: write_model(BIG_MODELS[name], root / f"{name}.gguf")[0] for name in names}


@pytest.mark.parametrize(("name", "n_rpc", "args"), SERVER_CASES,
                         ids=[f"{m}:{n}rpc:{a}" for m, n, a in SERVER_CASES])
def test_server_compute_buffers(name: str, n_rpc: int, args: str, small: dict[str, Model],
                                small_models: dict[str, Path], llama_server: Path, rpc: list[str],
                                tmp_path: Path, table: list[str]) -> None:
    projected = _projected(small[name], n_rpc, args, server=True)
    cmd = [str(llama_server), "-m", str(small_models[name]), "--host", "127.0.0.1",
           "--port", str(free_port()), "-lv", "4", "-fit", "off", "--no-warmup", *_rpc_args(rpc, n_rpc, args)]
    if n_rpc == 0 and "-ngl" not in args:
        cmd += ["-ngl", "0"]
    with running_process(cmd, log_path=tmp_path / "server.log", ready=r"listening on http://",
                         timeout=120) as proc:
        pass
    report = parse_log(proc.output().splitlines())
    actual = {_device_name(b.buffer, rpc): b.mib for b in report.buffers if b.kind == "compute"}
    assert actual, proc.output()[-2000:]
    n = len(table)
    bad = _compare(f"server {name} [{n_rpc} rpc] {args}", projected, actual, table)
    print("\n".join(table[n:]))
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(("name", "n_rpc", "args"), FIT_CASES,
                         ids=[f"{m}:{n}rpc:{a}" for m, n, a in FIT_CASES])
def test_fit_params_compute_buffers_at_scale(name: str, n_rpc: int, args: str, big: dict[str, Path],
                                             llama_bin_dir: Path, rpc: list[str], tmp_path: Path,
                                             table: list[str]) -> None:
    model = open_model(big[name])
    projected = _projected(model, n_rpc, args, server=False)
    cmd = [str(llama_bin_dir / "llama-fit-params"), "-m", str(big[name]), "--fit-print", "on", "-lv", "5",
           *_rpc_args(rpc, n_rpc, args)]
    code, out = run_to_completion(cmd, log_path=tmp_path / "fit.log", timeout=300)
    assert code == 0, out[-2000:]
    actual: dict[str, float] = {}
    for m in _SCHED.finditer(out):  # the first reserve is the one for the given parameters
        actual.setdefault(_device_name(m.group(1), rpc), float(m.group(2)))
    assert actual, out[-2000:]
    n = len(table)
    bad = _compare(f"fit-params {name} [{n_rpc} rpc] {args}", projected, actual, table)
    print("\n".join(table[n:]))
    assert not bad, "\n".join(bad)
