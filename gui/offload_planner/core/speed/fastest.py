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
layers are taken back from any GPU over its limit.  Where the user gave no ``-ts`` (``-sm layer``,
every layer on a GPU) the search also chooses the layer split with the experts (:mod:`layout`: blocks
of layers per GPU, as many whole as fit, for the shortest token), and it tops up the fastest
baseline that fits with single expert tensors in the room that baseline leaves (:meth:`_Search.seeded`).
For the ``pp`` and ``balanced`` goals larger ``-ub`` values are tried too (a larger compute buffer
against faster prompt processing); with the user's permission a q8_0 KV cache and ``-nkvo``.  The answer
is the candidate with the best score that fits, baselines included, so it is never slower in
estimate than a baseline that fits.

Speed: a full projection simulates the compute graph (~0.15 s on DeepSeek-V3); weights, KV cache
and outputs are exact in about a millisecond.  So only the start at the user's ``-ub`` and at the
largest one are projected in full, first (their one-token graph, which does not read ``-ub``, is
simulated once); every other candidate (the fills, the ``--n-cpu-moe`` search,
llama.cpp's ``--fit`` result) is evaluated with those compute buffers (interpolated per buffer
between the two ``-ub`` values), which move little with the experts' devices.  The estimate needs
no compute buffers, so every score is exact.  The best candidate predicted to fit is then projected
in full and taken only if it fits; if not, every prediction is made again with the buffers just
simulated and that ``-ub`` is filled again (at most :data:`MAX_VERIFY` full projections).  A
candidate's speed estimate is made only when it is scored.  Replaying the answer against a reference
recorded at its start costs more than the two plain simulations (recording is 2-3x a simulation).

llama.cpp's ``--fit`` (its port's ~25 dry runs, longer than the search) shares nothing with the
search: the ``fit`` command (``concurrent=True``) runs it in a forked child on a second core
(:mod:`forked`), and while it waits simulates the compute buffers of the candidate it will project
first unless ``--fit``'s beats it (:meth:`_Search.simulate_ahead`).  The result is the same either
way.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from offload_planner.core.buffer import Buffer
from offload_planner.core.compute.buffers import SIMULATION_LOCK, simulate_buffers
from offload_planner.core.compute.simulate import ReserveMemo
from offload_planner.core.devices import Device, DeviceSet
from offload_planner.core.dialects.base import Dialect
from offload_planner.core.memory import Projection, alloc_size, pad, resolve_context
from offload_planner.core.model import Model
from offload_planner.core.placement import CPU, Placed, Placement
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.roles import Role
from offload_planner.core.speed.efficiency import Efficiencies, defaults_for
from offload_planner.core.speed.estimate import DEFAULT_PROMPT, estimate
from offload_planner.core.speed.forked import Forked
from offload_planner.core.speed.hardware import Hardware
from offload_planner.core.speed.layout import (
    LayerCost,
    Speeds,
    best_layout,
    budgets,
    layer_costs,
    may_split,
    speeds,
)
from offload_planner.core.speed.result import SpeedEstimate
from offload_planner.core.speed.speculation import with_speculation
from offload_planner.core.units import GiB

if TYPE_CHECKING:
    from offload_planner.core.fit import FitResult

DEFAULT_MARGIN = 1 * GiB  # the window's default margin on every GPU
BALANCED_ANSWER = 512  # tokens generated per request in the balanced score
GOALS = ("tg", "pp", "balanced")
PP_UBATCHES = (2048, 4096)  # -ub tried beyond the command's for the pp and balanced goals
NEAR_MISS = 512 * 1024**2  # predicted compute buffers were off by < 60 MiB on the bench's models
#: a compute buffer of another layer split larger than the starts' split's by more than this grew with
#: what every split has (the experts' activations at this -ub), not with the split: the starts' split
#: is predicted with it too (on the test's tiny RPC devices splits differ by ~2 MiB; Qwen3-30B on two
#: 8 GiB cards at -ub 4096 grew by ~540 MiB once a GPU held experts)
SPLIT_SHIFT = 64 * 1024**2
MAX_VERIFY = 8  # full projections of candidates predicted to fit before the best verified one is taken
KV_QUANT = "q8_0"  # the KV cache type the search may pick where the user allows it
QUANT_BLOCK = 32  # q8_0's block: flash attention needs head sizes that are multiples of it


