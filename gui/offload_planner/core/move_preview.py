"""What moving tensors would change: per device, the change in its projected weights if the tensors
moved there (Qt-free, for the tensor map's tooltip).

Only the weight buffers are recomputed (:func:`offload_planner.core.memory.weight_buffers`: each
tensor with its row and alignment padding, mmap'd CPU weights by the bytes read), which takes about a
millisecond; the compute buffers, which need the graph simulation, are not included.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from offload_planner.core.device_figures import counted
from offload_planner.core.memory import weight_buffers
from offload_planner.core.placement import Placement
from offload_planner.core.plan import Plan
from offload_planner.core.speed.efficiency import Efficiencies
from offload_planner.core.speed.hardware import Hardware
from offload_planner.core.speed.speculation import tg_tps_as_shown


@dataclass(frozen=True)
class MoveDelta:
    target: str  # the device the tensors would move to
    delta: int  # change of the target's projected total, bytes
    others: tuple[tuple[str, int], ...]  # changes on the other devices (the sources), non-zero only

    @property
    def unchanged(self) -> bool:
        return self.delta == 0 and not self.others


def weights_per_device(plan: Plan, placement: Placement) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for b in weight_buffers(plan.model, placement, plan.devices):
        out[b.device] += counted(b)
    return out


def move_tg(plan: Plan, names: Sequence[str], hw: Hardware, eff: Efficiencies,
            current: Placement | None = None) -> dict[str, tuple[float, float]]:
    """Per device: estimated tg (t/s, depth 0, with the plan's draft model or MTP: the window's speed
    line) now and if ``names`` moved there (core.speed on the hardware and efficiencies given)."""
    if not names:
        return {}
    now = tg_tps_as_shown(plan, hw, eff, placement=current)
    return {dev: (now, tg_tps_as_shown(plan.with_moves(dict.fromkeys(names, dev)), hw, eff))
            for dev in plan.devices.names}


def move_deltas(plan: Plan, names: Sequence[str], current: Placement | None = None) -> list[MoveDelta]:
    """For each device of the plan (llama.cpp order), what moving ``names`` there changes."""
    if not names:
        return []
    before = weights_per_device(plan, current if current is not None else plan.placement())
    out = []
    for dev in plan.devices.names:
        after = weights_per_device(plan, plan.with_moves(dict.fromkeys(names, dev)).placement())
        diff = {d: after.get(d, 0) - before.get(d, 0) for d in {*before, *after}}
        others = tuple((d, diff[d]) for d in plan.devices.names if d != dev and diff.get(d))
        out.append(MoveDelta(dev, diff.get(dev, 0), others))
    return out
