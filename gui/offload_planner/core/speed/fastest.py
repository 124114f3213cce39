"""The fastest plan that fits: routed experts moved onto the GPUs layer by layer, beside the baselines
users run today (``--cpu-moe``, the best ``--n-cpu-moe N``, llama.cpp's own ``--fit``).

Start from the user's command with every routed expert on the CPU (``--cpu-moe`` appended, so the
user's ``-ot`` rules, which come first, still win, as do the window's moves): always-active tensors
and the KV cache stay where the command puts them (on the GPUs with ``-ngl`` all).  Then each MoE
layer's experts go to the GPU that holds the layer if it has room (no extra graph split), else to
the fastest GPU with room; layers with more expert bytes (a quant mix gives some layers more bits)
go first, then the others in layer order, so that as many bytes as fit leave the CPU.  Room is the
capacity minus the device's margin (1 GiB by default, as in the window) minus what the projection
puts there; the result is projected again and
layers are taken back from any GPU over its limit.  For the ``pp`` and ``balanced`` goals larger
``-ub`` values are tried too (a larger compute buffer against faster prompt processing).  The answer
is the candidate with the best score that fits, baselines included, so it is never slower in
estimate than a baseline that fits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from offload_planner.core.devices import Device, DeviceSet
from offload_planner.core.dialects.base import Dialect
from offload_planner.core.memory import Projection, alloc_size, pad
from offload_planner.core.model import Model
from offload_planner.core.placement import CPU
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.speed.efficiency import Efficiencies, defaults_for
from offload_planner.core.speed.estimate import DEFAULT_PROMPT, SpeedEstimate, estimate
from offload_planner.core.speed.hardware import Hardware
from offload_planner.core.units import GiB

DEFAULT_MARGIN = 1 * GiB  # the window's default margin on every GPU
BALANCED_ANSWER = 512  # tokens generated per request in the balanced score
GOALS = ("tg", "pp", "balanced")
PP_UBATCHES = (2048, 4096)  # -ub tried beyond the command's for the pp and balanced goals


@dataclass
class Candidate:
    label: str
    plan: Plan
    projection: Projection
    estimate: SpeedEstimate
    over: list[str] = field(default_factory=list)  # devices over their limit

    @property
    def fits(self) -> bool:
        return not self.over


@dataclass
class FastestResult:
    best: Candidate | None  # None: nothing fits
    candidates: list[Candidate]  # ours first, then the baselines
    goal: str
    projections: int = 0
    notes: list[str] = field(default_factory=list)


def margin_of(dev: Device) -> int:
    return dev.margin if dev.margin else (DEFAULT_MARGIN if dev.is_gpu else 0)


def room(projection: Projection, devices: DeviceSet) -> dict[str, int]:
    """Bytes each GPU can still take: capacity - margin - what the projection puts there."""
    out = {}
    for g in devices.gpus:
        if g.capacity is not None:
            out[g.name] = g.capacity - margin_of(g) - projection.device(g.name).resident()
    return out


def score(est: SpeedEstimate, goal: str) -> float:
    """Higher is better: tokens/s for tg or pp; for balanced, requests per second of a prompt of
    ``est.prompt`` tokens and an answer of :data:`BALANCED_ANSWER` tokens."""
    if goal == "tg":
        return est.tg_tps
    if goal == "pp":
        return est.pp_tps
    return 1.0 / (est.prompt / est.pp_tps + BALANCED_ANSWER / est.tg_tps)


class _Search:
    def __init__(self, model: Model, devices: DeviceSet, base_args: Sequence[str], dialect: Dialect,
                 parse: Callable[[list[str]], Any], hw: Hardware, eff: Efficiencies, prompt: int,
                 moves: dict[str, str]) -> None:
        self.model, self.devices, self.base_args = model, devices, list(base_args)
        self.dialect = Dialect(dialect)
        self.parse, self.hw, self.eff, self.prompt, self.moves = parse, hw, eff, prompt, moves
        self.projections = 0
        self._seen: dict[tuple[object, ...], Candidate] = {}

    def plan(self, extra: Sequence[str]) -> Plan:
        p = plan_from_args(self.model, self.devices, self.parse([*self.base_args, *extra]), self.dialect)
        return p.with_moves(self.moves) if self.moves else p

    def candidate(self, label: str, plan: Plan) -> Candidate:
        key = (tuple(sorted(plan.moves.items())), plan.placement_options, plan.context)
        seen = self._seen.get(key)
        if seen is not None:  # the same plan reached another way (--cpu-moe as a start and a baseline)
            return replace(seen, label=label)
        proj = plan.projection()
        self.projections += 1
        over = [n for n, left in room(proj, self.devices).items() if left < 0]
        c = Candidate(label, plan, proj, estimate(plan, self.hw, prompt=self.prompt, eff=self.eff,
                                                  placement=proj.placement), over)
        self._seen[key] = c
        return c

    # --- our plan ------------------------------------------------------------------------------

    def expert_layers(self, plan: Plan) -> dict[int, list[str]]:
        """Per MoE layer, the routed-expert tensors now on the CPU that the user did not pin."""
        return self.expert_layers_any(plan, on=CPU)

    def expert_layers_any(self, plan: Plan, on: str | None = None) -> dict[int, list[str]]:
        """Per MoE layer, the routed-expert tensors (on device ``on``, or anywhere) that neither an
        -ot rule of the user nor a move of theirs pins."""
        out: dict[int, list[str]] = {}
        for p in plan.placement().items:
            t = p.tensor
            if (p.device is not None and (on is None or p.device == on) and t.role.is_routed_expert
                    and t.layer is not None and not p.copy and not p.rule.startswith("-ot ")
                    and t.name not in self.moves and plan.movable(t.name)[0]):
                out.setdefault(t.layer, []).append(t.name)
        return out

    def gpu_order(self, plan: Plan, il: int) -> list[str]:
        gpus = sorted(self.devices.gpus, key=lambda g: -self.hw[g.name].bandwidth.value)
        own = plan.placement().layer_device(il)
        return [own] * (own != CPU) + [g.name for g in gpus if g.name != own]

    def fill(self, start: Candidate) -> list[Candidate]:
        """Whole expert layers onto the GPUs, then the same with single expert tensors added where
        a whole layer no longer fits (more bytes off the CPU, at the cost of graph splits)."""
        whole, moves = self.fill_layers(start)
        split = self.fill_tensors(whole, start.plan, moves)
        return [whole] if split is None else [whole, split]

    def fill_layers(self, start: Candidate) -> tuple[Candidate, dict[str, str]]:
        plan = start.plan
        left = room(start.projection, self.devices)
        assigned: dict[str, list[int]] = {}
        layers = self.expert_layers(plan)
        moves: dict[str, str] = {}
        # the layers with the most expert bytes first (quant mixes give some layers more bits),
        # then the rest in layer order as room allows: as many bytes off the CPU as fit
        size = {il: sum(self.model.tensor(n).nbytes for n in names) for il, names in layers.items()}
        for il in sorted(layers, key=lambda i: (-size[i], i)):
            for g in self.gpu_order(plan, il):
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
        label = f"fastest (-ub {plan.context.n_ubatch})"
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
        """Single expert tensors (largest first) into the room each GPU has left; None when none
        fits."""
        left = room(cand.projection, self.devices)
        rest = sorted((n for names in self.expert_layers(plan).values() for n in names if n not in moves),
                      key=lambda n: -self.model.tensor(n).nbytes)
        added: dict[str, list[str]] = {}
        trial = dict(moves)
        for n in rest:
            for g in sorted(left, key=lambda d: -left[d]):
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
               label: str, tries: int = 2) -> tuple[Candidate, dict[str, str]]:
        """Add the next layers one at a time to the GPU with the most room left while they fit (the
        estimate of each layer's cost leaves slack for compute buffers that may not be needed)."""
        for _ in range(tries):
            rest = [il for il in sorted(layers) if layers[il][0] not in moves]
            left = room(cand.projection, self.devices)
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

    # --- baselines -------------------------------------------------------------------------------

    def best_n_cpu_moe(self) -> Candidate | None:
        """The smallest ``--n-cpu-moe N`` that fits (fewer expert layers on the CPU is faster): a
        first guess from the bytes each GPU has room for, then projections around it."""
        n_layer = self.model.summary.n_layer

        def at(n: int) -> Candidate:
            return self.candidate(f"--n-cpu-moe {n}", self.plan(["--n-cpu-moe", str(n)]))

        top = at(n_layer)
        if not top.fits:
            return None
        guess = self._n_cpu_moe_guess(top)
        c = at(guess)
        if c.fits:  # walk down while one layer fewer on the CPU still fits
            while guess > 0:
                lower = at(guess - 1)
                if not lower.fits:
                    break
                c, guess = lower, guess - 1
            return c
        lo, hi, best = guess + 1, n_layer, top  # the guess was short: bisect above it
        while lo < hi:
            mid = (lo + hi) // 2
            m = at(mid)
            if m.fits:
                best, hi = m, mid
            else:
                lo = mid + 1
        return best

    def _n_cpu_moe_guess(self, top: Candidate) -> int:
        """The smallest N whose expert layers N.. fit each layer's GPU by the bytes alone."""
        left = room(top.projection, self.devices)
        per_layer: dict[int, tuple[str, int]] = {}
        placement = top.plan.placement()
        for p in placement.items:
            t = p.tensor
            if p.device == CPU and t.role.is_routed_expert and t.layer is not None and not p.copy:
                dev = placement.layer_device(t.layer)
                d = self.devices.by_name(dev)
                if d is None:
                    continue
                size = pad(alloc_size(t, d), d.alignment)
                prev = per_layer.get(t.layer, (dev, 0))[1]
                per_layer[t.layer] = (dev, prev + size)
        n = self.model.summary.n_layer
        for il in sorted(per_layer, reverse=True):  # add layers from the top while they fit
            dev, size = per_layer[il]
            if dev not in left or size > left[dev]:
                break
            left[dev] -= size
            n = il
        return n

    def llama_fit(self) -> Candidate | None:
        if not self.dialect.fits_by_default or not self.devices.gpus:
            return None
        from offload_planner.core.fit import fit_for_args

        parsed = self.parse(self.base_args)
        base = self.plan([])
        # what llama-server finds free; its fit keeps its own 1 GiB target (the default margin here)
        free = [g.capacity or 0 for g in self.devices.gpus]
        result = fit_for_args(self.model, self.devices, parsed, base.placement_options, base.context,
                              free_bytes=free)
        if result is None:
            return None
        popts, ctx = result.apply(base.placement_options, base.context, self.model.summary.n_layer,
                                  has_gpu=True)
        return self.candidate("llama.cpp --fit", replace(base, placement_options=popts, context=ctx))


def fastest_plan(model: Model, devices: DeviceSet, base_args: Sequence[str], hw: Hardware, *,
                 dialect: Dialect = Dialect.LLAMA_CPP, goal: str = "balanced", prompt: int = DEFAULT_PROMPT,
                 eff: Efficiencies | None = None, moves: dict[str, str] | None = None,
                 ubatches: Sequence[int] | None = None) -> FastestResult:
    """The fastest plan for ``goal`` that fits every GPU, and the baselines' candidates."""
    from offload_planner.core.cmdline import parse_server_args

    if goal not in GOALS:
        raise ValueError(f"--goal {goal!r}: expected one of {', '.join(GOALS)}")

    eff = eff or defaults_for(dialect)

    def parse(argv: list[str]) -> Any:
        return parse_server_args(argv, dialect=dialect)

    s = _Search(model, devices, base_args, dialect, parse, hw, eff, prompt, dict(moves or {}))
    notes: list[str] = []
    ours: list[Candidate] = []
    user_ub = s.plan([]).context.n_ubatch
    ubs = list(ubatches) if ubatches is not None else (
        [user_ub] + [u for u in PP_UBATCHES if u > user_ub and goal != "tg"])
    for ub in ubs:
        extra = ["--cpu-moe"] + (["-ub", str(ub), "-b", str(max(ub, s.plan([]).context.n_batch))]
                                 if ub != user_ub else [])
        start = s.candidate(f"--cpu-moe -ub {ub}", s.plan(extra))
        if not start.fits:
            notes.append(f"-ub {ub}: does not fit even with every routed expert on the CPU "
                         f"({', '.join(start.over)} over)")
            continue
        ours.extend(s.fill(start))
    baselines = [c for c in (s.candidate("--cpu-moe", s.plan(["--cpu-moe"])), s.best_n_cpu_moe(),
                             s.llama_fit()) if c is not None]
    fitting = [c for c in ours + baselines if c.fits]
    best = max(fitting, key=lambda c: score(c.estimate, goal)) if fitting else None
    return FastestResult(best, ours + baselines, goal, s.projections, notes)


def fastest_from_plan(plan: Plan, hw: Hardware, *, goal: str = "balanced", prompt: int = DEFAULT_PROMPT,
                      eff: Efficiencies | None = None) -> FastestResult:
    """The window's "Fastest plan": the same search from an open plan (its -ot rules and its moves
    are kept), without the baselines; ``-ub`` may grow for the pp and balanced goals."""
    if goal not in GOALS:
        raise ValueError(f"goal {goal!r}: expected one of {', '.join(GOALS)}")
    eff = eff or defaults_for(plan.dialect)
    s = _Search(plan.model, plan.devices, [], plan.dialect, lambda argv: None, hw, eff, prompt,
                dict(plan.moves))
    ours: list[Candidate] = []
    notes: list[str] = []
    ub0 = plan.context.n_ubatch
    for ub in [ub0] + [u for u in PP_UBATCHES if u > ub0 and goal != "tg"]:
        p = plan if ub == ub0 else replace(plan, context=replace(plan.context, n_ubatch=ub,
                                                                 n_batch=max(ub, plan.context.n_batch)))
        to_cpu = {n: CPU for names in s.expert_layers_any(p).values() for n in names}
        start = s.candidate(f"experts on the CPU, -ub {ub}", p.with_moves(to_cpu))
        if not start.fits:
            notes.append(f"-ub {ub}: does not fit even with every routed expert on the CPU "
                         f"({', '.join(start.over)} over)")
            continue
        ours.extend(s.fill(start))
    fitting = [c for c in ours if c.fits]
    best = max(fitting, key=lambda c: score(c.estimate, goal)) if fitting else None
    return FastestResult(best, ours, goal, s.projections, notes)
