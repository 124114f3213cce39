"""Efficiencies from a measurement: what the estimate's largest term must have been for the
estimate to equal what a bench measured (``launch --bench`` stores the result with
``backend.speed_store.record_efficiencies``; later estimates say "calibrated").

Token generation fits the bandwidth efficiency of the part that takes most of the time per token
(the CPU's: ``cpu_bandwidth``, ``probe_bandwidth`` when its bandwidth was measured by the probe,
``cpu_thread_bandwidth`` when ``-t`` limited it; the GPUs': ``gpu_bandwidth``).  Prompt
processing fits the compute efficiency of the part that takes most of the prompt time
(``cpu_compute`` / ``gpu_compute``), or ``link`` when op-offload copies dominate.  The other terms
are kept as estimated.  A term that cannot explain the measurement (the rest alone already takes
longer) is left out.
"""

from __future__ import annotations

from offload_planner.core.speed.efficiency import Efficiencies
from offload_planner.core.speed.estimate import SpeedEstimate
from offload_planner.core.speed.hardware import Hardware, Source


def _solve(old: float, part: float, total_measured: float, rest: float) -> float | None:
    """``part / new_eff * old`` + ``rest`` = ``total_measured`` (times in one unit)."""
    if part <= 0 or total_measured <= rest:
        return None
    return old * part / (total_measured - rest)


def fit_efficiencies(est: SpeedEstimate, hw: Hardware, eff: Efficiencies, *, tg_tps: float | None = None,
                     pp_tps: float | None = None) -> dict[str, float]:
    """Efficiency names -> values that make ``est`` (made with ``eff`` on ``hw``) match the measured
    ``tg_tps`` (at depth 0) and ``pp_tps`` (for ``est.prompt`` tokens at ``est.n_ubatch``)."""
    out: dict[str, float] = {}
    if tg_tps:
        cpu = sum(d.tg_ms_per_token for d in est.devices if d.name == "CPU")
        gpu = sum(d.tg_ms_per_token for d in est.devices if d.name != "CPU")
        measured = 1e3 / tg_tps
        if cpu >= gpu:
            measured_cpu = hw["CPU"].bandwidth.source is Source.MEASURED
            name = "probe_bandwidth" if measured_cpu else "cpu_bandwidth"
            if any(a.what.startswith("CPU limited by -t") for a in est.assumptions):
                name = "cpu_thread_bandwidth"  # -t, not the RAM, set the CPU's bandwidth
            v = _solve(getattr(eff, name).value, cpu, measured, gpu + est.split_ms)
        else:
            name = "gpu_bandwidth"
            v = _solve(eff.gpu_bandwidth.value, gpu, measured, cpu + est.split_ms)
        if v is not None:
            out[name] = round(v, 4)
    if pp_tps:
        cpu = sum(d.pp_ms for d in est.devices if d.name == "CPU")
        gpu = sum(d.pp_ms for d in est.devices if d.name != "CPU")
        parts = {"cpu_compute": cpu, "gpu_compute": gpu, "link": est.pp_transfer_ms}
        name = max(parts, key=lambda k: parts[k])
        rest = sum(v for k, v in parts.items() if k != name) + est.pp_split_ms
        v = _solve(getattr(eff, name).value, parts[name], 1e3 * est.prompt / pp_tps, rest)
        if v is not None:
            out[name] = round(v, 4)
    return out
