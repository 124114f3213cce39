"""The fastest-plan search's own candidates: routed experts moved onto the GPUs, whole layers, then
single expert tensors, and blocks of layers where it may choose the layer split (:mod:`.layout`)."""

from __future__ import annotations

from dataclasses import replace

from offload_planner.core.memory import alloc_size, pad
from offload_planner.core.placement import CPU, Placed
from offload_planner.core.plan import Plan
from offload_planner.core.roles import Role
from offload_planner.core.speed.candidate import Candidate, margin_of, room
from offload_planner.core.speed.evaluator import Evaluator, _key
from offload_planner.core.speed.layout import (
    LayerCost,
    Speeds,
    best_layout,
    budgets,
    layer_costs,
    may_split,
    speeds,
    weighted,
)
from offload_planner.core.speed.ranking import score
from offload_planner.core.speed.speculation import step_reads
from offload_planner.core.speed.variants import _describe, variant

#: bytes a GPU that takes the layout's single expert tensors keeps free by the prediction, per token
#: of -ub (at least 128 MiB): its compute buffers are predicted from another layer split's (Kimi-K2
#: on four 24 GiB cards at -ub 4096: a card's compute buffer predicted 1872 MiB, projected 2272 MiB)
PART_SLACK_PER_UB = 128 * 1024
PART_SLACK_MIN = 128 * 1024**2


