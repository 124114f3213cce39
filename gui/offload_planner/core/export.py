"""The shortest faithful -ot list for a placement: layer sets compressed to regex ranges.

Given the placement that -ngl/-ts alone produce (the base) and the device every tensor should end
on (the target), emit overrides that move exactly the differing tensors.  Tensors are grouped by
(device, role group), their layer numbers compressed into ranges such as
``blk\\.([0-9]|1[0-9]|2[0-5])\\.ffn_(up|gate|down)_exps\\.``; every candidate list is checked by
running placement again, and anything a group pattern would get wrong falls back to an exact
per-tensor pattern, so parsing the exported command always reproduces the target.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

from offload_planner.core.model import Model, Tensor
from offload_planner.core.placement import COPY_SUFFIX, CPU, Override
from offload_planner.core.roles import Role

#: Role groups that share one pattern, with the tensor-name part that selects them.
_GROUPS: dict[Role, tuple[str, str]] = {
    Role.EXPERTS_UP: ("exps", r"ffn_(up|gate|down|gate_up)_exps"),
    Role.EXPERTS_GATE: ("exps", r"ffn_(up|gate|down|gate_up)_exps"),
    Role.EXPERTS_DOWN: ("exps", r"ffn_(up|gate|down|gate_up)_exps"),
    Role.EXPERTS_GATE_UP: ("exps", r"ffn_(up|gate|down|gate_up)_exps"),
    Role.SHARED_EXPERT: ("shexp", r"ffn_(up|gate|down)_shexp"),
    Role.FFN_DENSE: ("ffn", r"ffn_(up|gate|down)\."),
}


def _digits_range(lo: str, hi: str) -> list[str]:
    """Regex alternatives matching every decimal string of the same length in [lo, hi]."""
    if len(lo) == 1:
        return [lo if lo == hi else f"[{lo}-{hi}]"]
    if lo[0] == hi[0]:
        return [lo[0] + r for r in _digits_range(lo[1:], hi[1:])]
    out: list[str] = []
    n = len(lo) - 1
    lo_partial, hi_partial = lo[1:] != "0" * n, hi[1:] != "9" * n
    if lo_partial:
        out += [lo[0] + r for r in _digits_range(lo[1:], "9" * n)]
    first = int(lo[0]) + lo_partial
    last = int(hi[0]) - hi_partial
    if first <= last:
        head = str(first) if first == last else f"[{first}-{last}]"
        out.append(head + "[0-9]" * n)
    if hi_partial:
        out += [hi[0] + r for r in _digits_range("0" * n, hi[1:])]
    return out


def int_range_regex(lo: int, hi: int) -> list[str]:
    """Alternatives matching exactly the integers lo..hi written without leading zeros."""
    out: list[str] = []
    while lo <= hi:
        width_end = min(hi, 10 ** len(str(lo)) - 1)
        out += _digits_range(str(lo), str(width_end))
        lo = width_end + 1
    return out


def runs(numbers: Iterable[int]) -> list[tuple[int, int]]:
    xs = sorted(set(numbers))
    out: list[tuple[int, int]] = []
    for x in xs:
        if out and x == out[-1][1] + 1:
            out[-1] = (out[-1][0], x)
        else:
            out.append((x, x))
    return out


def layers_regex(layers: Iterable[int]) -> str:
    alts = [a for lo, hi in runs(layers) for a in int_range_regex(lo, hi)]
    return alts[0] if len(alts) == 1 else "(" + "|".join(alts) + ")"


def _exact(t: Tensor) -> str:
    return "^" + re.escape(t.name) + "$"


def candidate_overrides(model: Model, base: Mapping[str, str | None],
                        target: Mapping[str, str | None]) -> list[Override]:
    """Group the tensors whose device differs from the base into compressed patterns."""
    groups: dict[tuple[str, str, str], set[int]] = defaultdict(set)
    singles: list[tuple[str, Tensor]] = []
    for want, t in _differing(model, base, target):
        g = _GROUPS.get(t.role)
        if g is None or t.layer is None:
            singles.append((want, t))
            continue
        groups[(want, g[0], g[1])].add(t.layer)
    out: list[Override] = []
    # GPU targets first, CPU last: a later catch-all CPU rule must not shadow a GPU rule.
    for (dev, _, part), layers in sorted(groups.items(), key=lambda kv: (kv[0][0] == CPU, kv[0])):
        out.append(Override(rf"blk\.{layers_regex(layers)}\.{part}", dev, "export"))
    out += [Override(_exact(t), dev, "export") for dev, t in singles]
    return out


def exact_overrides(model: Model, base: Mapping[str, str | None],
                    target: Mapping[str, str | None]) -> list[Override]:
    """One exact pattern per tensor whose device differs from the base: no group, so no rule
    sends a tensor to the CPU unless the target itself puts it there."""
    return [Override(_exact(t), dev, "export") for dev, t in _differing(model, base, target)]


def _differing(model: Model, base: Mapping[str, str | None],
               target: Mapping[str, str | None]) -> list[tuple[str, Tensor]]:
    """(wanted device, tensor) of every tensor, in the model's order, whose target device differs from
    the base or whose tied output copy's does (a copy moves with its tensor: -ot matches both)."""
    if base == target:  # every tensor and copy where wanted (one comparison of the maps, not a scan)
        return []
    out = []
    tget, bget = target.get, base.get
    for t in model.tensors:
        name = t.name
        want = tget(name)
        if want is None:
            continue
        if want == bget(name):
            copy = name + COPY_SUFFIX
            if tget(copy) == bget(copy):
                continue
        out.append((want, t))
    return out


def fit_overrides(
    model: Model,
    base: Mapping[str, str | None],
    target: Mapping[str, str | None],
    place_with: Callable[[list[Override]], Mapping[str, str | None]],
    candidates: list[Override] | None = None,
) -> list[Override]:
    """Overrides that reproduce ``target``; ``place_with(overrides)`` runs placement with them.
    ``candidates``: ``candidate_overrides(model, base, target)``, when already made.  The result
    starts with them: they are what it adds exact patterns to (never shorter)."""
    ovs = candidate_overrides(model, base, target) if candidates is None else candidates
    for _ in range(3):
        got = place_with(ovs)
        if got == target:  # every tensor (and tied copy) where wanted: what the check below finds
            return ovs
        wrong = [t for t in model.tensors
                 if got.get(t.name) != target.get(t.name)
                 or got.get(t.name + COPY_SUFFIX) != target.get(t.name + COPY_SUFFIX)]
        if not wrong:
            return ovs
        fixes = [Override(_exact(t), target[t.name] or CPU, "export") for t in wrong
                 if target.get(t.name) is not None]
        ovs = fixes + ovs
    return ovs