@dataclass
class Candidate:
    label: str
    plan: Plan
    projection: Projection
    #: the speed estimate, made when first asked for (:attr:`estimate`; a candidate over its limit
    #: on the way to a fill is never scored) and shared by the candidate's copies
    speed: Callable[[], SpeedEstimate]
    over: list[str] = field(default_factory=list)  # GPUs over their limit
    #: memory from a full projection of this plan; False: its weights, KV and output are exact and
    #: its compute buffers predicted from plans of the same ``-ub`` that were projected in full
    verified: bool = True
    #: bytes over the host's (the CPU's RAM) capacity minus its margin; 0: within it or unknown.
    #: Moving experts to the GPUs only lowers it, so the search fills as if it were not there and
    #: a plan over it is never chosen
    host_over: int = 0

    @property
    def fits(self) -> bool:
        return not self.over and not self.host_over

    @property
    def estimate(self) -> SpeedEstimate:
        return self.speed()


@dataclass
class FastestResult:
    best: Candidate | None  # None: nothing fits; else verified by a full projection
    candidates: list[Candidate]  # ours first, then the baselines
    goal: str
    projections: int = 0  # full projections (compute buffers simulated)
    notes: list[str] = field(default_factory=list)
    evaluations: int = 0  # candidates evaluated with predicted compute buffers
    fit_seconds: float = 0.0  # CPU time of the llama.cpp --fit baseline (its own ~25 dry runs)
    why: str = ""  # when nothing fits: which device is over, by how much, in the closest candidate
    fit_forked: bool = False  # the --fit baseline ran in a child process beside the search


def margin_of(dev: Device) -> int:
    return dev.margin if dev.margin else (DEFAULT_MARGIN if dev.is_gpu else 0)


def room(projection: Projection, devices: DeviceSet) -> dict[str, int]:
    """Bytes each GPU can still take: capacity - margin - what the projection puts there."""
    out = {}
    for g in devices.gpus:
        if g.capacity is not None:
            out[g.name] = g.capacity - margin_of(g) - projection.device(g.name).resident()
    return out


def host_left(projection: Projection, devices: DeviceSet) -> int | None:
    """Bytes the host (the CPU's RAM: declared, else this machine's) can still take after its margin
    (None: capacity unknown); mmap'd weights count the bytes read, as on the memory bars."""
    cpu = devices.cpu
    if cpu.capacity is None:
        return None
    return cpu.capacity - margin_of(cpu) - projection.device(cpu.name).resident()


def over_by(c: Candidate, devices: DeviceSet) -> list[tuple[str, int]]:
    """(device, bytes) each device of ``c`` is over its capacity minus its margin."""
    left = room(c.projection, devices)
    out = [(g, -left[g]) for g in c.over]
    return out + ([(devices.cpu.name, c.host_over)] if c.host_over else [])


def why_nothing_fits(candidates: Sequence[Candidate], devices: DeviceSet) -> str:
    """One sentence: the candidate over by the fewest bytes, each device it is over and by how much."""
    from offload_planner.core.units import fmt_bytes

    over = [(c, over_by(c, devices)) for c in candidates if not c.fits]
    if not over:
        return ""
    c, by = min(over, key=lambda x: (sum(b for _, b in x[1]), not x[0].verified))
    parts = []
    for name, b in by:
        dev = devices.by_name(name)
        assert dev is not None
        margin = margin_of(dev)
        used = c.projection.device(name).resident()
        parts.append(f"{name}{' (RAM)' if not dev.is_gpu else ''} over by {fmt_bytes(b, precision=1)} "
                     f"({fmt_bytes(used, precision=1)} projected"
                     + (f" + {fmt_bytes(margin, precision=1)} margin" if margin else "")
                     + f" > {fmt_bytes(dev.capacity or 0, precision=1)})")
    return (f"{'; '.join(parts)} in the closest plan, {c.label}"
            + ("" if c.verified else " (compute buffers predicted)"))


def score(est: SpeedEstimate, goal: str) -> float:
    """Higher is better: tokens/s for tg or pp; for balanced, requests per second of a prompt of
    ``est.prompt`` tokens and an answer of :data:`BALANCED_ANSWER` tokens."""
    if goal == "tg":
        return est.tg_tps
    if goal == "pp":
        return est.pp_tps
    return 1.0 / (est.prompt / est.pp_tps + BALANCED_ANSWER / est.tg_tps)


def _key(plan: Plan) -> tuple[object, ...]:
    return (tuple(sorted(plan.moves.items())), plan.placement_options, plan.context)


def interpolate(known: dict[int, list[Buffer]], ub: int) -> list[Buffer]:
    """Compute buffers at ``-ub`` from those simulated at other ``-ub`` values of the same kind of
    plan: per buffer, the straight line through the two nearest (activations and masks grow with
    the micro-batch, op offload's weight copies do not); the one known set as it is."""
    if ub in known or len(known) == 1:
        return [replace(b) for b in known.get(ub) or next(iter(known.values()))]
    a, b = sorted(sorted(known, key=lambda u: (abs(u - ub), u))[:2])
    at = {(x.device, x.name): x.bytes for x in known[a]}
    bt = {(x.device, x.name): x.bytes for x in known[b]}
    out = []
    for dev, name in dict.fromkeys([*at, *bt]):
        va, vb = at.get((dev, name), 0), bt.get((dev, name), 0)
        size = max(0, round(va + (vb - va) * (ub - a) / (b - a)))
        out.append(Buffer(dev, name, "compute", size, f"predicted from -ub {a} and {b}"))
    return out


