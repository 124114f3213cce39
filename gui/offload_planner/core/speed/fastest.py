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

Its parts: :mod:`.candidate` (a candidate, whether it fits, the result), :mod:`.variants` (``-ub`` and
the KV cache's choices), :mod:`.evaluator` (memory projected in full or predicted, the speed),
:mod:`.fills` (our candidates), :mod:`.baselines` (``--n-cpu-moe N``, ``--fit``) and :mod:`.ranking`
(the goal's score and the pick); here the search that composes them and its two entries.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from offload_planner.core.devices import DeviceSet
from offload_planner.core.dialects.base import Dialect
from offload_planner.core.mapped_span import fit_row_note, mapping_gpus
from offload_planner.core.memory import alloc_size, pad
from offload_planner.core.model import Model
from offload_planner.core.placement import CPU
from offload_planner.core.plan import Plan
from offload_planner.core.speed.acceptance import AcceptArg
from offload_planner.core.speed.baselines import Baselines
from offload_planner.core.speed.candidate import Candidate, FastestResult, room, why_nothing_fits
from offload_planner.core.speed.efficiency import Efficiencies, defaults_for
from offload_planner.core.speed.estimate import DEFAULT_PROMPT
from offload_planner.core.speed.evaluator import _key
from offload_planner.core.speed.fills import Fills
from offload_planner.core.speed.forked import Forked
from offload_planner.core.speed.hardware import Hardware
from offload_planner.core.speed.ranking import GOALS, pick, score
from offload_planner.core.speed.variants import (
    Variant,
    _describe,
    _ubatches,
    kv_choices,
    kvo_choices,
    unmapped_choice,
    variant,
    with_kv,
)

MAX_VERIFY = 8  # full projections of candidates predicted to fit before the best verified one is taken


class _Search(Fills, Baselines):
    """The search: our fills and the baselines, evaluated as :class:`Evaluator` does, the best that
    fits chosen by a full projection."""

    @functools.cached_property
    def tops(self) -> set[tuple[object, ...]]:
        """The plans :meth:`top_layers` answered with (by :func:`_key`)."""
        return set()

    def ours(self, starts: dict[Variant, Plan], notes: list[str], label: str) -> list[Candidate]:
        """Per variant (``-ub`` and KV cache types; the user's first), the fill from every free routed
        expert on the CPU.  First the starts of the user's KV types at the user's and the largest
        ``-ub`` are projected in full; every other start and every fill is predicted from those."""
        out: list[Candidate] = []
        first = next(iter(starts))
        exact = []
        for on in dict.fromkeys(v[3] for v in starts):  # the KV cache where it is, and with -nkvo
            f = next(v for v in starts if v[3] == on and v[1:3] == first[1:3] and v[4] == first[4])
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
                spans = [g for g in mapping_gpus(plan) if g in start.over]
                how += (f" with mmap ({', '.join(spans)}: the mapped file span holds the CPU's tensors too)"
                        if spans else "")
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
            top = self.top_layers(fresh=True) if _key(c.plan) in self.tops else None  # fewer layers
            again += [top] if top is not None else []
            ours.extend(x for x in again if all(_key(x.plan) != _key(y.plan) for y in ours))
        done = [c for c in ours + baselines if c.verified and c.fits]
        return max(done, key=lambda x: score(x.estimate, goal)) if done else None

    def take_back(self, over: Candidate) -> Candidate | None:
        """``over`` (projected in full, over on some GPUs) with routed experts the search moved to
        each such GPU sent back to the CPU, highest layers first, until the bytes sent back cover
        what the projection puts over the limit; None when the search moved nothing there."""
        left = room(over.projection, self.offload)
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


    def top_layers(self, fresh: bool = False) -> Candidate | None:
        """Where a GPU maps the file (Metal with mmap) and the command's layers do not fit: the most
        layers from the top (``-ngl N``, mmap kept) that fit, predicted. The output layer and the last
        N layers lie together at the file's end in the usual order, so the GPU's mapped span holds
        (nearly) only its tensors; the estimate ranks it against the fills without mmap. None when
        even one layer is over, or every layer fits (the fills' start then holds them all).
        ``fresh``: predicted again with the compute buffers simulated since (:meth:`choose` asks
        again when the one it found is over by a full projection)."""
        lo, hi = 0, self.model.summary.n_layer + 1  # -ngl counts the output layer too
        if self.cheap("-ngl all (mmap)", self.plan(["-ngl", str(hi)]), fresh=fresh).fits:
            return None
        found: Candidate | None = None
        while lo < hi:  # the largest N that fits (more layers on the GPU never take room back)
            mid = (lo + hi + 1) // 2
            c = self.cheap(f"-ngl {mid} (mmap)", self.plan(["-ngl", str(mid)]), fresh=fresh)
            if c.fits:
                lo, found = mid, c
            else:
                hi = mid - 1
        if found is not None:
            self.tops.add(_key(found.plan))
        return found


def fastest_plan(model: Model, devices: DeviceSet, base_args: Sequence[str], hw: Hardware, *,
                 dialect: Dialect = Dialect.LLAMA_CPP, goal: str = "balanced", prompt: int = DEFAULT_PROMPT,
                 eff: Efficiencies | None = None, moves: dict[str, str] | None = None,
                 ubatches: Sequence[int] | None = None, allow_kv_quant: bool = False,
                 accept: AcceptArg = None, concurrent: bool = False,
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
    maps = any(g.mapped_buffer_name for g in devices.gpus)  # Metal: else no plan more to make
    loads = [[], *unmapped_choice(s.plan(["--cpu-moe"] * moe) if maps else user, notes)]  # ik: unmapped
    for (kv, on), lm in itertools.product(
            itertools.product(kv_choices(user, allow_kv_quant), kvo_choices(user, allow_nkvo)), loads):
        for ub in ubs:
            ub_args = (["-ub", str(ub), "-b", str(max(ub, user.context.n_batch))]
                       if ub != user.context.n_ubatch else [])
            p = with_kv(s.plan([*lm, *["--cpu-moe"] * moe, *ub_args]), kv, on)
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
        span_note = fit_row_note(fit.projection, fit.over, " ".join(dialect.no_mmap_flags))
        notes += [span_note] if span_note else []
    baselines = [c for c in (cpu_moe, ncm, fit) if c is not None]
    ours += s.seeded(baselines, goal)
    if len(loads) > 1 and (top := s.top_layers()) is not None:  # Metal with mmap: a contiguous span
        ours.append(top)
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
                      accept: AcceptArg = None, allow_nkvo: bool = False) -> FastestResult:
    """The window's "Fastest plan": the same search from an open plan (its -ot rules and its moves
    are kept), without the baselines; ``-ub`` may grow for the pp and balanced goals, the KV cache
    types change only with ``allow_kv_quant``, its device only with ``allow_nkvo``; where a GPU maps
    the file (Metal with mmap) the unmapped candidates and the top layers (:meth:`_Search.top_layers`,
    ``-ngl N`` as the window's layers option) as in :func:`fastest_plan`.  The search's own view of
    the plan is the plan itself (``base``): its ``-dev`` selection decides the GPUs it fills."""
    if goal not in GOALS:
        raise ValueError(f"goal {goal!r}: expected one of {', '.join(GOALS)}")
    eff = eff or defaults_for(plan.dialect)
    s = _Search(plan.model, plan.devices, [], plan.dialect, lambda argv: None, hw, eff, prompt,
                dict(plan.moves), accept, base=plan)
    notes: list[str] = []
    ub0 = plan.context.n_ubatch
    starts: dict[Variant, Plan] = {}
    freed = plan.with_moves({n: CPU for names in s.expert_layers_any(plan).values() for n in names})
    loads = [plan] + [replace(plan, placement_options=replace(plan.placement_options, use_mmap=False))
                      for _ in unmapped_choice(freed, notes)]
    for (kv, on), base in itertools.product(
            itertools.product(kv_choices(plan, allow_kv_quant), kvo_choices(plan, allow_nkvo)), loads):
        for ub in _ubatches(ub0, goal):
            p = with_kv(base if ub == ub0 else replace(base, context=replace(
                base.context, n_ubatch=ub, n_batch=max(ub, base.context.n_batch))), kv, on)
            start = p.with_moves({n: CPU for names in s.expert_layers_any(p).values() for n in names})
            starts[variant(start)] = start
    ours = s.ours(starts, notes, "experts on the CPU")
    if len(loads) > 1 and (top := s.top_layers()) is not None:  # Metal with mmap: as fastest_plan
        ours.append(top)
    best = s.choose(ours, [], goal)
    why = "" if best is not None else why_nothing_fits(ours or list(s.starts.values()), plan.devices)
    return FastestResult(best, ours, goal, s.projections, notes, s.evaluations, why=why)
