"""The ``-ub`` trade-off: prompt processing speed against the compute buffers each micro-batch size
costs (the engine's own projection of the plan at that ``-ub``; ``-b`` raised to match)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from offload_planner.core.device_figures import over_capacity
from offload_planner.core.plan import Plan
from offload_planner.core.speed.efficiency import Efficiencies
from offload_planner.core.speed.estimate import DEFAULT_PROMPT, estimate
from offload_planner.core.speed.hardware import Hardware

UBATCHES = (64, 128, 256, 512, 1024, 2048, 4096)


@dataclass(frozen=True)
class UbPoint:
    n_ubatch: int
    pp_tps: float
    tg_tps: float
    compute_bytes: dict[str, int]  # per device (llama.cpp order), as the projection reserves
    over: tuple[str, ...] = ()  # devices over capacity at this -ub (the compute buffer grows with it)
    pp_bottleneck: str = ""  # the estimate's, at this -ub

    @property
    def fits(self) -> bool:
        return not self.over

    @property
    def gpu_compute_bytes(self) -> int:
        return sum(v for k, v in self.compute_bytes.items() if k != "CPU")


def ubatch_tradeoff(plan: Plan, hw: Hardware, ubatches: Sequence[int] = UBATCHES, *,
                    prompt: int = DEFAULT_PROMPT, eff: Efficiencies | None = None) -> list[UbPoint]:
    """One point per ``-ub`` (one projection each: run it off the GUI thread)."""
    out = []
    for ub in ubatches:
        p = replace(plan, context=replace(plan.context, n_ubatch=ub, n_batch=max(ub, plan.context.n_batch)))
        proj = p.projection()
        est = estimate(p, hw, prompt=prompt, eff=eff, placement=proj.placement)
        out.append(UbPoint(ub, est.pp_tps, est.tg_tps, {d.device.name: d.compute for d in proj.devices},
                           tuple(over_capacity(proj)), est.pp_bottleneck))
    return out


def fastest_fitting(points: Sequence[UbPoint]) -> tuple[UbPoint | None, UbPoint | None]:
    """(the fastest ``-ub`` whose plan fits every device, the fastest of all when that one is faster
    and does not fit; else None)."""
    if not points:
        return None, None
    best = max(points, key=lambda p: p.pp_tps)
    fitting = [p for p in points if p.fits]
    best_fit = max(fitting, key=lambda p: p.pp_tps) if fitting else None
    return best_fit, (best if best is not best_fit and not best.fits else None)