Variant = tuple[int, str, str, bool]  # -ub, K and V cache types, the KV cache on the layers' devices


def variant(plan: Plan) -> Variant:
    c = plan.context
    return c.n_ubatch, c.type_k, c.type_v, c.offload_kqv


def _describe(var: Variant) -> str:
    ub, k, v, on = var
    kv = (f", -ctk {k}" if k != "f16" else "") + (f" -ctv {v}" if v != "f16" else "")
    return f"-ub {ub}{kv}" + ("" if on else ", -nkvo")


def kvo_choices(plan: Plan, allow: bool) -> list[bool]:
    """Where the KV cache goes: the command's; with ``allow`` and the cache on the GPUs, also the
    CPU (``-nkvo``: its memory left to experts, at the cost of the attention's round trips to the
    host, which the estimate counts)."""
    on = plan.context.offload_kqv
    return [on] + ([False] if allow and on and plan.devices.gpus else [])


def kv_choices(plan: Plan, allow: bool) -> list[tuple[str, str]]:
    """The (K, V) cache types to try: the command's; with ``allow`` and an f16 cache in the command,
    also q8_0 where llama.cpp accepts it (``llama_init_from_model``): a quantized V cache needs flash
    attention, K and V of MLA models must have one type, and with flash attention each head's size
    must be a multiple of the type's block (32)."""
    c = plan.context
    out = [(c.type_k, c.type_v)]
    if not allow or (c.type_k, c.type_v) != ("f16", "f16"):
        return out
    s = plan.model.summary
    dims_ok = s.head_dim_k % QUANT_BLOCK == 0 and s.head_dim_v % QUANT_BLOCK == 0
    if c.flash_attn and dims_ok:
        out.append((KV_QUANT, KV_QUANT))
    elif not c.flash_attn and not s.is_mla:
        out.append((KV_QUANT, "f16"))
    return out


def with_kv(plan: Plan, kv: tuple[str, str], offload: bool | None = None) -> Plan:
    """``plan`` with the KV cache types ``kv`` and, unless None, ``offload`` (False: ``-nkvo``)."""
    ctx = replace(plan.context, type_k=kv[0], type_v=kv[1])
    return replace(plan, context=ctx if offload is None else replace(ctx, offload_kqv=offload))


def pick(ours: list[Candidate], baselines: list[Candidate], goal: str) -> Candidate | None:
    """The best-scoring of our candidates that fit and the baselines that fit or are predicted over
    a GPU only (a baseline predicted over is projected in full too if it would win: never slower
    than a baseline that fits; RAM is exact without it); the first of equals."""
    fitting = [c for c in ours if c.fits] + [c for c in baselines
                                             if c.fits or not (c.verified or c.host_over)]
    return max(fitting, key=lambda x: score(x.estimate, goal)) if fitting else None


