"""From one measured run to the efficiencies that make the estimate match it.

A measurement gives two numbers (tg and pp tokens/s) and the estimate is a sum of per-device
times, so one run cannot fix every efficiency.  The rule is the one a person tuning by hand would
follow: the measured time minus what the estimate gives the other parts is the time of the part
that dominates (the bottleneck device of token generation, and of prompt processing; or the host
link when op-offload copies dominate), and that part's efficiency is scaled to match.  The parts
that do not dominate keep their efficiencies.  A part whose time the measurement cannot isolate
(the others alone already take longer than measured) is left alone and said so.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from offload_planner.core.devices import DeviceKind
from offload_planner.core.speed.efficiency import Efficiencies
from offload_planner.core.speed.hardware import DeviceSpeed, Hardware, Source
from offload_planner.core.speed.rates import thread_bandwidth
from offload_planner.core.speed.result import SpeedEstimate

#: A measurement that moves an efficiency by more than this factor either way is not what the
#: model describes (a busy machine, swapping, a wrong declaration): it is not stored.
MAX_FACTOR = 25.0


#: The efficiencies a calibration changes, as its notes name them (``launch --bench``, the Launch tab's
#: Bench): the notes read "tg (bottleneck CPU): cpu_thread_bandwidth 10 -> 6.75 GB/s per thread",
#: field names a llama.cpp user cannot read. These are the words of plan's assumptions ("CPU compute
#: efficiency", "link efficiency"); the stored and JSON keys stay the field names.
LABELS = {
    "gpu_bandwidth": "GPU bandwidth efficiency",
    "cpu_bandwidth": "CPU bandwidth efficiency (of its declared RAM speed)",
    "probe_bandwidth": "CPU bandwidth efficiency (of this machine's RAM probe)",
    "cpu_thread_bandwidth": "CPU bandwidth a thread (the -t limit)",
    "gpu_compute": "GPU compute efficiency",
    "cpu_compute": "CPU compute efficiency",
    "link": "link efficiency",
}


def label(name: str) -> str:
    """What a user reads for efficiency ``name`` (:data:`LABELS`; another field's name in words)."""
    return LABELS.get(name, name.replace("_", " "))


@dataclass
class Calibration:
    values: dict[str, float] = field(default_factory=dict)  # Efficiencies field name -> new value
    notes: list[str] = field(default_factory=list)


def _bandwidth_name(dev: DeviceSpeed, eff: Efficiencies) -> str | None:
    """The efficiency that sets ``dev``'s effective bandwidth in the estimate."""
    if dev.kind is DeviceKind.RPC:
        return None  # a remote device's figures are declared; its class is the GPUs'
    if dev.kind is not DeviceKind.CPU:
        return "gpu_bandwidth"
    e = eff.probe_bandwidth if dev.bandwidth.source is Source.MEASURED else eff.cpu_bandwidth
    if dev.threads and dev.threads * thread_bandwidth(dev, eff).value < dev.bandwidth.value * e.value:
        return "cpu_thread_bandwidth"
    return "probe_bandwidth" if dev.bandwidth.source is Source.MEASURED else "cpu_bandwidth"


def _own(dev: DeviceSpeed, eff: Efficiencies) -> Efficiencies:
    """``eff`` with the per-thread bandwidth ``dev``'s estimate used (its machine's measured one, when
    not calibrated: rates.thread_bandwidth), the figure a measurement rescales."""
    return replace(eff, cpu_thread_bandwidth=thread_bandwidth(dev, eff))


def _compute_name(dev: DeviceSpeed) -> str | None:
    if dev.kind is DeviceKind.RPC:
        return None
    return "cpu_compute" if dev.kind is DeviceKind.CPU else "gpu_compute"


def _rescale(cal: Calibration, eff: Efficiencies, name: str | None, part_s: float, total_est_s: float,
             total_measured_s: float, what: str) -> None:
    """Scale efficiency ``name`` so that the part's time makes the total match the measurement."""
    if name is None:
        # it said "its figures are declared" to a user who had declared none (the defaults were used)
        cal.notes.append(f"{what}: a remote (RPC) device dominates, and its speeds are not calibrated: give "
                         "them on its --device (bw=, tflops=); the estimate's assumptions name any default")
        return
    others = total_est_s - part_s
    part_measured = total_measured_s - others
    if part_s <= 0 or part_measured <= 0.05 * part_s:
        cal.notes.append(f"{what}: the other parts alone take {others:.3g} s of the measured "
                         f"{total_measured_s:.3g} s; {label(name)} left as it is")
        return
    old, unit = getattr(eff, name).value, getattr(eff, name).unit  # "x peak", "GB/s per thread"
    new = old * part_s / part_measured
    if not 1 / MAX_FACTOR <= new / old <= MAX_FACTOR:
        cal.notes.append(f"{what}: {label(name)} would go from {old:.3g} to {new:.3g} {unit}, more than "
                         f"{MAX_FACTOR:g}x; not stored")
        return
    cal.values[name] = round(new, 4)
    cal.notes.append(f"{what}: {label(name)} {old:.3g} -> {new:.3g} {unit}")


def calibrate(est: SpeedEstimate, hw: Hardware, eff: Efficiencies, *, tg_tps: float | None = None,
              pp_tps: float | None = None) -> Calibration:
    """Efficiencies (of ``eff``, the ones ``est`` was made with) that match the measured rates; tg
    measured after ``est.depth`` tokens of context when the estimate has one (its tg there)."""
    cal = Calibration()
    if tg_tps and est.tg_tps > 0 and est.devices:
        d = max(est.devices, key=lambda x: x.tg_ms_per_token)
        # measured at a depth (est.depth): the token's attention and KV reads there are other parts
        tg_est = est.tg_tps_at_depth if est.depth and est.tg_tps_at_depth else est.tg_tps
        _rescale(cal, _own(hw[d.name], eff), _bandwidth_name(hw[d.name], eff), d.tg_ms_per_token / 1e3,
                 1.0 / tg_est, 1.0 / tg_tps, f"tg (bottleneck {d.name})")
    if pp_tps and est.pp_tps > 0 and est.devices:
        d = max(est.devices, key=lambda x: x.pp_ms)
        total_est = est.prompt / est.pp_tps
        total_meas = est.prompt / pp_tps
        if est.pp_transfer_ms > d.pp_ms:
            _rescale(cal, eff, "link", est.pp_transfer_ms / 1e3, total_est, total_meas,
                     "pp (op-offload copies)")
        else:
            # a CPU's reads add to its compute (pp._microbatch): only the compute scales, and
            # the reads take the bandwidth the tg measurement just calibrated; a prompt's
            # micro-batches run with -tb's threads (Hardware.for_tokens)
            dev = hw.for_tokens(min(est.n_ubatch, est.prompt))[d.name]
            reads = d.pp_reads_ms / 1e3
            bw_name = _bandwidth_name(dev, eff)
            if bw_name is not None and bw_name in cal.values:
                reads *= getattr(_own(dev, eff), bw_name).value / cal.values[bw_name]
            _rescale(cal, eff, _compute_name(dev), (d.pp_ms - d.pp_reads_ms) / 1e3,
                     total_est - d.pp_reads_ms / 1e3 + reads, total_meas, f"pp (bottleneck {d.name})")
    return cal
