"""Measured against estimated speed on this machine: the real llama-server on random-weight models.

For every model in ``BENCH_MODELS`` (over 2 GB each, random weights written into the file and read
into RAM with ``-lm none`` (no mmap), so token generation is bound by memory bandwidth, as on a real box):

- the host's RAM bandwidth, measured in this run by the planner's own probe (the reference), and one
  thread's copy (its single-thread pass: the CPU's and the rpc-servers' threads' share of it);
- one configuration after another: the CPU alone (``-ngl 0``), two ``ggml-rpc-server`` devices on
  loopback holding every layer (``--rpc A,B -ngl 999``) and, for MoE models, the routed experts on
  the CPU with the rest on one RPC device (``-ot exps=CPU``);
- for each: the server's own prompt and generation rates (``/completion`` timings), the planner's
  estimate for the same command line and devices (the CPU's compute per core from its instruction
  set in ``/proc/cpuinfo``; beside it the estimate with the AVX2 figure, as before the instruction set
  was read), and the ratio estimated / measured; for the RPC
  configurations twice: "before" with the defaults (declared link, 150 µs per split, the RPC
  device's bandwidth as declared) and "after" with the link probed through the RPC protocol
  (``backend.rpc_probe``, before llama-server starts) and the rpc-server's threads (its default, half
  the cores: ``tools/rpc/rpc-server.cpp``) capping the device's bandwidth;
- and "planned": what ``offload-planner plan`` says for the same command with nothing declared (the
  RPC endpoints only, ``backend.speed_store.plan_speed`` as the CLI calls it: this machine's cached
  RAM probe, the RPC links and devices probed before llama-server starts, the local rpc-servers taken
  as this CPU's backend, the threads counted against the cores), in a config folder of its own
  (``OFFLOAD_PLANNER_CONFIG_DIR``: the user's is never touched).

Nothing here is a timed test: the ratios are printed for the note and the README.

    python bench/speed_measured.py [--models bench-llama-2g,...] [--configs 2xRPC,...] [--prompt 256]
                                   [--gen 32] [--workdir /tmp/offload-bench] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from offload_planner.backend import child_guard
from offload_planner.backend.launch import find_server_executable
from offload_planner.backend.rpc_probe import probe_link
from offload_planner.backend.server_bench import MeasuredSpeed, measure
from offload_planner.backend.speed_store import (
    core_speed,
    local_thread_bandwidth,
    measure_ram,
    plan_speed,
    this_cpu,
    thread_use,
)
from offload_planner.backend.system import cpu_device
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import build_device_set, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.speed.efficiency import DEFAULT, for_host
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import (
    DEFAULT_CPU_TFLOPS_PER_THREAD,
    Figure,
    MeasuredLink,
    Source,
    hardware_for,
)
from offload_planner.core.synth import write_model
from offload_planner.core.synth.catalog import BENCH_MODELS
from offload_planner.core.synth.random_fill import fill_random


@dataclass(frozen=True)
class Config:
    name: str
    n_rpc: int
    args: tuple[str, ...]
    moe_only: bool = False


CONFIGS = (
    Config("CPU", 0, ("-ngl", "0")),
    Config("2xRPC", 2, ("-ngl", "999")),
    Config("RPC+CPU experts", 1, ("-ngl", "999", "-ot", "exps=CPU"), moe_only=True),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def process(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``argv`` (no shell) with output to ``log``; always stop it by PID."""
    with open(log, "wb") as out:  # child_guard: it dies with this script however the script ends
        p = child_guard.popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield p
    finally:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it listened")
        with contextlib.suppress(OSError), urllib.request.urlopen(url + "/health", timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not become healthy in {timeout:.0f} s")


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


def model_file(name: str, workdir: Path) -> Path:
    """The bench model, written and filled with random weights once (a marker file records it)."""
    path = workdir / f"{name}.gguf"
    marker = workdir / f"{name}.filled"
    if not (path.is_file() and marker.is_file()):
        t0 = time.perf_counter()
        write_model(BENCH_MODELS[name], path)
        n = fill_random([path], seed=1)
        marker.write_text(str(n))
        print(f"# wrote {path} ({n / 1e9:.2f} GB of random weights) in {time.perf_counter() - t0:.1f} s")
    return path


RPC_SERVER_THREADS = max(1, (os.cpu_count() or 2) // 2)  # rpc-server.cpp: hardware_concurrency()/2


def estimate_config(model: Path, server_args: list[str], endpoints: list[str], ram_gbs: float,
                    args: argparse.Namespace, links: dict[str, MeasuredLink] | None = None, *,
                    count_cores: bool = False, isa: bool = True,
                    thread_gbs: float | None = None) -> Est:
    """The planner's uncalibrated estimate for the same command line (tg at the measured tokens'
    depth: their attention over the prompt's cells is part of their time); the RPC servers run on this
    machine, so each is declared with the host's measured bandwidth and the CPU's compute; with
    ``links`` (the probe's) the link is not declared and the server's threads are; with
    ``count_cores`` the threads of llama-server and the rpc-servers are counted against this
    machine's cores; without ``isa`` every core has the AVX2 figure (this CPU's instruction set not read);
    ``thread_gbs``: the probe's single-thread copy, which sets the threads' share of the bandwidth of the
    CPU and the rpc-servers (None: the default per-thread figure)."""
    parsed = parse_server_args(server_args, dialect="llama.cpp")
    cores = os.cpu_count() or 1
    cpu = this_cpu() if isa else None  # the rpc-servers compute on this CPU as well
    tflops = round(cores * DEFAULT_CPU_TFLOPS_PER_THREAD * (cpu.gain if cpu else 1.0), 3)
    extra = f",threads={RPC_SERVER_THREADS}" if links is not None else f",link={args.link}"
    declared = [parse_device_decl(f"RPC{i}=16GiB,bw={ram_gbs:.1f}GB/s,tflops={tflops}{extra}")
                for i in range(len(endpoints))]
    devices = build_device_set(cpu=cpu_device(), detected=[], rpc_endpoints=endpoints, declared=declared)
    plan = plan_from_args(open_model(model), devices, parsed, "llama.cpp")
    probe = Figure(ram_gbs, "GB/s", Source.MEASURED, "RAM probe in this run")
    one = (None if thread_gbs is None
           else Figure(thread_gbs, "GB/s", Source.MEASURED, "one thread's copy in this run"))
    hw = hardware_for(devices, threads=args.threads, probe=probe, links=links,
                      cores=thread_use(devices, args.threads) if count_cores else None, cpu=cpu,
                      thread_bw=local_thread_bandwidth(devices, one))
    eff = for_host(DEFAULT, *core_speed(cpu)) if cpu is not None else DEFAULT
    est = estimate(plan, hw, prompt=args.prompt, eff=eff, depth=measured_depth(args))
    return Est(est.pp_tps, est.tg_tps_at_depth or est.tg_tps, est.tg_tps)


class Est(NamedTuple):
    """An estimate as the bench compares it: pp of the prompt from an empty cache, tg at the depth
    the measured tokens had (:func:`measured_depth`), and tg at depth 0 beside it."""

    pp_tps: float
    tg_tps: float
    tg_tps_depth0: float


def measured_depth(args: argparse.Namespace) -> int:
    """The average context of the generated tokens the server times: the prompt, then half of them."""
    return int(args.prompt + args.gen // 2)


def run_config(server: Path, model: Path, cfg: Config, args: argparse.Namespace,
               n_vocab: int) -> tuple[list[str], list[str], MeasuredSpeed, dict[str, MeasuredLink]]:
    bin_dir = server.parent
    with contextlib.ExitStack() as stack:
        endpoints = []
        for i in range(cfg.n_rpc):
            port = free_port()
            stack.enter_context(process(
                [str(bin_dir / "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(port)],
                args.workdir / f"rpc{i}.log"))
            wait_port(port)
            endpoints.append(f"127.0.0.1:{port}")
        links = {}
        for e in endpoints:  # before llama-server connects: the probe has the server to itself
            p = probe_link(e)
            links[e] = MeasuredLink(p.gbs, p.rtt_us, f"probed {e} in this run", p.graph_us)
        port = free_port()
        server_args = ["-c", str(args.ctx), "-t", str(args.threads), "-lm", "none", "-fit", "off",
                       "-np", "1", *cfg.args]
        if endpoints:
            server_args += ["--rpc", ",".join(endpoints)]
        planned = planned_estimate(model, server_args, endpoints, args)  # (its RPC probe before the server)
        proc = stack.enter_context(process(
            [str(server), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), *server_args],
            args.workdir / "server.log"))
        url = f"http://127.0.0.1:{port}"
        wait_http(url, proc, args.timeout)
        got = measure(url, n_vocab=n_vocab, prompt_tokens=args.prompt, gen_tokens=args.gen)
        return server_args, endpoints, got, links, planned


def planned_estimate(model: Path, server_args: list[str], endpoints: list[str],
                     args: argparse.Namespace) -> Est:
    """What ``offload-planner plan MODEL -- ARGS`` estimates with nothing declared: the devices as the
    CLI builds them (no GPU detected here, the RPC endpoints), ``plan_speed`` with the RPC probe."""
    parsed = parse_server_args(server_args, dialect="llama.cpp")
    devices = build_device_set(cpu=cpu_device(), detected=[], rpc_endpoints=endpoints, declared=[])
    plan = plan_from_args(open_model(model), devices, parsed, "llama.cpp")
    est = plan_speed(plan, parsed, prompt=args.prompt, probe_rpc=True, depth=measured_depth(args))
    return Est(est.pp_tps, est.tg_tps_at_depth or est.tg_tps, est.tg_tps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(BENCH_MODELS))
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/offload-bench"))
    ap.add_argument("--server", default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--link", default="10GB/s", help="declared loopback link of the RPC devices")
    ap.add_argument("--configs", default=",".join(c.name for c in CONFIGS),
                    help="configurations to run (default: all)")
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    # the planned estimate's probes are cached in a config folder of this run's (never the user's)
    os.environ["OFFLOAD_PLANNER_CONFIG_DIR"] = tempfile.mkdtemp(prefix="offload-bench-config-")
    found = find_server_executable(args.server)
    if found.path is None:
        print(found.message, file=sys.stderr)
        return 2
    server = Path(found.path)
    rows = []
    print(f"{'model':20s} {'config':16s} {'RAM GB/s':>8s} {'pp meas':>8s} {'pp est':>8s} {'ratio':>6s}"
          f" {'tg meas':>8s} {'tg est':>8s} {'ratio':>6s}  load")
    for name in args.models.split(","):
        spec = BENCH_MODELS[name]
        model = model_file(name, args.workdir)
        for cfg in CONFIGS:
            if cfg.name not in args.configs.split(",") or (cfg.moe_only and not spec.n_expert):
                continue
            probe = measure_ram()  # the reference, measured next to each run
            ram, one = probe.gbs, probe.thread_gbs
            server_args, endpoints, got, links, planned = run_config(server, model, cfg, args,
                                                                     spec.tokenizer.n_vocab)
            est = estimate_config(model, server_args, endpoints, ram, args, thread_gbs=one)
            after = (estimate_config(model, server_args, endpoints, ram, args, links, thread_gbs=one)
                     if endpoints else est)
            cont = estimate_config(model, server_args, endpoints, ram, args, links or None, count_cores=True,
                                   thread_gbs=one)
            avx2 = estimate_config(model, server_args, endpoints, ram, args, links or None, isa=False,
                                   thread_gbs=one)
            old = estimate_config(model, server_args, endpoints, ram, args, links or None)
            load = os.getloadavg()[0]
            rows.append({"model": name, "config": cfg.name, "args": server_args, "ram_gbs": round(ram, 2),
                         "ram_thread_gbs": round(one or 0.0, 2), "ram_busy_share": round(probe.cpu_share, 2),
                         "pp_est_default_thread": round(old.pp_tps, 3),
                         "tg_est_default_thread": round(old.tg_tps, 3),
                         "pp_est": round(est.pp_tps, 3), "tg_est": round(est.tg_tps, 3),
                         "tg_est_depth0": round(est.tg_tps_depth0, 3), "tg_depth": measured_depth(args),
                         "pp_est_probed": round(after.pp_tps, 3), "tg_est_probed": round(after.tg_tps, 3),
                         "pp_est_threads": round(cont.pp_tps, 3), "tg_est_threads": round(cont.tg_tps, 3),
                         "pp_est_avx2": round(avx2.pp_tps, 3), "tg_est_avx2": round(avx2.tg_tps, 3),
                         "pp_est_planned": round(planned.pp_tps, 3),
                         "tg_est_planned": round(planned.tg_tps, 3),
                         "rpc_links": {e: {"gbs": round(v.gbs, 4), "rtt_us": round(v.rtt_us, 1),
                                           "graph_us": round(v.graph_us, 1)}
                                       for e, v in links.items()},
                         "load": round(load, 2), **got.as_dict()})
            probed = "" if not endpoints else (
                f"  after: pp {after.pp_tps:.2f} ({after.pp_tps / got.pp_tps:.2f}) tg {after.tg_tps:.2f} "
                f"({after.tg_tps / got.tg_tps:.2f}); RTT "
                + ", ".join(f"{v.rtt_us:.0f}+{v.graph_us:.0f} µs" for v in links.values()))
            probed += (f"  threads vs cores: pp {cont.pp_tps:.2f} ({cont.pp_tps / got.pp_tps:.2f}) tg "
                       f"{cont.tg_tps:.2f} ({cont.tg_tps / got.tg_tps:.2f})")
            probed += (f"  AVX2 figure: pp {avx2.pp_tps:.2f} ({avx2.pp_tps / got.pp_tps:.2f}) tg "
                       f"{avx2.tg_tps:.2f} ({avx2.tg_tps / got.tg_tps:.2f})")
            probed += (f"  planned (nothing declared): pp {planned.pp_tps:.2f} "
                       f"({planned.pp_tps / got.pp_tps:.2f}) "
                       f"tg {planned.tg_tps:.2f} ({planned.tg_tps / got.tg_tps:.2f})")
            probed += (f"  one thread {one or 0:.1f} GB/s; with the default 10 GB/s a thread: tg "
                       f"{old.tg_tps:.2f} ({old.tg_tps / got.tg_tps:.2f})")
            print(f"{name:20s} {cfg.name:16s} {ram:8.1f} {got.pp_tps:8.2f} {est.pp_tps:8.2f} "
                  f"{est.pp_tps / got.pp_tps:6.2f} {got.tg_tps:8.2f} {est.tg_tps:8.2f} "
                  f"{est.tg_tps / got.tg_tps:6.2f}  {load:.1f}{probed}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
