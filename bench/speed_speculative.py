"""Speculative decoding (MTP) estimated against the real llama-server on this machine's CPU.

A GLM-4.5-shaped MoE with one NextN block (about 0.8 GB of random Q4_K_M weights, loaded with
``-lm none``) runs without speculation and with ``--spec-type draft-mtp`` at several acceptance
rates.  Random weights accept no drafted token by themselves, so the pinned build's benchmarking
switch ``--spec-synth-rates`` (``tools/server/server-context.cpp``: drafted tokens accepted at random
at the given per-position rates, everything else as in a real run: the draft passes, the verifying
batch) sets them; the estimate is given the same rate with ``--spec-accept``.  Printed per run: tg
measured and estimated, and the speed-up over the plain run measured and estimated (the ratio of
ratios is what the step model, not the machine's bandwidth, decides).

With ``--cpu-time`` (meant for ``--threads 1`` on a machine other jobs keep busy) tg is the tokens of
one more request per second of the server's CPU time: its one compute thread's work, whatever share of
a core it got (``bench/speed_slots.py``).

    python bench/speed_speculative.py [--threads N] [--gen 64] [--accepts 0,0.5,0.8,1] [--cpu-time]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from offload_planner.backend.launch import find_server_executable
from offload_planner.backend.server_bench import measure
from offload_planner.backend.speed_store import (
    core_speed,
    local_thread_bandwidth,
    measure_ram,
    this_cpu,
    thread_use,
)
from offload_planner.backend.system import cpu_device
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import build_device_set
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.speed.efficiency import DEFAULT, for_host
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import Figure, Source, hardware_for
from offload_planner.core.speed.speculation import with_speculation
from offload_planner.core.synth import SMALL_MODELS, write_model
from offload_planner.core.synth.catalog import BENCH_MODELS
from offload_planner.core.synth.random_fill import fill_random
from speed_measured import free_port, process, wait_http
from speed_slots import all_at_once, server_pid

#: GLM-4.5 layout (leading dense layer, shared expert, 16 experts / 4 used) at bench size, with the
#: NextN block llama-server runs as the MTP draft.
SPEC = replace(SMALL_MODELS["glm4moe"], name="bench-glm4moe-mtp", n_layer=13, n_nextn=1, n_embd=2048,
               n_head=16, n_head_kv=4, head_dim_k=128, head_dim_v=128, n_rot=64, n_ff=8192, n_expert=16,
               n_expert_used=4, n_expert_shared=1, n_ff_exp=1024, n_ctx_train=8192,
               tokenizer=BENCH_MODELS["bench-qwen3moe-2g"].tokenizer)


def model_file(workdir: Path) -> Path:
    path = workdir / f"{SPEC.name}.gguf"
    marker = workdir / f"{SPEC.name}.filled"
    if not (path.is_file() and marker.is_file()):
        t0 = time.perf_counter()
        write_model(SPEC, path)
        n = fill_random([path], seed=7)
        marker.write_text(str(n))
        print(f"# wrote {path} ({n / 1e9:.2f} GB of random weights) in {time.perf_counter() - t0:.1f} s")
    return path


def rates(accept: float, n: int) -> str:
    """``--spec-synth-rates``: unconditional per-position rates of a per-token acceptance."""
    return ",".join(f"{accept ** (i + 1):.6f}" for i in range(n))


def run(server: Path, model: Path, args: list[str], ns: argparse.Namespace) -> tuple[float, float]:
    port = free_port()
    argv = [str(server), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), *args]
    with process(argv, ns.workdir / "spec-server.log") as proc:
        url = f"http://127.0.0.1:{port}"
        wait_http(url, proc, ns.timeout)
        got = measure(url, n_vocab=SPEC.tokenizer.n_vocab, prompt_tokens=ns.prompt, gen_tokens=ns.gen)
        if ns.cpu_time:  # one more request (warm now): its tokens per second of the server's CPU time
            return all_at_once(url, 1, 0, ns.gen, SPEC.tokenizer.n_vocab, server_pid(proc.pid))[1], got.pp_tps
    return got.tg_tps, got.pp_tps


def estimated(model: Path, args: list[str], ram: float, threads: int, accept: float | None,
              one: float | None = None) -> float:
    """The estimate's tg with this machine's figures: the RAM probe and its one-thread copy (``one``)
    measured in this run, this CPU's instruction set (as ``speed_measured.py`` estimates)."""
    cpu = this_cpu()
    devices = build_device_set(cpu=cpu_device(), detected=[], rpc_endpoints=[], declared=[])
    plan = plan_from_args(open_model(model), devices, parse_server_args(args), "llama.cpp")
    probe = Figure(ram, "GB/s", Source.MEASURED, "RAM probe in this run")
    one_f = None if one is None else Figure(one, "GB/s", Source.MEASURED, "one thread's copy in this run")
    hw = hardware_for(devices, threads=threads, probe=probe, cores=thread_use(devices, threads), cpu=cpu,
                      thread_bw=local_thread_bandwidth(devices, one_f))
    eff = for_host(DEFAULT, *core_speed(cpu))
    est = estimate(plan, hw, eff=eff)
    return with_speculation(est, plan, hw, eff, accept=accept).tg_tps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--n-max", type=int, default=3)
    ap.add_argument("--accepts", default="0,0.5,0.8,1")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/offload-bench"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--cpu-time", action="store_true",
                    help="tg as tokens per second of the server's CPU time (-t 1 on a busy machine)")
    ns = ap.parse_args()
    ns.workdir.mkdir(parents=True, exist_ok=True)
    found = find_server_executable(None)
    if found.path is None:
        print(found.message, file=sys.stderr)
        return 2
    server = Path(found.path)
    model = model_file(ns.workdir)
    base = ["-c", "1024", "-t", str(ns.threads), "-lm", "none", "-fit", "off", "-np", "1", "-ngl", "0"]
    probe = measure_ram()
    ram, one = probe.gbs, probe.thread_gbs
    plain_meas, _ = run(server, model, base, ns)
    plain_est = estimated(model, base, ram, ns.threads, None, one)
    rows = [{"accept": None, "tg_meas": plain_meas, "tg_est": plain_est, "load": os.getloadavg()[0]}]
    print(f"# RAM probe {ram:.1f} GB/s, one thread {one or 0:.1f} GB/s; -t {ns.threads}; "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'run':22s} {'tg meas':>8s} {'tg est':>8s} {'est/meas':>8s} {'speed-up meas':>13s} "
          f"{'speed-up est':>12s} {'est/meas':>8s}  load")
    print(f"{'no speculation':22s} {plain_meas:8.2f} {plain_est:8.2f} {plain_est / plain_meas:8.2f}")
    for a in (float(x) for x in ns.accepts.split(",")):
        args = [*base, "--spec-type", "draft-mtp", "--spec-draft-n-max", str(ns.n_max),
                "--spec-synth-rates", rates(a, ns.n_max)]
        with contextlib.suppress(Exception):
            probe = measure_ram()
            ram, one = probe.gbs, probe.thread_gbs
        meas, _ = run(server, model, args, ns)
        est = estimated(model, args, ram, ns.threads, a, one)
        # the estimated speed-up from one RAM figure: the step model alone, not the probe's drift
        up_m, up_e = meas / plain_meas, est / estimated(model, base, ram, ns.threads, None, one)
        load = os.getloadavg()[0]
        rows.append({"accept": a, "tg_meas": meas, "tg_est": est, "load": load})
        print(f"{'MTP n ' + str(ns.n_max) + ', accept ' + f'{a:g}':22s} {meas:8.2f} {est:8.2f} "
              f"{est / meas:8.2f} {up_m:13.2f} {up_e:12.2f} {up_e / up_m:8.2f}  {load:.1f}", flush=True)
    again, _ = run(server, model, base, ns)
    print(f"{'no speculation, again':22s} {again:8.2f}  (drift of the plain run: {again / plain_meas:.2f}x)")
    if ns.json:
        ns.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
