"""Warnings about a plan: over-capacity devices, -ot rules that match nothing or are shadowed, and
placements that cost speed."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from operator import is_

from offload_planner.core.cmdline import check_pattern
from offload_planner.core.device_figures import CapacityHint, capacity_warnings
from offload_planner.core.memory import Projection
from offload_planner.core.model import Tensor
from offload_planner.core.placement import CPU, Override, Placed
from offload_planner.core.roles import ROUTED_EXPERT_ROLES, Role
from offload_planner.core.rule_match import NameIndex, name_index, rule_set


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


def rule_reports(projection: Projection, overrides: tuple[Override, ...], *,
                 tensors: list[Tensor] | None = None) -> list[RuleReport]:
    """What each rule did in the projection's placement. ``tensors``: the model's, whose names placement
    matched the rules against (:func:`~offload_planner.core.rule_match.name_index`): their matches are
    reused where the placed tensors are those, in order."""
    rules = rule_set(overrides)
    kept = [p for p in projection.placement.items if p.device is not None and not p.copy]
    bulk = rules.matches_of_all(_names(kept, tensors)) if overrides else []
    by_pattern: list[Sequence[int]] = [] if bulk is None else list(bulk)
    if bulk is None:  # the per-name path: rules to budget, or too many patterns
        per: list[list[int]] = [[] for _ in rules.patterns]
        for i, p in enumerate(kept):
            for u in rules.hits(p.tensor.name):
                per[u].append(i)
        by_pattern = list(per)
    placed = [0] * len(overrides)
    placed_bytes = [0] * len(overrides)
    for p, first in zip(kept, _first_matching(by_pattern, len(kept)), strict=True):
        if first is not None:
            winner = rules.patterns[first].members[0]
            placed[winner] += 1
            placed_bytes[winner] += p.tensor.nbytes
    matched = [len(m) for m in by_pattern]  # per distinct pattern: tensors it matches
    return [
        RuleReport(i, o, placed[i], placed_bytes[i], matched[rules.pattern_of[i]] - placed[i])
        for i, o in enumerate(overrides)
    ]


def _names(kept: list[Placed], tensors: list[Tensor] | None) -> NameIndex:
    """The names of the kept items' tensors: the model's cached index where they are its tensors."""
    if tensors is not None and len(kept) == len(tensors) and all(map(is_, (p.tensor for p in kept), tensors)):
        return name_index(tensors, lambda: [t.name for t in tensors])
    return NameIndex(tuple(p.tensor.name for p in kept))


def _first_matching(by_pattern: Sequence[Sequence[int]], n: int) -> list[int | None]:
    """Per name, the first pattern that matches it (the rule that places it), from each pattern's
    matches (indices of names)."""
    first: list[int | None] = [None] * n
    for u, matching in enumerate(by_pattern):
        for i in matching:
            if first[i] is None:
                first[i] = u
    return first


def plan_warnings(projection: Projection, overrides: tuple[Override, ...], *,
                  reports: Sequence[RuleReport] | None = None,
                  capacity_hint: CapacityHint | None = None) -> list[str]:
    """Devices over capacity, then the rules (``reports``: already computed for ``overrides``),
    the patterns std::regex reads otherwise, and placements that cost speed."""
    out = capacity_warnings(projection, capacity_hint)
    if reports is None:
        reports = rule_reports(projection, overrides)
    out.extend(_generated_unmatched(reports))
    for r in reports:
        src = f"{r.override.source} {r.override.pattern}={r.override.buft}"
        if r.status == "matches nothing" and r.override.source in _PER_LAYER_FLAGS:
            continue
        if r.status == "matches nothing":
            out.append(f"{src} matches no tensor")
        elif r.status == "shadowed":
            out.append(f"{src} is shadowed: the {r.shadowed} tensors it matches are placed by earlier rules")
    for o in overrides:  # what std::regex reads differently from what a user may expect
        out.extend(f"{o.source} {o.pattern}: {w}" for w in check_pattern(o.pattern).warnings)
    out.extend(_speed_warnings(projection))
    return out


#: Flags that stand for one -ot rule per layer 0..N-1: their unmatched rules are one line per flag.
_PER_LAYER_FLAGS = ("--n-cpu-moe", "--n-cpu-ffn")
_LAYER_OF = re.compile(r"^blk\\\.(\d+)")


def _generated_unmatched(reports: Sequence[RuleReport]) -> list[str]:
    """``--n-cpu-moe 99999: the rules for layers 0-2,61-511 match no tensor`` (one line, not 454)."""
    out = []
    for flag in _PER_LAYER_FLAGS:
        mine = [r for r in reports if r.override.source == flag]
        layers = sorted(int(m.group(1)) for r in mine if r.status == "matches nothing"
                        if (m := _LAYER_OF.match(r.override.pattern)))
        if layers:
            out.append(f"{flag}: the rules for layers {_ranges(layers)} match no tensor "
                       f"({len(layers)} of its {len(mine)})")
    return out


def _speed_warnings(projection: Projection) -> list[str]:
    attn: dict[int, set[str]] = defaultdict(set)
    exps: dict[int, set[str]] = defaultdict(set)
    attention, experts = Role.ATTENTION, ROUTED_EXPERT_ROLES
    for p in projection.placement.items:
        if p.device is None or p.tensor.layer is None:
            continue
        role = p.tensor.role
        if role is attention:
            attn[p.tensor.layer].add(p.device)
        elif role in experts:
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
