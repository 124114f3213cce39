"""What a device does in a second: its effective memory bandwidth and compute (its efficiency, its
threads, its share of oversubscribed cores), and a graph split's link between two devices."""

from __future__ import annotations

from offload_planner.core.devices import DeviceKind
from offload_planner.core.placement import CPU
from offload_planner.core.speed.cpu_isa import Isa
from offload_planner.core.speed.efficiency import Efficiencies
from offload_planner.core.speed.hardware import DeviceSpeed, Figure, Hardware, Source
from offload_planner.core.speed.result import Assumption


def _bandwidth(dev: DeviceSpeed, eff: Efficiencies) -> tuple[float, list[Assumption]]:
    """Effective GB/s of a device's memory, and what it rests on (a device whose threads share
    oversubscribed cores: that share of it, :class:`hardware.Threads`)."""
    notes: list[Assumption] = []
    return _effective_bandwidth(dev, eff, notes), notes


def _effective_bandwidth(dev: DeviceSpeed, eff: Efficiencies,
                         notes: list[Assumption] | None = None) -> float:
    """:func:`_bandwidth`'s GB/s, its assumptions added to ``notes`` when given (the estimate's loops
    ask for the figure alone, per micro-batch and device)."""
    bw = _peak_bandwidth(dev, eff, notes)
    if dev.share < 1.0:
        bw *= dev.share
        if notes is not None:
            notes.append(Assumption(f"{dev.name} oversubscribed: its threads get this share of a core",
                                    Figure(round(dev.share, 3), "x", Source.DEFAULT,
                                           "cores / compute threads on this machine; bandwidth and compute "
                                           "scaled by it")))
    return bw


def _is_gpu(dev: DeviceSpeed) -> bool:
    """A local GPU (not the CPU; not an RPC device, whose server's backend is not known: ggml-rpc-server
    computes on its CPU by default)."""
    return dev.kind not in (DeviceKind.CPU, DeviceKind.RPC)


def computes_on_cpu(dev: DeviceSpeed) -> bool:
    """The CPU, or an RPC device whose server computes with this machine's CPU backend
    (``DeviceSpeed.cpu_backend``): ggml-cpu's kernels, its threads both reading and multiplying."""
    return dev.kind is DeviceKind.CPU or dev.cpu_backend


def cpu_isa_gain(hw: Hardware) -> float:
    """The host CPU's instruction-set gain (``DeviceSpeed.isa_gain``; 1 without a CPU figure)."""
    return hw.devices[CPU].isa_gain if CPU in hw.devices else 1.0


def cpu_isa(hw: Hardware) -> Isa | None:
    """The host CPU's instruction-set tier (``DeviceSpeed.isa``; None without a CPU figure or when not
    known)."""
    return hw.devices[CPU].isa if CPU in hw.devices else None


def compute_tflops(dev: DeviceSpeed, eff: Efficiencies) -> float:
    """Effective TFLOPS of a device: peak x efficiency x its share of oversubscribed cores."""
    e = eff.cpu_compute if computes_on_cpu(dev) else eff.gpu_compute
    return dev.tflops.value * e.value * dev.share


def _peak_bandwidth(dev: DeviceSpeed, eff: Efficiencies, notes: list[Assumption] | None) -> float:
    """GB/s of a device's memory at its efficiency, limited by its threads (an RPC server's, the
    CPU's ``-t``), before any share of oversubscribed cores; what it rests on added to ``notes``."""
    rpc = dev.kind is DeviceKind.RPC and bool(dev.threads)  # the server computes on its CPU with -t threads
    if rpc and not dev.cpu_backend:
        e = eff.cpu_bandwidth
    elif computes_on_cpu(dev):
        e = eff.probe_bandwidth if dev.bandwidth.source is Source.MEASURED else eff.cpu_bandwidth
    else:
        e = eff.gpu_bandwidth
    bw = dev.bandwidth.value * e.value
    if notes is not None:
        notes += [Assumption(f"{dev.name} memory bandwidth", dev.bandwidth),
                  Assumption(f"{dev.name} bandwidth efficiency", e)]
    per = thread_bandwidth(dev, eff)
    if (rpc or dev.kind is DeviceKind.CPU) and dev.threads and dev.threads * per.value < bw:
        bw = dev.threads * per.value
        if notes is not None:
            by = f"its server's {dev.threads} threads" if rpc else f"{dev.threads_flag} {dev.threads}"
            notes.append(Assumption(f"{dev.name} limited by {by}", per))
    return bw


def thread_bandwidth(dev: DeviceSpeed, eff: Efficiencies) -> Figure:
    """GB/s one of ``dev``'s compute threads reads: ``cpu_thread_bandwidth`` when calibrated (or given),
    else the single-thread copy measured on the machine its threads run on (``dev.thread_bandwidth``)
    at the probe's efficiency (``probe_bandwidth``, as the threads together reach of theirs), else the
    default.  On a 2-vCPU AVX-512 EPYC (Zen 4) whose one-thread copy reads 21-26 GB/s, llama.cpp's
    token kernels ran 19.7-21.5 GB/s on one thread (perf's on-CPU time of ``ggml_gemv_q4_K_8x8_q8_K``
    and ``ggml_vec_dot_q6_K_q8_K`` over their bytes, bench-llama-2g and bench-qwen3moe-2g at -t 1)."""
    per = eff.cpu_thread_bandwidth
    one = dev.thread_bandwidth
    if per.source is not Source.DEFAULT or one is None:
        return per
    e = eff.probe_bandwidth
    return Figure(round(one.value * e.value, 2), per.unit, one.source,
                  f"one thread's copy, {one.value:g} GB/s, x {e.value:g} ({e.source}: of the probe's copy); "
                  f"{one.note}")


def _link(a: DeviceSpeed, b: DeviceSpeed, eff: Efficiencies) -> tuple[float, float]:
    """(effective GB/s, latency s) of a split between two devices: the slower side's link."""
    gb = min(a.link.value, b.link.value) * eff.link.value
    rpc = DeviceKind.RPC in (a.kind, b.kind)
    # RPC: the server's work per split plus the round trip measured to it (none measured: the default
    # covers a loopback round trip)
    rtt = max((d.latency_us.value for d in (a, b) if d.latency_us is not None), default=0.0)
    lat = ((eff.rpc_latency_us.value + rtt) if rpc else eff.split_latency_us.value) * 1e-6
    return gb, lat


def _links(pairs: list[tuple[str, str]], hw: Hardware, eff: Efficiencies) -> list[tuple[float, float]]:
    """:func:`_link` of every split, in order (worked out once per pair of devices: a MoE model with
    its experts on the CPU has hundreds of splits between two devices)."""
    known = {(a, b): _link(hw[a], hw[b], eff) for a, b in set(pairs)}
    return [known[p] for p in pairs]
