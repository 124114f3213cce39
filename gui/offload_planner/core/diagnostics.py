"""Warnings about a plan: over-capacity devices, -ot rules that match nothing or are shadowed, and
placements that cost speed."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from offload_planner.core.cmdline import check_pattern
from offload_planner.core.memory import Projection
from offload_planner.core.placement import CPU, Override, compile_override
from offload_planner.core.roles import Role
from offload_planner.core.units import fmt_bytes


@dataclass(frozen=True)
class RuleReport:
    """What one -ot rule did: tensors and bytes it placed, tensors it also matched but an earlier
    rule had taken."""

    index: int
    override: Override
    placed: int
    placed_bytes: int
    shadowed: int

    @property
    def status(self) -> str:
        if self.placed:
            return "ok"
        return "shadowed" if self.shadowed else "matches nothing"


def rule_reports(projection: Projection, overrides: tuple[Override, ...]) -> list[RuleReport]:
    compiled = [compile_override(o.pattern) for o in overrides]
    placed = [0] * len(overrides)
    placed_bytes = [0] * len(overrides)
    shadowed = [0] * len(overrides)
    for p in projection.placement.items:
        if p.device is None or p.copy:
            continue
        first = True
        for i, rx in enumerate(compiled):
            if rx.search(p.tensor.name):
                if first:
                    placed[i] += 1
                    placed_bytes[i] += p.tensor.nbytes
                    first = False
                else:
                    shadowed[i] += 1
    return [
        RuleReport(i, o, placed[i], placed_bytes[i], shadowed[i]) for i, o in enumerate(overrides)
    ]


def plan_warnings(projection: Projection, overrides: tuple[Override, ...]) -> list[str]:
    out: list[str] = []
    for dm in projection.devices:
        cap = dm.device.capacity
        if cap is None:
            continue
        used = dm.resident() + dm.device.margin
        if used > cap:
            out.append(
                f"{dm.device.name} is over capacity by {fmt_bytes(used - cap)} "
                f"({fmt_bytes(dm.resident())} projected"
                + (f" + {fmt_bytes(dm.device.margin)} margin" if dm.device.margin else "")
                + f" > {fmt_bytes(cap)})"
            )
    for r in rule_reports(projection, overrides):
        src = f"{r.override.source} {r.override.pattern}={r.override.buft}"
        if r.status == "matches nothing":
            out.append(f"{src} matches no tensor")
        elif r.status == "shadowed":
            out.append(f"{src} is shadowed: the {r.shadowed} tensors it matches are placed by earlier rules")
    for o in overrides:  # what std::regex reads differently from what a user may expect
        out.extend(f"{o.source} {o.pattern}: {w}" for w in check_pattern(o.pattern).warnings)
    out.extend(_speed_warnings(projection))
    return out


def _speed_warnings(projection: Projection) -> list[str]:
    attn: dict[int, set[str]] = defaultdict(set)
    exps: dict[int, set[str]] = defaultdict(set)
    for p in projection.placement.items:
        if p.device is None or p.tensor.layer is None:
            continue
        if p.tensor.role is Role.ATTENTION:
            attn[p.tensor.layer].add(p.device)
        elif p.tensor.role.is_routed_expert:
            exps[p.tensor.layer].add(p.device)
    odd = sorted(
        il for il in exps if attn.get(il) == {CPU} and any(d != CPU for d in exps[il])
    )
    if odd:
        return [
            f"layers {_ranges(odd)} keep attention on the CPU but routed experts on a GPU: every "
            "token crosses the bus twice per layer; offload the attention of those layers too"
        ]
    return []


def _ranges(xs: list[int]) -> str:
    parts: list[str] = []
    start = prev = xs[0]
    for x in xs[1:]:
        if x == prev + 1:
            prev = x
            continue
        parts.append(f"{start}-{prev}" if prev != start else str(start))
        start = prev = x
    parts.append(f"{start}-{prev}" if prev != start else str(start))
    return ",".join(parts)