class _Search:
    """Candidates are first evaluated with their weights, KV and outputs exact and their compute
    buffers predicted (:meth:`cheap`, about a millisecond); only the plan chosen (and any candidate
    that would beat it) is projected in full (:meth:`full`) and chosen only if it then fits."""

    def __init__(self, model: Model, devices: DeviceSet, base_args: Sequence[str], dialect: Dialect,
                 parse: Callable[[list[str]], Any], hw: Hardware, eff: Efficiencies, prompt: int,
                 moves: dict[str, str], accept: float | None = None) -> None:
        self.model, self.devices, self.base_args = model, devices, list(base_args)
        self.accept = accept  # speculative decoding's acceptance (None: the default)
        self.dialect = Dialect(dialect)
        self.parse, self.hw, self.eff, self.prompt, self.moves = parse, hw, eff, prompt, moves
        self.projections = 0
        self.evaluations = 0
        self._seen: dict[tuple[object, ...], Candidate] = {}
        self._compute: dict[int, list[Buffer]] = {}  # per -ub: compute buffers of a full projection
        self._compute_nkvo: dict[int, list[Buffer]] = {}  # the same of plans with -nkvo
        #: the same of plans with other layer splits (layout's -ts) than the starts' (``_home``), the
        #: largest of them and of the starts' per buffer
        self._compute_split: dict[bool, dict[int, list[Buffer]]] = {}
        self._home: tuple[float, ...] | None = None
        self.starts: dict[Variant, Candidate] = {}  # every routed expert the user left free on the CPU
        #: reserves already simulated: the starts at several -ub share their one-token graph
        self._reserves: ReserveMemo = {}
        #: compute simulations made ahead of their full projection (:meth:`simulate_ahead`)
        self._simulated: dict[tuple[object, ...], tuple[Placement, list[Buffer]]] = {}
        self.fit_result: FitResult | None = None  # llama.cpp's --fit on the command (fit_plan)
        self._layers: dict[tuple[object, ...], list[LayerCost]] = {}  # layout.layer_costs per variant

    def plan(self, extra: Sequence[str]) -> Plan:
        p = plan_from_args(self.model, self.devices, self.parse([*self.base_args, *extra]), self.dialect)
        return p.with_moves(self.moves) if self.moves else p

    def _make(self, label: str, plan: Plan, proj: Projection, verified: bool) -> Candidate:
        over = [n for n, left in room(proj, self.devices).items() if left < 0]
        speed = functools.cache(lambda: self.speed(plan, proj))
        host = host_left(proj, self.devices)
        c = Candidate(label, plan, proj, speed, over, verified, max(0, -host) if host is not None else 0)
        self._seen[_key(plan)] = c
        return c

    def speed(self, plan: Plan, proj: Projection) -> SpeedEstimate:
        """The estimate ``plan`` prints: tg with its draft model or MTP where the command has one
        (speculation.with_speculation), so candidates rank by what will run."""
        est = estimate(plan, self.hw, prompt=self.prompt, eff=self.eff, placement=proj.placement)
        return with_speculation(est, plan, self.hw, self.eff, placement=proj.placement, accept=self.accept)

    def full(self, label: str, plan: Plan) -> Candidate:
        """A full projection: the engine's compute simulation, not replayed against a reference (the
        search projects few plans, far apart)."""
        seen = self._seen.get(_key(plan))
        if seen is not None and seen.verified:  # the same plan reached another way
            return replace(seen, label=label)
        ahead = self._simulated.pop(_key(plan), None)
        placement, compute = ahead if ahead is not None else self._simulate(plan)
        proj = plan.projection(placement=placement, compute=compute)
        self.projections += 1
        # per buffer the largest of every plan of this -ub projected so far: a device's compute
        # buffer grows once it holds experts (their activations), so the start alone is short
        ub = plan.context.n_ubatch
        computes = self.computes(plan, own=True)
        home = self.computes(replace(plan, placement_options=replace(
            plan.placement_options, tensor_split=self._home or ())))
        # another split's start from the starts' (never below them: its GPUs hold other layers)
        known = {(b.device, b.name): b for b in computes.get(ub) or home.get(ub, [])}
        # the model context's own (a draft's or MTP's compute is projected again with every plan)
        for b in (b for d in proj.devices for b in d.buffers if b.kind == "compute" and not b.owner):
            k = (b.device, b.name)
            known[k] = b if k not in known or b.bytes > known[k].bytes else known[k]
        computes[ub] = list(known.values())
        if computes is not home and ub in home:  # another split's growth beyond a split's own shifts
            grown = {(x.device, x.name): x for x in home[ub]}
            for k, x in known.items():
                if k in grown and x.bytes > grown[k].bytes + SPLIT_SHIFT:
                    grown[k] = x
            home[ub] = list(grown.values())
        # predictions made with the earlier compute buffers are evaluated again when asked for
        self._seen = {k: c for k, c in self._seen.items() if c.verified}
        return self._make(label, plan, proj, verified=True)

    def _simulate(self, plan: Plan) -> tuple[Placement, list[Buffer]]:
        placement = plan.placement()
        s = self.model.summary
        ctx = resolve_context(plan.context, s.n_ctx_train, s.n_swa)
        # the dialect's own simulator (ik's), else mainline's graph, as memory.project runs them
        compute = plan.context.dialect.compute_buffers(self.model, self.devices, placement, ctx, plan.context)
        if compute is None:
            with SIMULATION_LOCK:  # the graph templates are shared with the window's worker
                compute = simulate_buffers(self.model, self.devices, placement, ctx, plan.context,
                                           incremental=False, memo=self._reserves)
        return placement, compute

    def simulate_ahead(self, c: Candidate | None) -> None:
        """The compute simulation of a predicted candidate :meth:`full` is likely to be asked for,
        made while the search waits for llama.cpp's ``--fit``; :meth:`full` takes it then, at the
        same point of the search as before (the simulation reads nothing the search changes)."""
        if c is not None and not c.verified and _key(c.plan) not in self._simulated:
            self._simulated[_key(c.plan)] = self._simulate(c.plan)

    def cheap(self, label: str, plan: Plan, fresh: bool = False) -> Candidate:
        seen = self._seen.get(_key(plan))
        if seen is not None and (seen.verified or not fresh):
            return replace(seen, label=label)
        proj = plan.projection(compute=interpolate(self.computes(plan), plan.context.n_ubatch))
        self.evaluations += 1
        return self._make(label, plan, proj, verified=False)

    def candidate(self, label: str, plan: Plan) -> Candidate:
        return self.cheap(label, plan) if self.computes(plan) else self.full(label, plan)

    def computes(self, plan: Plan, own: bool = False) -> dict[int, list[Buffer]]:
        """The compute buffers ``plan``'s are predicted from: of plans with the KV cache where it is
        (-nkvo moves the attention's buffers to the host) and of the starts' layer split, or for
        another split (:mod:`layout`'s) the largest of those and of the other splits projected in
        full at its ``-ub``, where there are some (another split changes every GPU's buffers: on a
        tiny model by more than the experts it moves; pooled with the starts' they made every
        prediction of the starts' split too large).  ``own``: the dict a full projection adds to."""
        on, split = plan.context.offload_kqv, plan.placement_options.tensor_split
        if self._home is None:
            self._home = split  # the starts', projected first
        home = self._compute if on else self._compute_nkvo
        if split == self._home:
            return home
        if own:
            return self._compute_split.setdefault(on, {})
        other = self._compute_split.get(on, {})
        return other if plan.context.n_ubatch in other else home

    def ours(self, starts: dict[Variant, Plan], notes: list[str], label: str) -> list[Candidate]:
        """Per variant (``-ub`` and KV cache types; the user's first), the fill from every free routed
        expert on the CPU.  First the starts of the user's KV types at the user's and the largest
        ``-ub`` are projected in full; every other start and every fill is predicted from those."""
        out: list[Candidate] = []
        first = next(iter(starts))
        exact = []
        for on in dict.fromkeys(v[3] for v in starts):  # the KV cache where it is, and with -nkvo
            f = next(v for v in starts if v[3] == on and v[1:3] == first[1:3])
            exact += [f, max((v for v in starts if v[1:] == f[1:]), key=lambda v: v[0])]
        for var in dict.fromkeys(exact):
            self.full(f"{label}, {_describe(var)}", starts[var])
        for var, plan in starts.items():
            lab = f"{label}, {_describe(var)}"
            start = self.cheap(lab, plan)  # the exact ones: as projected
            self.starts[var] = start
            if start.over:  # the GPUs (the host gains room as experts leave it)
                how = ("even with every routed expert on the CPU" if self.model.summary.n_expert
                       else "with the command's layers on the GPUs")
                notes.append(f"{_describe(var)}: does not fit {how} "
                             f"({', '.join(start.over)} over"
                             + ("" if start.verified else ", predicted") + ")")
                continue
            out.extend(self.fill(start))
        return out

    def choose(self, ours: list[Candidate], baselines: list[Candidate], goal: str) -> Candidate | None:
        """The best-scoring candidate that fits by a full projection: the best predicted one is
        projected in full; if it is over after all, its ``-ub`` is filled again with the compute
        buffers just simulated (once per variant and layer split) and its experts are taken back by
        what it is over."""
        refilled: set[tuple[Variant, tuple[float, ...]]] = set()  # per layer split: its own buffers
        for _ in range(MAX_VERIFY):
            c = pick(ours, baselines, goal)
            if c is None:
                return None
            if c.verified:
                return c
            is_ours = any(x is c for x in ours)
            v = self.full(c.label, c.plan)
            for lst in (ours, baselines):
                lst[:] = [v if x is c else x for x in lst]
            if v.fits:
                return v
            # over after all: every prediction again with the compute buffers just simulated
            for lst in (ours, baselines):
                lst[:] = [x if x.verified else self.cheap(x.label, x.plan, fresh=True) for x in lst]
            var = variant(c.plan)
            split = (var, c.plan.placement_options.tensor_split)
            again: list[Candidate] = []
            if is_ours and split not in refilled and var in self.starts:
                refilled.add(split)
                st = self.starts[var]
                again = self.fill(st if st.verified else self.cheap(st.label, st.plan, fresh=True))
            fixed = self.take_back(v) if is_ours else None
            again += [fixed] if fixed is not None else []
            ours.extend(x for x in again if all(_key(x.plan) != _key(y.plan) for y in ours))
        done = [c for c in ours + baselines if c.verified and c.fits]
        return max(done, key=lambda x: score(x.estimate, goal)) if done else None

    def take_back(self, over: Candidate) -> Candidate | None:
        """``over`` (projected in full, over on some GPUs) with routed experts the search moved to
        each such GPU sent back to the CPU, highest layers first, until the bytes sent back cover
        what the projection puts over the limit; None when the search moved nothing there."""
        left = room(over.projection, self.devices)
        moves = dict(over.plan.moves)
        changed = False
        for g in over.over:
            dev = self.devices.by_name(g)
            assert dev is not None
            ours = sorted((n for n, d in moves.items() if d == g and n not in self.moves),
                          key=lambda n: (-(self.model.tensor(n).layer or 0), n))
            freed = 0
            for n in ours:
                if freed >= -left[g]:
                    break
                moves[n] = CPU
                freed += pad(alloc_size(self.model.tensor(n), dev), dev.alignment)
                changed = True
        return self.cheap(over.label, replace(over.plan, moves=moves)) if changed else None

    # --- our plan ------------------------------------------------------------------------------

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
        gpus = sorted(self.devices.gpus, key=lambda g: -self.hw[g.name].bandwidth.value)
        return [own] * (own != CPU) + [g.name for g in gpus if g.name != own]

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
        margins = {g.name: margin_of(g) for g in self.devices.gpus}
        budget = budgets(plan, start.projection, layers, self.devices, margins)
        got = self._blocks(plan, layers, budget, speeds(plan, self.hw, self.eff))
        if got is None:
            return []
        c, p, moves = got
        split = self.fill_tensors(c, p, moves)
        return [c] + ([] if split is None else [split])

    def _blocks(self, plan: Plan, layers: list[LayerCost], budget: list[int],
                sp: Speeds) -> tuple[Candidate, Plan, dict[str, str]] | None:
        """The block layout of ``layers`` in ``budget``, projected; a GPU over its limit loses what it
        is over from its budget and the layout is made again (three tries)."""
        gpus = [g.name for g in self.devices.gpus]
        how = "own -ts" if len(gpus) > 1 else "small layers first"
        label = f"fastest ({_describe(variant(plan))}, {how})"
        for _ in range(3):
            lay = best_layout(layers, budget, sp)
            if lay is None:
                return None
            ts = tuple(float(n) for n in lay.units) if len(gpus) > 1 else ()
            p = replace(plan, placement_options=replace(plan.placement_options, tensor_split=ts))
            moves = lay.moves(layers, gpus)
            c = self.candidate(label, p.with_moves(moves))
            if not c.over:
                return c, p, moves
            left = room(c.projection, self.devices)
            for g in c.over:
                budget[gpus.index(g)] += left[g]
        return None

    def fill_layers(self, start: Candidate) -> tuple[Candidate, dict[str, str]]:
        plan = start.plan
        placement = start.projection.placement
        left = room(start.projection, self.devices)
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
        left = room(cand.projection, self.devices)
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

    # --- baselines -------------------------------------------------------------------------------

    def _ncm(self, n: int, full: bool = False) -> Candidate:
        plan = self.plan(["--n-cpu-moe", str(n)])
        return (self.full if full else self.candidate)(f"--n-cpu-moe {n}", plan)

    def n_cpu_moe_predicted(self) -> tuple[Candidate | None, Candidate | None]:
        """The smallest ``--n-cpu-moe N`` predicted to fit (fewer expert layers on the CPU is
        faster: a first guess from the bytes each GPU has room for, then the predictions around it),
        and N - 1 when it is predicted over by less than a prediction may be wrong."""
        n_layer = self.model.summary.n_layer
        top = self._ncm(n_layer)
        if top.over:
            return None, None
        n = self._n_cpu_moe_guess(top)
        # by the GPUs alone (monotonic in N; fewer layers on the CPU only lower the host's bytes)
        if not self._ncm(n).over:  # walk down while one layer fewer on the CPU still fits
            while n > 0 and not self._ncm(n - 1).over:
                n -= 1
        else:  # the guess was short: bisect above it
            lo, hi = n + 1, n_layer
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if not self._ncm(mid).over else (mid + 1, hi)
            n = hi
        lower = self._ncm(n - 1) if n > 0 else None
        return self._ncm(n), (lower if lower is not None and self.near_miss(lower) else None)

    def best_n_cpu_moe(self, n: int) -> Candidate | None:
        """From the predicted N: the smallest N that fits by a full projection (N - 1 projected
        too when its prediction missed by little)."""
        n_layer = self.model.summary.n_layer
        c = self._ncm(n, full=True)
        while c.over and n < n_layer:  # predicted to fit, over after all
            n += 1
            c = self._ncm(n, full=True)
        while n > 0 and self.near_miss(self._ncm(n - 1)):
            lower = self._ncm(n - 1, full=True)
            if lower.over:
                break
            c, n = lower, n - 1
        return c if c.fits else None

    def near_miss(self, c: Candidate) -> bool:
        """Predicted over, by less than a prediction of the compute buffers may be wrong."""
        if c.verified or not c.over:
            return False
        left = room(c.projection, self.devices)
        return all(-left[g] < NEAR_MISS for g in c.over)

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

    @property
    def fits_by_default(self) -> bool:
        """llama-server runs its ``--fit`` on this command (the dialect's default, a GPU to fit)."""
        return self.dialect.fits_by_default and bool(self.devices.gpus)

    def llama_fit_result(self) -> FitResult | None:
        """What llama-server's own ``--fit`` makes of the command, its port's search (its dry runs),
        applied by :meth:`fit_plan` (None: it does not fit by default, or there is no GPU)."""
        if not self.fits_by_default:
            return None
        from offload_planner.core.fit import fit_for_args

        parsed = self.parse(self.base_args)
        base = self.plan([])
        # what llama-server finds free; its fit keeps its own 1 GiB target (the default margin here)
        free = [g.capacity or 0 for g in self.devices.gpus]
        return fit_for_args(self.model, self.devices, parsed, base.placement_options, base.context,
                            free_bytes=free)

    def fit_plan(self, result: FitResult | None) -> Plan | None:
        if result is None:
            return None
        base = self.plan([])
        popts, ctx = result.apply(base.placement_options, base.context, self.model.summary.n_layer,
                                  has_gpu=True)
        self.fit_result = result
        return replace(base, placement_options=popts, context=ctx)

    def llama_fit_candidate(self, plan: Plan) -> tuple[Candidate, list[str]]:
        """The ``--fit`` baseline.  Where the fitted server's MTP context can take more than the fit
        counted (:func:`~offload_planner.core.fit_extra.may_fall_short`) it is projected in full (its
        memory exact, not predicted) and, where llama.cpp's own fit then leaves a device short of its
        margin (:func:`~offload_planner.core.fit_extra.extra_shortfalls`), a note names the device
        and the MiB; the row is then over, never a fitting baseline."""
        from offload_planner.core.fit_extra import extra_shortfalls, may_fall_short

        result = self.fit_result
        if result is None or not may_fall_short(result, plan.spec):
            return self.candidate("llama.cpp --fit", plan), []

        proj = plan.projection()  # kept out of the predictions' compute buffers (self._compute)
        self.projections += 1
        c = self._make("llama.cpp --fit", plan, proj, verified=True)
        free = {g.name: g.capacity or 0 for g in self.devices.gpus}
        return c, [sf.message() for sf in extra_shortfalls(result, proj, free)]