class Fills(Evaluator):
    """Our plan: the fills of a start (every free routed expert on the CPU) onto the GPUs."""

    def expert_layers(self, plan: Plan) -> dict[int, list[str]]:
        """Per MoE layer, the routed-expert tensors now on the CPU that the user did not pin."""
        return self.expert_layers_any(plan, on=CPU)

    def expert_layers_any(self, plan: Plan, on: str | None = None) -> dict[int, list[str]]:
        """Per MoE layer, the routed-expert tensors (on device ``on``, or anywhere) that neither an
        -ot rule of the user nor a move of theirs pins; with MTP, the NextN block's experts too."""
        out: dict[int, list[str]] = {}
        for p in plan.placement().items:
            t = p.tensor
            if (p.device is not None and (on is None or p.device == on) and _routed(p)
                    and t.layer is not None and not p.copy and not p.rule.startswith("-ot ")
                    and t.name not in self.moves and plan.movable(t.name)[0]):
                out.setdefault(t.layer, []).append(t.name)
        return out

    def gpu_order(self, own: str) -> list[str]:
        """The GPUs for a layer whose device is ``own``: that one (no extra graph split), then the
        others by their memory bandwidth."""
        gpus = sorted(self.offload_gpus, key=lambda g: -self.hw[g].bandwidth.value)
        return [own] * (own != CPU) + [g for g in gpus if g != own]

    def fill(self, start: Candidate) -> list[Candidate]:
        """Whole expert layers onto the GPUs, then the same with single expert tensors added where
        a whole layer no longer fits (more bytes off the CPU, at the cost of graph splits); where the
        search may choose the layer split, the same in blocks of whole layers (:meth:`fill_blocks`)."""
        whole, moves = self.fill_layers(start)
        split = self.fill_tensors(whole, start.plan, moves)
        return [whole] + ([] if split is None else [split]) + self.fill_blocks(start)

    def fill_blocks(self, start: Candidate) -> list[Candidate]:
        """The layer split chosen with the experts (:mod:`layout`), then topped up with single expert
        tensors."""
        plan = start.plan
        free = self.expert_layers(plan)
        if not free or not may_split(plan):
            return []
        # the same for every -ub (the KV cache's types, and sliding-window caches' cells, aside)
        key = (variant(plan)[1:], plan.context.n_ubatch if plan.model.summary.has_swa else 0)
        layers = self._layers.get(key)
        if layers is None:
            layers = self._layers[key] = layer_costs(plan, start.projection, free)
        margins = {g.name: margin_of(g) for g in self.offload.gpus}
        budget = budgets(plan, start.projection, layers, self.offload, margins)
        sp = speeds(plan, self.hw, self.eff)
        out: list[Candidate] = []
        slack = max(PART_SLACK_MIN, PART_SLACK_PER_UB * plan.context.n_ubatch)
        runs: list[tuple[list[LayerCost], int | None, str]] = [(layers, None, ""), (layers, slack, "")]
        reads = step_reads(plan)
        if reads is not None:  # the layout of a speculative step: its reads of the experts weighed
            runs.append((weighted(layers, reads), slack, ", speculative"))
        for costs, packed, tag in runs:  # whole layers, then packed with parts
            got = self._blocks(plan, costs, list(budget), sp, packed, tag)
            if got is None or any(_key(got[0].plan) == _key(c.plan) for c in out):
                continue
            c, p, moves = got
            split = self.fill_tensors(c, p, moves)
            out += [c] + ([] if split is None else [split])
        return out

    def _blocks(self, plan: Plan, layers: list[LayerCost], budget: list[int], sp: Speeds,
                slack: int | None, tag: str = "") -> tuple[Candidate, Plan, dict[str, str]] | None:
        """The block layout of ``layers`` in ``budget``, projected; a GPU over its limit loses what it
        is over from its budget and the layout is made again (three tries).  ``slack``: packed with
        parts (:func:`best_layout`), and a GPU that takes parts must keep ``slack`` bytes free by the
        prediction (its compute buffers are another split's: the prediction may be short)."""
        gpus = self.offload_gpus
        how = "own -ts" if len(gpus) > 1 else "small layers first"
        how += (", parts" if slack is not None else "") + tag
        label = f"fastest ({_describe(variant(plan))}, {how})"
        for _ in range(3):
            lay = best_layout(layers, budget, sp, slack)
            if lay is None:
                return None
            ts = tuple(float(n) for n in lay.units) if len(gpus) > 1 else ()
            p = replace(plan, placement_options=replace(plan.placement_options, tensor_split=ts))
            moves = lay.moves(layers, gpus)
            c = self.candidate(label, p.with_moves(moves))
            left = room(c.projection, self.offload)
            keep = {g: (slack or 0) if any(moves[x] == g for x in lay.parts) else 0 for g in gpus}
            short = [g for g in gpus if g in left and left[g] < keep[g]]
            if not short:
                return c, p, moves
            used = lay.used(layers) if slack is not None else None
            for g in short:
                i = gpus.index(g)
                # packed: below what the layout used there (its room may be what it misjudged)
                budget[i] = (budget[i] if used is None else min(budget[i], used[i])) + left[g] - keep[g]
        return None

    def fill_layers(self, start: Candidate) -> tuple[Candidate, dict[str, str]]:
        plan = start.plan
        placement = start.projection.placement
        left = room(start.projection, self.offload)
        assigned: dict[str, list[int]] = {}
        layers = self.expert_layers(plan)
        moves: dict[str, str] = {}
        # an MTP head's experts first (every draft pass reads them: n one-token passes and a batch a
        # step), then the layers with the most expert bytes (quant mixes give some layers more bits),
        # then the rest in layer order as room allows: as many bytes off the CPU as fit
        size = {il: sum(self.model.tensor(n).nbytes for n in names) for il, names in layers.items()}
        trunk = self.model.summary.n_layer_trunk
        for il in sorted(layers, key=lambda i: (i < trunk, -size[i], i)):
            for g in self.gpu_order(placement.layer_device(il)):
                if g not in left:
                    continue
                dev = self.devices.by_name(g)
                assert dev is not None
                cost = sum(pad(alloc_size(self.model.tensor(n), dev), dev.alignment) for n in layers[il])
                if cost <= left[g]:
                    left[g] -= cost
                    moves.update(dict.fromkeys(layers[il], g))
                    assigned.setdefault(g, []).append(il)
                    break
        label = f"fastest ({_describe(variant(plan))})"
        cand = self.candidate(label, plan.with_moves(moves))
        while cand.over:  # the compute buffers moved: take layers back from the devices over
            for g in cand.over:
                if assigned.get(g):
                    il = assigned[g].pop()
                    for n in layers[il]:
                        moves.pop(n, None)
                else:
                    return cand, moves
            cand = self.candidate(label, plan.with_moves(moves))
        return self.top_up(cand, plan, layers, moves, label)

    def fill_tensors(self, cand: Candidate, plan: Plan, moves: dict[str, str]) -> Candidate | None:
        """Single expert tensors (largest first) into the room each GPU has left, on their layer's
        own GPU where it has room (no extra graph split); None when none fits."""
        left = room(cand.projection, self.offload)
        placement = cand.plan.placement()
        rest = sorted(((n, il) for il, names in self.expert_layers(plan).items() for n in names
                       if n not in moves), key=lambda p: -self.model.tensor(p[0]).nbytes)
        added: dict[str, list[str]] = {}
        trial = dict(moves)
        for n, il in rest:  # the layer's own GPU first (no extra graph split), then by room left
            own = placement.layer_device(il)
            for g in sorted(left, key=lambda d: (d != own, -left[d])):
                dev = self.devices.by_name(g)
                assert dev is not None
                cost = pad(alloc_size(self.model.tensor(n), dev), dev.alignment)
                if cost <= left[g]:
                    left[g] -= cost
                    trial[n] = g
                    added.setdefault(g, []).append(n)
                    break
        label = cand.label.removesuffix(")") + ", split layers)"
        if not added:
            return None
        c = self.candidate(label, plan.with_moves(trial))
        for _ in range(3):
            if not c.over:
                return c
            for g in c.over:
                if added.get(g):
                    trial.pop(added[g].pop())
            c = self.candidate(label, plan.with_moves(trial))
        return c

    def top_up(self, cand: Candidate, plan: Plan, layers: dict[int, list[str]], moves: dict[str, str],
               label: str) -> tuple[Candidate, dict[str, str]]:
        """Add the next layers one at a time to the GPU with the most room left while they fit (the
        estimate of each layer's cost leaves slack for compute buffers that may not be needed)."""
        for _ in range(len(layers)):
            rest = [il for il in sorted(layers) if layers[il][0] not in moves]
            left = room(cand.projection, self.offload)
            if not rest or not left:
                return cand, moves
            g = max(left, key=lambda n: left[n])
            trial = dict(moves)
            trial.update(dict.fromkeys(layers[rest[0]], g))
            c = self.candidate(label, plan.with_moves(trial))
            if c.over:
                return cand, moves
            cand, moves = c, trial
        return cand, moves

    def seeded(self, baselines: list[Candidate], goal: str) -> list[Candidate]:
        """The fastest baseline that fits and moved experts (not ``--cpu-moe``) with single expert
        tensors added into the room it leaves on the GPUs (:meth:`fill_tensors`; its own rules stay,
        the experts they put on the CPU are free): where one fits, faster than that baseline."""
        pool = [c for c in baselines if c.fits and c.label != "--cpu-moe"]
        if not pool:
            return []
        b = max(pool, key=lambda c: score(c.estimate, goal))
        c = self.fill_tensors(replace(b, label=f"fastest (from {b.label})"), b.plan, {})
        return [] if c is None else [c]


def _routed(p: Placed) -> bool:
    """A routed expert that runs: the trunk's, or an MTP head's (NextN blocks are placed only when
    MTP loads them)."""
    t = p.tensor
    return t.role.is_routed_expert or (t.role is Role.NEXTN and "_exps" in t.name)
