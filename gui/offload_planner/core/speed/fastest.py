"""The fastest plan that fits: routed experts moved onto the GPUs layer by layer, beside the baselines
users run today (``--cpu-moe``, the best ``--n-cpu-moe N``, llama.cpp's own ``--fit``).

Start from the user's command with every routed expert on the CPU (``--cpu-moe`` appended, so the
user's ``-ot`` rules, which come first, still win, as do the window's moves): always-active tensors
and the KV cache stay where the command puts them (on the GPUs with ``-ngl`` all).  Then each MoE
layer's experts go, in layer order, to the GPU that holds the layer if it has room (no extra graph
split), else to the fastest GPU with room.  Room is the capacity minus the device's margin (1 GiB by
default, as in the window) minus what the projection puts there; the result is projected again and
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
from offload_planner.core.memory import Projection, alloc_size, pad
from offload_planner.core.model import Model
from offload_planner.core.placement import CPU
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.speed.efficiency import DEFAULT, Efficiencies
from offload_planner.core.speed.estimate import DEFAULT_PROMPT, SpeedEstimate, estimate
from offload_planner.core.speed.hardware import Hardware

GiB = 1024**3
DEFAULT_MARGIN = 1 * GiB  # the window's default margin on every GPU
BALANCED_ANSWER = 512  # tokens generated per request in the balanced score
GOALS = ("tg", "pp", "balanced")
PP_UBATCHES = (1024, 2048, 4096)


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
    def __init__(self, model: Model, devices: DeviceSet, base_args: Sequence[str], dialect: str,
                 parse: Callable[[list[str]], Any], hw: Hardware, eff: Efficiencies, prompt: int,
                 moves: dict[str, str]) -> None:
        self.model, self.devices, self.base_args, self.dialect = model, devices, list(base_args), dialect
        self.parse, self.hw, self.eff, self.prompt, self.moves = parse, hw, eff, prompt, moves
        self.projections = 0

    def plan(self, extra: Sequence[str]) -> Plan:
        p = plan_from_args(self.model, self.devices, self.parse([*self.base_args, *extra]), self.dialect)
        return p.with_moves(self.moves) if self.moves else p

    def candidate(self, label: str, plan: Plan) -> Candidate:
        proj = plan.projection()
        self.projections += 1
        over = [n for n, left in room(proj, self.devices).items() if left < 0]
        return Candidate(label, plan, proj, estimate(plan, self.hw, prompt=self.prompt, eff=self.eff,
                                                     placement=proj.placement), over)

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

    def fill(self, start: Candidate) -> Candidate:
        plan = start.plan
        left = room(start.projection, self.devices)
        assigned: dict[str, list[int]] = {}
        layers = self.expert_layers(plan)
        moves: dict[str, str] = {}
        for il in sorted(layers):
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
                    return cand
            cand = self.candidate(label, plan.with_moves(moves))
        return self.top_up(cand, plan, layers, moves, label)

    def top_up(self, cand: Candidate, plan: Plan, layers: dict[int, list[str]], moves: dict[str, str],
               label: str, tries: int = 3) -> Candidate:
        """Add the next layers one at a time to the GPU with the most room left while they fit (the
        estimate of each layer's cost leaves slack for compute buffers that may not be needed)."""
        for _ in range(tries):
            rest = [il for il in sorted(layers) if layers[il][0] not in moves]
            left = room(cand.projection, self.devices)
            if not rest or not left:
                return cand
            g = max(left, key=lambda n: left[n])
            trial = dict(moves)
            trial.update(dict.fromkeys(layers[rest[0]], g))
            c = self.candidate(label, plan.with_moves(trial))
            if c.over:
                return cand
            cand, moves = c, trial
        return cand

    # --- baselines -------------------------------------------------------------------------------

    def best_n_cpu_moe(self) -> Candidate | None:
        """The smallest ``--n-cpu-moe N`` that fits (fewer expert layers on the CPU is faster)."""
        n_layer = self.model.summary.n_layer
        lo, hi = 0, n_layer
        top = self.candidate(f"--n-cpu-moe {hi}", self.plan(["--n-cpu-moe", str(hi)]))
        if not top.fits:
            return None
        best = top
        while lo < hi:
            mid = (lo + hi) // 2
            c = self.candidate(f"--n-cpu-moe {mid}", self.plan(["--n-cpu-moe", str(mid)]))
            if c.fits:
                best, hi = c, mid
            else:
                lo = mid + 1
        return best

    def llama_fit(self) -> Candidate | None:
        if self.dialect != "llama.cpp" or not self.devices.gpus:
            return None
        from offload_planner.core.fit import fit_for_args

        parsed = self.parse(self.base_args)
        base = self.plan([])
        free = [max(0, (g.capacity or 0) - margin_of(g)) for g in self.devices.gpus]
        result = fit_for_args(self.model, self.devices, parsed, base.placement_options, base.context,
                              free_bytes=free)
        if result is None:
            return None
        popts, ctx = result.apply(base.placement_options, base.context, self.model.summary.n_layer,
                                  has_gpu=True)
        return self.candidate("llama.cpp --fit", replace(base, placement_options=popts, context=ctx))


def fastest_plan(model: Model, devices: DeviceSet, base_args: Sequence[str], hw: Hardware, *,
                 dialect: str = "llama.cpp", goal: str = "balanced", prompt: int = DEFAULT_PROMPT,
                 eff: Efficiencies = DEFAULT, moves: dict[str, str] | None = None,
                 ubatches: Sequence[int] | None = None) -> FastestResult:
    """The fastest plan for ``goal`` that fits every GPU, and the baselines' candidates."""
    from offload_planner.core.cmdline import parse_server_args

    if goal not in GOALS:
        raise ValueError(f"--goal {goal!r}: expected one of {', '.join(GOALS)}")

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
        ours.append(s.fill(start))
    baselines = [c for c in (s.candidate("--cpu-moe", s.plan(["--cpu-moe"])), s.best_n_cpu_moe(),
                             s.llama_fit()) if c is not None]
    fitting = [c for c in ours + baselines if c.fits]
    best = max(fitting, key=lambda c: score(c.estimate, goal)) if fitting else None
    return FastestResult(best, ours + baselines, goal, s.projections, notes)


def fastest_from_plan(plan: Plan, hw: Hardware, *, goal: str = "balanced", prompt: int = DEFAULT_PROMPT,
                      eff: Efficiencies = DEFAULT) -> FastestResult:
    """The window's "Fastest plan": the same search from an open plan (its -ot rules and its moves
    are kept), without the baselines; ``-ub`` may grow for the pp and balanced goals."""
    if goal not in GOALS:
        raise ValueError(f"goal {goal!r}: expected one of {', '.join(GOALS)}")
    s = _Search(plan.model, plan.devices, [], plan.dialect, lambda argv: None, hw, eff, prompt, dict(plan.moves))
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
        ours.append(s.fill(start))
    fitting = [c for c in ours if c.fits]
    best = max(fitting, key=lambda c: score(c.estimate, goal)) if fitting else None
    return FastestResult(best, ours, goal, s.projections, notes)