def _routed(p: Placed) -> bool:
    """A routed expert that runs: the trunk's, or an MTP head's (NextN blocks are placed only when
    MTP loads them)."""
    t = p.tensor
    return t.role.is_routed_expert or (t.role is Role.NEXTN and "_exps" in t.name)


def _ubatches(user_ub: int, goal: str) -> list[int]:
    return [user_ub] + [u for u in PP_UBATCHES if u > user_ub and goal != "tg"]


def fastest_plan(model: Model, devices: DeviceSet, base_args: Sequence[str], hw: Hardware, *,
                 dialect: Dialect = Dialect.LLAMA_CPP, goal: str = "balanced", prompt: int = DEFAULT_PROMPT,
                 eff: Efficiencies | None = None, moves: dict[str, str] | None = None,
                 ubatches: Sequence[int] | None = None, allow_kv_quant: bool = False,
                 accept: float | None = None, concurrent: bool = False,
                 allow_nkvo: bool = False) -> FastestResult:
    """The fastest plan for ``goal`` that fits every GPU, and the baselines' candidates (their
    memory predicted unless they were projected in full: ``Candidate.verified``).
    ``allow_kv_quant``: the KV cache may become q8_0 (:func:`kv_choices`); else its types are kept.
    ``allow_nkvo``: the KV cache may go to the CPU (:func:`kvo_choices`); else it stays where it is.
    Candidates rank by the estimate ``plan`` prints: with the command's draft model or MTP at
    acceptance ``accept`` (None: the default).
    ``concurrent``: llama.cpp's ``--fit`` runs in a forked child beside the search where that is
    safe and a second core can take it (:mod:`forked`; the command line's choice, not a library
    caller's, which may hold threads or locks); the result is the same."""
    from offload_planner.core.cmdline import parse_server_args

    if goal not in GOALS:
        raise ValueError(f"--goal {goal!r}: expected one of {', '.join(GOALS)}")

    eff = eff or defaults_for(dialect)

    def parse(argv: list[str]) -> Any:
        return parse_server_args(argv, dialect=dialect)

    s = _Search(model, devices, base_args, dialect, parse, hw, eff, prompt, dict(moves or {}), accept)
    notes: list[str] = []
    user = s.plan([])
    # a dense model (no routed experts): no --cpu-moe / --n-cpu-moe; the search keeps the command's
    # layers and tries -ub (and the KV cache's choices) beside llama.cpp's --fit, which picks -ngl
    moe = model.summary.n_expert > 0
    if not moe:
        notes.append("dense model (no routed experts): the command's layers stay where -ngl/-ts put "
                     "them, larger -ub are tried; llama.cpp --fit chooses -ngl and the layer split")
    ubs = list(ubatches) if ubatches is not None else _ubatches(user.context.n_ubatch, goal)
    starts: dict[Variant, Plan] = {}
    for kv, on in itertools.product(kv_choices(user, allow_kv_quant), kvo_choices(user, allow_nkvo)):
        for ub in ubs:
            ub_args = (["-ub", str(ub), "-b", str(max(ub, user.context.n_batch))]
                       if ub != user.context.n_ubatch else [])
            p = with_kv(s.plan(["--cpu-moe"] * moe + ub_args), kv, on)
            starts[variant(p)] = p
    # llama.cpp's --fit beside the search, in a forked child where a second core can take it (its
    # dry runs and the search share nothing); else first, and the starts take over the graphs its
    # dry runs built (compute.template)
    with Forked(s.llama_fit_result, fork=concurrent and s.fits_by_default) as job:
        if not job.forked:
            job.result()
        ours = s.ours(starts, notes, "--cpu-moe" if moe else "the command")
        # predictions only (they change no compute buffer the fit's candidate is predicted from)
        ncm, near = s.n_cpu_moe_predicted() if moe else (None, None)
        cpu_moe = s.candidate("--cpu-moe", s.plan(["--cpu-moe"])) if moe else None
        if job.pending():  # the answer unless --fit's candidate beats it: simulated while waiting
            s.simulate_ahead(pick(ours, [c for c in (cpu_moe, ncm) if c is not None], goal))
        fit_plan = s.fit_plan(job.result())
    fit = None
    if fit_plan is not None:
        fit, fit_notes = s.llama_fit_candidate(fit_plan)
        notes += fit_notes
    baselines = [c for c in (cpu_moe, ncm, fit) if c is not None]
    ours += s.seeded(baselines, goal)
    best = s.choose(ours, baselines, goal)
    # the --n-cpu-moe baseline is settled by full projections only where it could beat the answer
    rivals = [c for c in (ncm, near) if c is not None and not c.verified]
    if ncm is not None and (best is None or any(score(c.estimate, goal) > score(best.estimate, goal)
                                                for c in rivals)):
        exact = s.best_n_cpu_moe(int(ncm.label.split()[-1]))
        i = next(i for i, c in enumerate(baselines) if c.label.startswith("--n-cpu-moe"))
        baselines[i:i + 1] = [] if exact is None else [exact]
        best = s.choose(ours, baselines, goal)
    why = "" if best is not None else why_nothing_fits(ours + baselines, devices)
    return FastestResult(best, ours + baselines, goal, s.projections, notes, s.evaluations,
                         job.cpu_seconds, why=why, fit_forked=job.in_child)


