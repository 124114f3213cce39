"""What an estimate rests on: each figure it used and where it came from, and the warning when this
machine's compute threads outnumber its cores."""

from __future__ import annotations

from offload_planner.core.devices import DeviceKind
from offload_planner.core.placement import Placement
from offload_planner.core.plan import Plan
from offload_planner.core.speed.efficiency import Efficiencies
from offload_planner.core.speed.hardware import Figure, Hardware, Source, Threads
from offload_planner.core.speed.rates import _bandwidth, _is_gpu, computes_on_cpu
from offload_planner.core.speed.reads import _running
from offload_planner.core.speed.result import Assumption


def _assumptions(plan: Plan, placement: Placement, hw: Hardware, eff: Efficiencies) -> list[Assumption]:
    used = {p.device for p in _running(placement) if p.device is not None}
    used.add(placement.output_device)
    out: list[Assumption] = []
    for name in plan.devices.names:
        if name not in used:
            continue
        d = hw[name]
        out += _bandwidth(d, eff)[1]
        out.append(Assumption(f"{name} compute", d.tflops))
        out.append(Assumption(f"{name} compute efficiency",
                              eff.cpu_compute if computes_on_cpu(d) else eff.gpu_compute))
        out += batch_assumptions(name, hw, eff)
        if d.kind is not DeviceKind.CPU:
            out.append(Assumption(f"{name} host link", d.link))
    if any(_is_gpu(hw[n]) for n in used):
        out.append(Assumption("a GPU layer's fixed time a token", eff.gpu_layer_us))
    out.append(Assumption("link efficiency", eff.link))
    out.append(Assumption("graph split latency", eff.split_latency_us))
    if any(hw[n].kind is DeviceKind.RPC for n in used):
        out.append(Assumption("RPC split latency", eff.rpc_latency_us))
    for n in (n for n in plan.devices.names if n in used):  # the devices' order, not a set's (hash seed)
        lat = hw[n].latency_us
        if lat is not None:
            out.append(Assumption(f"{n} RPC round trip per split", lat))
    if plan.placement_options.split_mode in ("row", "tensor"):
        out.append(Assumption(f"-sm {plan.placement_options.split_mode} estimated as -sm layer",
                              Figure(1, "x", Source.DEFAULT, "devices summed, not run in parallel")))
    return out


def batch_assumptions(name: str, hw: Hardware, eff: Efficiencies) -> list[Assumption]:
    """What a batch of more than one token (a prompt's micro-batches, the speculative verify batch)
    computes with on device ``name`` where ``-tb`` makes it differ from one token's figures
    (:attr:`Hardware.batch`): the CPU's threads and compute, and the bandwidth notes that differ
    (``-tb``'s limit on the reads, the share of oversubscribed cores)."""
    b = hw.batch
    if b is None or name not in b.devices or b[name] == hw[name]:
        return []
    d = b[name]
    out: list[Assumption] = []
    if d.kind is DeviceKind.CPU and d.threads:
        one = hw[name].threads or (hw.threads.server if hw.threads is not None else None)
        note = ("llama.cpp computes a batch of more than one token (a prompt's micro-batches, a speculative "
                f"verify batch) with -tb, a single token with -t{f' {one}' if one else ''} "
                "(src/llama-context.cpp graph_compute)")
        out.append(Assumption(f"{name} threads in a batch (pp: {d.threads_flag} {d.threads})",
                              Figure(d.threads, "threads", Source.DECLARED, note)))
        out.append(Assumption(f"{name} compute in a batch ({d.threads_flag} {d.threads})", d.tflops))
    single = _bandwidth(hw[name], eff)[1]
    tb = next((x.threads for x in b.devices.values() if x.kind is DeviceKind.CPU), None)
    out += [Assumption(a.what if "-tb" in a.what else f"{a.what} (in a batch: -tb {tb})", a.figure)
            for a in _bandwidth(d, eff)[1] if a not in single]
    return out


def draft_assumptions(hw: Hardware) -> list[Assumption]:
    """The CPU threads a ``-md`` draft model computes with where ``-td``/``-tbd`` make them differ
    from the target's (:attr:`Hardware.draft`): over one token and over a batch (its catch-up)."""
    d = hw.draft
    if d is None:
        return []
    note = ("a -md draft model's context computes with its own threads: llama.cpp's -td, else -t, and for a "
            "batch -tbd, else the target's batch threads; ik_llama.cpp's -t and -tb inside -draft, else the "
            "main command's")
    out: list[Assumption] = []
    for h, when in ((d, "a token"), *([(d.batch, "a batch")] if d.batch is not None else [])):
        cpu = next((x for x in h.devices.values() if x.kind is DeviceKind.CPU), None)
        if cpu is not None and cpu.threads:
            what = f"draft model: {cpu.name} threads in {when} ({cpu.threads_flag} {cpu.threads})"
            out.append(Assumption(what, Figure(cpu.threads, "threads", Source.DECLARED, note)))
            out.append(Assumption(f"draft model: {cpu.name} compute in {when}", cpu.tflops))
    return out


def thread_warnings(hw: Hardware) -> list[str]:
    """More compute threads than physical cores on this machine: said, with the slowdown assumed (for
    one token's ``-t`` and, where ``-tb`` differs, a batch's)."""
    out = _thread_warning(hw.threads, "")
    if hw.batch is not None:
        out += _thread_warning(hw.batch.threads, " in a batch of more than one token (pp)")
    return out


def _thread_warning(t: Threads | None, when: str) -> list[str]:
    if t is None or not t.oversubscribed:
        return []
    if t.rpc:
        return [_crowded_device(t, d, when) for d in t.crowded]
    return [f"{t.describe()}: oversubscribed{when}; the estimate gives each thread {t.share:.2f} of a core, "
            f"{', '.join(t.local)} {1 / t.share:.2f}x slower (llama.cpp's threads wait for each other at "
            f"every op: a busy machine is slower still); consider {t.flag} {t.cores}"]


def _crowded_device(t: Threads, device: str, when: str) -> str:
    """The warning of one device whose own threads outnumber the cores, beside local rpc-servers: the
    devices take turns (:class:`Threads`), so the others' threads are not counted against it."""
    n, share = t.threads_of(device), t.share_of(device)
    server = device == t.local[0]
    who = (f"{n} llama-server threads ({t.flag})" if server
           else f"{n} threads of rpc-server {t.endpoints[device]}")
    fix = f"{t.flag} {t.cores}" if server else f"rpc-server -t {t.cores}"
    return (f"{who} on {t.cores} physical core{'s' if t.cores != 1 else ''}: oversubscribed{when}; the "
            f"estimate gives each thread {share:.2f} of a core, {device} {1 / share:.2f}x slower "
            f"(llama.cpp's threads wait for each other at every op: a busy machine is slower still; the "
            f"devices take turns, so the other devices' threads do not count); consider {fix}")
