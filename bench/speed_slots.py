"""Every slot generating at once (``-np N``), estimated against the real llama-server on this machine.

One llama-server (``-np`` the largest N, ``-lm none``, the CPU alone) on a bench model of random weights
(``bench/speed_measured.py``'s); each round sends N requests at once to ``/completion`` for every N,
in alternating order, and sums their generation rates (``timings.predicted_per_second``; the same
prompt length and ``n_predict`` for all, ``ignore_eos``, prompt cache off).  N = 1 is one request
alone on the same server (one slot busy: a batch of one token), so the ratio total(N) / total(1) is
measured within one round, minutes apart at most: the machine's drift and other jobs move both.

The estimate for the same command line with ``-np N`` (the RAM probe and its one-thread copy measured
at the start of this run, this CPU's instruction set) gives its all-slots total over its one request;
"calibrated" is the same with the bandwidth efficiency that makes its one request the measured one
(``core.speed.calibrate``, as ``launch --bench`` stores it).  Nothing here is a timed test.

    python bench/speed_slots.py [--model bench-llama-2g] [--ns 1,2,4,8] [--rounds 4] [--gen 48]
                                [--threads 2] [--json out.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from offload_planner.backend.launch import find_server_executable
from offload_planner.backend.speed_store import core_speed, local_thread_bandwidth, measure_ram, this_cpu
from offload_planner.backend.system import cpu_device
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import build_device_set
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.speed.calibrate import calibrate
from offload_planner.core.speed.efficiency import DEFAULT, calibrated, for_host
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import Figure, Source, hardware_for
from offload_planner.core.speed.slots import with_slots
from offload_planner.core.synth.catalog import BENCH_MODELS
from speed_measured import free_port, model_file, process, wait_http


def _post(url: str, body: dict[str, Any], out: list[dict[str, Any] | None], i: int) -> None:
    req = urllib.request.Request(url + "/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        out[i] = json.loads(r.read())["timings"]


def server_pid(pid: int) -> int:
    """The llama-server process: ``pid`` itself, or its child when ``pid`` is a wrapper."""
    for _ in range(20):
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        if comm.startswith("llama-server"):
            return pid
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if not kids:
            break
        pid = int(kids[0])
    raise RuntimeError("llama-server's process not found")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, every thread) ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def all_at_once(url: str, n: int, rnd: int, gen: int, n_vocab: int, pid: int) -> tuple[float, float]:
    """Total generation rate of ``n`` requests sent at once (each its own 8-token prompt), and the
    tokens generated per second of the server's CPU time (with ``-t 1``: its one compute thread's work,
    whatever share of a core other jobs leave it; the prompts' 8 tokens each counted in)."""
    out: list[dict[str, Any] | None] = [None] * n
    threads = []
    for i in range(n):
        prompt = [100 + (rnd * 97 + i * 13 + k * 7919) % (n_vocab - 200) for k in range(8)]
        body = {"prompt": prompt, "n_predict": gen, "ignore_eos": True, "cache_prompt": False,
                "temperature": 0.0}
        threads.append(threading.Thread(target=_post, args=(url, body, out, i)))
    c0 = cpu_seconds(pid)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu = cpu_seconds(pid) - c0
    return sum(float(t["predicted_per_second"]) for t in out if t is not None), n * gen / cpu