def fastest_from_plan(plan: Plan, hw: Hardware, *, goal: str = "balanced", prompt: int = DEFAULT_PROMPT,
                      eff: Efficiencies | None = None, allow_kv_quant: bool = False,
                      accept: float | None = None, allow_nkvo: bool = False) -> FastestResult:
    """The window's "Fastest plan": the same search from an open plan (its -ot rules and its moves
    are kept), without the baselines; ``-ub`` may grow for the pp and balanced goals, the KV cache
    types change only with ``allow_kv_quant``, its device only with ``allow_nkvo``."""
    if goal not in GOALS:
        raise ValueError(f"goal {goal!r}: expected one of {', '.join(GOALS)}")
    eff = eff or defaults_for(plan.dialect)
    s = _Search(plan.model, plan.devices, [], plan.dialect, lambda argv: None, hw, eff, prompt,
                dict(plan.moves), accept)
    notes: list[str] = []
    ub0 = plan.context.n_ubatch
    starts: dict[Variant, Plan] = {}
    for kv, on in itertools.product(kv_choices(plan, allow_kv_quant), kvo_choices(plan, allow_nkvo)):
        for ub in _ubatches(ub0, goal):
            p = with_kv(plan if ub == ub0 else replace(plan, context=replace(
                plan.context, n_ubatch=ub, n_batch=max(ub, plan.context.n_batch))), kv, on)
            start = p.with_moves({n: CPU for names in s.expert_layers_any(p).values() for n in names})
            starts[variant(start)] = start
    ours = s.ours(starts, notes, "experts on the CPU")
    best = s.choose(ours, [], goal)
    why = "" if best is not None else why_nothing_fits(ours or list(s.starts.values()), plan.devices)
    return FastestResult(best, ours, goal, s.projections, notes, s.evaluations, why=why)
