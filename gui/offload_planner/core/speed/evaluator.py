"""How the fastest-plan search evaluates a candidate: its memory projected in full (the compute
simulation) or predicted from the compute buffers of plans projected in full, and its speed."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from offload_planner.core.buffer import Buffer
from offload_planner.core.compute.buffers import SIMULATION_LOCK, simulate_buffers
from offload_planner.core.compute.simulate import ReserveMemo
from offload_planner.core.devices import DeviceSet
from offload_planner.core.dialects.base import Dialect
from offload_planner.core.memory import Projection, resolve_context
from offload_planner.core.model import Model
from offload_planner.core.placement import Placement, resolve_ngl, selected_gpus
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.speed.acceptance import AcceptArg
from offload_planner.core.speed.candidate import Candidate, host_left, room
from offload_planner.core.speed.efficiency import Efficiencies
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import Hardware
from offload_planner.core.speed.layout import LayerCost
from offload_planner.core.speed.result import SpeedEstimate
from offload_planner.core.speed.speculation import with_speculation
from offload_planner.core.speed.variants import Variant

if TYPE_CHECKING:
    from offload_planner.core.fit import FitResult

#: a compute buffer of another layer split larger than the starts' split's by more than this grew with
#: what every split has (the experts' activations at this -ub), not with the split: the starts' split
#: is predicted with it too (on the test's tiny RPC devices splits differ by ~2 MiB; Qwen3-30B on two
#: 8 GiB cards at -ub 4096 grew by ~540 MiB once a GPU held experts)
SPLIT_SHIFT = 64 * 1024**2


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


class Evaluator:
    """Candidates are first evaluated with their weights, KV and outputs exact and their compute
    buffers predicted (:meth:`cheap`, about a millisecond); only the plan chosen (and any candidate
    that would beat it) is projected in full (:meth:`full`) and chosen only if it then fits."""

    def __init__(self, model: Model, devices: DeviceSet, base_args: Sequence[str], dialect: Dialect,
                 parse: Callable[[list[str]], Any], hw: Hardware, eff: Efficiencies, prompt: int,
                 moves: dict[str, str], accept: AcceptArg = None, base: Plan | None = None) -> None:
        self.model, self.devices, self.base_args = model, devices, list(base_args)
        #: the window's search starts from its open plan, not a command line (:meth:`plan`)
        self.base = base
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

    @functools.cached_property
    def offload_gpus(self) -> list[str]:
        """The GPUs the search may fill, in llama.cpp's order: those the command's ``-dev`` selects
        (in its order), else every GPU; llama-server aborts on weights in an unselected GPU's buffer."""
        return [g.name for g in selected_gpus(self.devices, self.plan([]).placement_options)]

    @functools.cached_property
    def offload(self) -> DeviceSet:
        """The CPU and :attr:`offload_gpus`: the devices whose room the search weighs."""
        names = self.offload_gpus
        if len(names) == len(self.devices.gpus):
            return self.devices
        return replace(self.devices, gpus=tuple(g for g in self.devices.gpus if g.name in names))

    def plan(self, extra: Sequence[str]) -> Plan:
        """The command with ``extra`` flags after it, the user's moves on top; from an open plan
        (:attr:`base`, the window's), that plan with the same change made as the window's edit."""
        if self.base is not None:
            return self._edited(self.base, extra)
        p = plan_from_args(self.model, self.devices, self.parse([*self.base_args, *extra]), self.dialect)
        return p.with_moves(self.moves) if self.moves else p

    def _edited(self, base: Plan, extra: Sequence[str]) -> Plan:
        """``base`` changed as ``extra`` changes a command: ``-ngl N`` (the top-layers candidates) as the
        window's layers option (``-ngl`` as the command reads it: the dialect's rule on the overrides
        kept, :meth:`Dialect.kept_overrides`); nothing else is asked of an open plan (its starts and
        fills are made by moves; the baselines need a command line)."""
        if not extra:
            return base
        if len(extra) != 2 or extra[0] != "-ngl":
            raise ValueError(f"an open plan's search makes no {' '.join(extra)} variant")
        po = base.placement_options
        ngl = resolve_ngl(int(extra[1]), self.model.summary.n_layer, has_gpu=bool(self.devices.gpus))
        popts = replace(po, n_gpu_layers=ngl, overrides=self.dialect.kept_overrides(ngl, po.overrides))
        return replace(base, placement_options=popts)

    def _make(self, label: str, plan: Plan, proj: Projection, verified: bool) -> Candidate:
        over = [n for n, left in room(proj, self.offload).items() if left < 0]
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