def estimated(model: Path, argv: list[str], ns: list[int], ram: float, one: float | None,
              threads: int, measured_one: float | None) -> dict[int, float]:
    """total(N) / one request, estimated (with ``measured_one``: calibrated to that one-request rate)."""
    cpu = this_cpu()
    devices = build_device_set(cpu=cpu_device(), detected=[], rpc_endpoints=[], declared=[])
    probe = Figure(ram, "GB/s", Source.MEASURED, "RAM probe in this run")
    one_f = None if one is None else Figure(one, "GB/s", Source.MEASURED, "one thread's copy in this run")
    hw = hardware_for(devices, threads=threads, probe=probe, cpu=cpu,
                      thread_bw=local_thread_bandwidth(devices, one_f))
    eff = for_host(DEFAULT, *core_speed(cpu))
    m = open_model(model)
    out = {}
    for n in ns:
        plan = plan_from_args(m, devices, parse_server_args([*argv, "-np", str(n)]), "llama.cpp")
        e = eff
        if measured_one:
            cal = calibrate(estimate(plan, hw, eff=eff), hw, eff, tg_tps=measured_one)
            e = calibrated(cal.values, "this run's one request", eff) if cal.values else eff
        est = with_slots(estimate(plan, hw, eff=e), plan, hw, e)
        out[n] = est.slots.tg_tps_total / est.tg_tps if est.slots is not None else 1.0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bench-llama-2g", choices=sorted(BENCH_MODELS))
    ap.add_argument("--ns", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--gen", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/offload-bench"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--cpu-time", action="store_true",
                    help="ratios of tokens per CPU second of the server (-t 1 on a busy machine)")
    a = ap.parse_args()
    a.workdir.mkdir(parents=True, exist_ok=True)
    found = find_server_executable(None)
    if found.path is None:
        print(found.message, file=sys.stderr)
        return 2
    ns = sorted({1, *(int(x) for x in a.ns.split(","))})
    model = model_file(a.model, a.workdir)
    n_vocab = BENCH_MODELS[a.model].tokenizer.n_vocab
    probe = measure_ram()
    argv = ["-c", str(a.ctx), "-t", str(a.threads), "-lm", "none", "-fit", "off", "-ngl", "0"]
    print(f"# {a.model}, llama-server {' '.join(argv)} -np {max(ns)}; RAM probe {probe.gbs:.1f} GB/s, "
          f"one thread {probe.thread_gbs or 0:.1f} GB/s; load {os.getloadavg()[0]:.1f}", flush=True)
    port = free_port()
    rows: dict[int, list[float]] = {n: [] for n in ns}
    ratios: dict[int, list[float]] = {n: [] for n in ns}
    with process([found.path, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), *argv,
                  "-np", str(max(ns))], a.workdir / "slots-server.log") as proc:
        url = f"http://127.0.0.1:{port}"
        wait_http(url, proc, a.timeout)
        pid = server_pid(proc.pid)
        all_at_once(url, 1, -1, 8, n_vocab, pid)  # warm-up
        for rnd in range(a.rounds):
            got, wall, cpu = {}, {}, {}
            for n in ns if rnd % 2 == 0 else ns[::-1]:
                wall[n], cpu[n] = all_at_once(url, n, rnd, a.gen, n_vocab, pid)
                got[n] = cpu[n] if a.cpu_time else wall[n]
                rows[n].append(got[n])
            for n in ns:
                ratios[n].append(got[n] / got[1])
            line = "  ".join(f"np {n} {got[n]:.2f} {'t/cpu-s' if a.cpu_time else 't/s'} "
                             f"({got[n] / got[1]:.2f}x; wall {wall[n] / wall[1]:.2f}x)" for n in ns)
            print(f"round {rnd}: {line}  load {os.getloadavg()[0]:.1f}", flush=True)
            if a.json:
                with a.json.open("a") as f:
                    f.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                        "model": a.model, "threads": a.threads, "round": rnd,
                                        "ram_gbs": round(probe.gbs, 2),
                                        "thread_gbs": round(probe.thread_gbs or 0.0, 2),
                                        "total_tps": {str(n): round(wall[n], 3) for n in ns},
                                        "tokens_per_cpu_s": {str(n): round(cpu[n], 3) for n in ns},
                                        "load": round(os.getloadavg()[0], 2)}) + "\n")
    one = statistics.median(rows[1])  # with --cpu-time: the one thread's rate, as if alone on a core
    est = estimated(model, argv, ns, probe.gbs, probe.thread_gbs, a.threads, None)
    cal = estimated(model, argv, ns, probe.gbs, probe.thread_gbs, a.threads, one)
    print(f"{'N':>3s} {'measured total/one':>22s} {'estimated':>10s} {'est/meas':>8s} {'calibrated':>10s} "
          f"{'est/meas':>8s}")
    for n in ns:
        med = statistics.median(ratios[n])
        print(f"{n:3d} {med:8.2f} ({min(ratios[n]):.2f}-{max(ratios[n]):.2f}) {est[n]:10.2f} "
              f"{est[n] / med:8.2f} {cal[n]:10.2f} {cal[n] / med:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
