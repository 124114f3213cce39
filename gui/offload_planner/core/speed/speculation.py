"""Speculative decoding in the tg estimate: a draft model (``-md``) or MTP (the main model's NextN
layers, ``--spec-type draft-mtp``), as the pinned build's ``common/speculative.cpp`` runs them.

One step of a slot: the target verifies the last sampled token and the ``n`` drafted ones in one
batch of ``n + 1`` (``--spec-draft-n-max``, default 3; the default ``--spec-draft-p-min`` 0 never
stops a draft early); the draft processes that same batch (``common_speculative_process``: its KV,
and MTP's hidden states), then decodes one token at a time ``n`` times.  A batch reads each
weight once (routed experts: those at least one of its tokens routes to, ``1 - (1 - k/n_expert)^b``)
and the KV cache once, and computes ``2 x active params`` FLOPs per token: its time on a device is
the larger of the reads over the effective bandwidth and the products (a GPU's: the FLOPs over its
effective compute; a CPU's: each weight through the kernel ggml-cpu multiplies that many columns
with, :mod:`cpu_batch`), plus every graph split.

Tokens a step: with a per-token acceptance ``a`` (a draft token is kept when it and every earlier one
in the draft is accepted) ``1 + a + a^2 + ... + a^n``.  The default ``a`` is a public measurement
(:data:`DEFAULT_ACCEPT`), said so in the estimate's assumptions; ``plan --spec-accept`` declares one.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace

from offload_planner.core.devices import DeviceSet
from offload_planner.core.dialects import Dialect
from offload_planner.core.memory import resolve_context
from offload_planner.core.model import Model
from offload_planner.core.placement import Placed, Placement, place
from offload_planner.core.plan import Plan
from offload_planner.core.roles import Role
from offload_planner.core.speed.acceptance import Acceptance, AcceptArg, powers_sum
from offload_planner.core.speed.assumptions import draft_assumptions
from offload_planner.core.speed.cpu_batch import CpuWeights, products_seconds
from offload_planner.core.speed.efficiency import REPACK_BUFT, Efficiencies
from offload_planner.core.speed.estimate import tg_tps
from offload_planner.core.speed.hardware import Figure, Hardware, Source
from offload_planner.core.speed.nkvo import (
    host_kv_layers,
    host_kv_seconds,
    kv_copy_seconds,
    nkvo_attention_on_gpu,
)
from offload_planner.core.speed.rates import (
    _effective_bandwidth,
    _is_gpu,
    _link,
    compute_tflops,
    computes_on_cpu,
)
from offload_planner.core.speed.reads import expert_fraction, kv_bytes_at, kv_read_at
from offload_planner.core.speed.result import Assumption, SpeedEstimate
from offload_planner.core.speed.splits import one_token_offload, split_pairs, token_split_pairs

#: Per drafted token.  ggml-org/llama.cpp PR 25980 (GLM-5.2 MTP, ``draft-mtp`` at the default
#: ``--spec-draft-n-max 3``), https://github.com/ggml-org/llama.cpp/pull/25980 : "Acceptance is healthy
#: at all three draft positions greedy and ungated (0.834 / 0.653 / 0.494, mean length 2.98)".
#: 0.806 per token gives the same mean length: 1 + 0.806 + 0.806^2 + 0.806^3 = 2.98.
DEFAULT_ACCEPT = 0.806
ACCEPT_SOURCE = ("GLM-5.2 MTP in llama.cpp, greedy, --spec-draft-n-max 3: \"0.834 / 0.653 / 0.494, mean "
                 "length 2.98\" (https://github.com/ggml-org/llama.cpp/pull/25980), the per-token rate "
                 "of that mean length; used for draft models too (declare yours: --spec-accept)")


def accept_figure(value: AcceptArg, n: int = 1) -> Figure:
    """The acceptance per drafted token as a figure, with its source; ``n`` drafts a step resolve an
    :class:`Acceptance` in llama-server's printed form."""
    if value is None:
        return Figure(DEFAULT_ACCEPT, "per drafted token", Source.DEFAULT, ACCEPT_SOURCE)
    if isinstance(value, Acceptance):
        what = "draft acceptance (accepted / drafted)" if value.kind == "ratio" else "mean len"
        note = f"{value.text()}: llama-server's {what} at {n} drafted tokens a step"
        if value.kind == "len" and value.value > n + 1:
            note += f" (more than the {n + 1} tokens a step of {n} drafts can give: every draft counted kept)"
        return Figure(value.per_token(n), "per drafted token", Source.DECLARED, note)
    return Figure(value, "per drafted token", Source.DECLARED, "--spec-accept")


def tokens_per_step(accept: float, n_draft: int) -> float:
    """Expected tokens a step: the target's own token and each drafted one kept while all before it
    were accepted."""
    return powers_sum(accept, n_draft)


@dataclass(frozen=True)
class SpecEstimate:
    kind: str  # "MTP (1 NextN layer)" | "draft model NAME"
    n_draft: int
    accept: Figure
    tokens_per_step: float
    verify_ms: float  # the target's batch of n_draft + 1 tokens, at depth 0
    draft_ms: float  # one draft pass, at depth 0
    step_ms: float
    tg_tps: float
    tg_tps_at_ctx: float
    tg_tps_plain: float
    tg_tps_at_ctx_plain: float


@dataclass
class _Reads:
    """What one pass reads and computes on one device: weights read in full, routed experts, one row
    per token (embedding lookups), the matrix elements of each kind, and the matrices by the CPU
    kernel that multiplies them (:mod:`cpu_batch`)."""

    full_b: float = 0.0
    exp_b: float = 0.0
    row_b: float = 0.0
    full_el: float = 0.0
    exp_el: float = 0.0
    cpu: CpuWeights = field(default_factory=CpuWeights)


def _add(reads: dict[str, _Reads], device: str, p: Placed, *, row: bool, expert: bool,
         scale: float = 1.0) -> None:
    t = p.tensor
    r = reads[device]
    if row:
        rows = t.shape[1] if len(t.shape) > 1 else 1
        r.row_b += scale * t.nbytes / max(rows, 1)
    elif expert:
        r.exp_b += scale * t.nbytes
        r.exp_el += scale * t.n_elements
        r.cpu.add((t.type.name, p.buft == REPACK_BUFT, True), scale * t.nbytes, scale * t.n_elements)
    else:
        r.full_b += scale * t.nbytes
        if len(t.shape) >= 2:
            r.full_el += scale * t.n_elements
            r.cpu.add((t.type.name, p.buft == REPACK_BUFT, False), scale * t.nbytes, scale * t.n_elements)


def model_reads(model: Model, placement: Placement) -> dict[str, _Reads]:
    """A forward pass of the model's trunk (NextN blocks excluded), per device."""
    reads: dict[str, _Reads] = defaultdict(_Reads)
    for p in placement.items:
        t = p.tensor
        if p.device is None or t.role is Role.NEXTN:
            continue
        _add(reads, p.device, p, row=t.role is Role.TOKEN_EMBD and not p.copy, expert=t.role.is_routed_expert)
    return dict(reads)


def mtp_reads(model: Model, placement: Placement) -> dict[str, _Reads]:
    """One MTP head's pass (``graph_mtp``): its NextN block (one of ``n_nextn`` when they chain), the
    embedding row (``nextn.embed_tokens``, else ``token_embd``) and the head (``shared_head_head``,
    else the output)."""
    n = max(model.summary.n_nextn, 1)
    reads: dict[str, _Reads] = defaultdict(_Reads)
    names = set()
    for p in placement.items:
        t = p.tensor
        if t.role is not Role.NEXTN:
            continue
        dev = p.device or placement.layer_device(t.layer or 0)
        names.add(t.name.split(".", 2)[-1].rsplit(".", 1)[0])
        _add(reads, dev, p, row="embed_tokens" in t.name, expert="_exps" in t.name, scale=1.0 / n)
    for p in placement.items:
        t = p.tensor
        if p.device is None:
            continue
        if t.role is Role.TOKEN_EMBD and not p.copy and "nextn.embed_tokens" not in names:
            _add(reads, p.device, p, row=True, expert=False)
        elif (t.role is Role.OUTPUT or p.copy) and "nextn.shared_head_head" not in names:
            _add(reads, p.device, p, row=False, expert=False)
    return dict(reads)


def pass_seconds(reads: dict[str, _Reads], hw: Hardware, eff: Efficiencies, frac: float, b: float,
                 kv: dict[str, int], split_s: float, layers: dict[str, float] | None = None, *,
                 dialect: Dialect) -> float:
    """One pass of ``b`` tokens (a batch: weights once, experts any token routes to, KV once): per
    device the larger of its reads over its effective bandwidth and its products, summed (devices run
    one after another), plus the graph splits' ``split_s``, plus on a GPU ``gpu_layer_us`` for each of
    the pass's ``layers`` there, whatever ``b`` (as plain tg counts them: a pass launches a layer's
    kernels once).  A GPU's (and an RPC device's whose backend is not known) products: ``b`` tokens'
    FLOPs over its effective compute; a CPU's: each weight through the kernel ``dialect``'s CPU backend
    multiplies ``b`` columns with (:func:`cpu_batch.products_seconds`: one-token kernels at the rate a
    plain token's run, GEMMs at the prompt's compute), so one token costs what plain tg says.  A batch
    of more than one token computes with ``-tb``'s threads (:meth:`Hardware.for_tokens`): the target's
    verify batch and the draft's pass over it (the draft's context takes the main ``cpuparams_batch``
    unless ``-tbd``, common/arg.cpp:890 and common/speculative.cpp:2553-2555; ik loads the draft with
    the main command line), a one-token draft pass with ``-t``'s; a ``-md`` model's passes with
    ``-td``'s and ``-tbd``'s where given (the caller passes :meth:`Hardware.for_draft`)."""
    hw = hw.for_tokens(b)
    hit = 1.0 - (1.0 - frac) ** b if frac < 1.0 else 1.0
    total = split_s
    layers = layers or {}
    per_layer = eff.gpu_layer_us.value * 1e-6
    for name in dict.fromkeys([*reads, *kv]):  # first-seen order, whatever the hash seed
        r = reads.get(name, _Reads())
        d = hw[name]
        bw = _effective_bandwidth(d, eff)
        nbytes = r.full_b + r.exp_b * hit + r.row_b * b + kv.get(name, 0)
        if computes_on_cpu(d):
            work = products_seconds(r.cpu, d, eff, dialect, b, frac, hit)
        else:
            work = 2.0 * b * (r.full_el + r.exp_el * frac) / (compute_tflops(d, eff) * 1e12)
        total += max(nbytes / (bw * 1e9), work)
        if _is_gpu(d):
            total += layers.get(name, 0.0) * per_layer
    return total


def pass_layers(placement: Placement, *, nextn: bool = False, share: float = 1.0) -> dict[str, float]:
    """How many layers one pass runs on each device, times ``share``: the layers with a placed weight
    outside the NextN blocks (a normal forward pass), or with ``nextn`` those blocks' (an MTP head's
    pass; ``share`` 1/n when n heads chain and a pass runs one).  NextN tensors the placement leaves
    without a device count on their layer's device, as :func:`mtp_reads` reads them."""
    seen: dict[str, set[int]] = defaultdict(set)
    for p in placement.items:
        t = p.tensor
        if t.layer is None or (t.role is Role.NEXTN) is not nextn:
            continue
        dev = p.device if p.device is not None or not nextn else placement.layer_device(t.layer)
        if dev is not None:
            seen[dev].add(t.layer)
    return {k: len(v) * share for k, v in seen.items()}


def batch_split_seconds(hw: Hardware, eff: Efficiencies, pairs: list[tuple[str, str]], n_embd: int,
                        b: float) -> float:
    """The graph splits of a pass of ``b`` tokens: each of ``pairs`` (from, to device) costs its
    link's latency plus ``b`` rows of ``n_embd`` F32 activations over its bandwidth."""
    out = 0.0
    for a, c in pairs:
        gb, lat = _link(hw[a], hw[c], eff)
        out += lat + 4 * n_embd * b / (gb * 1e9)
    return out


@dataclass
class _Draft:
    """The draft side of a step: what one pass reads, its splits, and its KV at a depth."""

    label: str
    reads: dict[str, _Reads]
    frac: float
    pairs: list[tuple[str, str]]
    n_embd: int
    kv_depth: dict[str, int]  # at the full context
    n_max: int
    layers: dict[str, float]  # layers one pass runs, by device (:func:`pass_layers`)
    own_context: bool = False  # a -md model's own context: -td/-tbd's threads (Hardware.for_draft)


def _draft_side(plan: Plan, placement: Placement, depth: int) -> _Draft | None:
    spec = plan.spec
    if spec is None or not spec.active:
        return None
    s = plan.model.summary
    if spec.draft is not None and spec.drafting:  # else none, or loaded and never drafted with
        from offload_planner.core.speculative import draft_mismatch

        if draft_mismatch(plan.model, spec) is not None:  # llama-server generates without it
            return None
        dm = spec.draft
        dp = place(dm.model, dm.devices, dm.placement_options)
        name = dm.model.path.rsplit("/", 1)[-1]
        if spec.mtp:  # draft-mtp on the draft model: its MTP head on the target's hidden state
            return replace(_mtp_side(plan, dm.model, dp, dm.devices, placement.output_device, depth,
                                     f"draft model {name}, "), own_context=True)
        params = replace(plan.context, type_k=dm.type_k, type_v=dm.type_v)
        dctx = resolve_context(params, dm.model.summary.n_ctx_train, dm.model.summary.n_swa)
        kv = kv_read_at(dm.model, dp, params, dctx, dm.devices, depth)
        return _Draft(f"draft model {name}", model_reads(dm.model, dp), expert_fraction(dm.model),
                      split_pairs(dm.model, dp, one_token_offload(dm.devices, dp, plan.context.op_offload)),
                      dm.model.summary.n_embd, kv, spec.n_max, pass_layers(dp), own_context=True)
    if not (spec.mtp and s.n_nextn):
        return None
    return _mtp_side(plan, plan.model, placement, plan.devices, placement.output_device, depth)


def _mtp_side(plan: Plan, model: Model, placement: Placement, devices: DeviceSet, hidden_on: str,
              depth: int, label: str = "") -> _Draft:
    """An MTP head's draft side: ``model``'s NextN block and head as ``placement`` puts them (the main
    model's, or a ``-md`` draft's), fed the target's hidden state from ``hidden_on``."""
    spec = plan.spec
    assert spec is not None
    s = model.summary
    type_k, type_v = plan.context.dialect.mtp_cache_types(plan.context, spec.type_k, spec.type_v)
    params = replace(plan.context, type_k=type_k, type_v=type_v)
    mctx = resolve_context(params, s.n_ctx_train, s.n_swa)
    nextn = range(s.n_layer_trunk, s.n_layer)
    kv = kv_read_at(model, placement, params, mctx, devices, depth, cached=nextn)
    reads = mtp_reads(model, placement)
    # the trunk's hidden state (on the output device) into the NextN block, then the head
    seq = [hidden_on, placement.layer_device(nextn.start), placement.output_device]
    pairs = [(a, b) for a, b in itertools.pairwise(seq) if a != b]
    # chained heads (n_nextn > 1, not sharing the target's KV) cap the draft at one token per head
    n_max = min(spec.n_max, s.n_nextn) if s.n_nextn > 1 else spec.n_max
    label += f"MTP ({s.n_nextn} NextN layer{'s' if s.n_nextn != 1 else ''})"
    layers = pass_layers(placement, nextn=True, share=1.0 / max(s.n_nextn, 1))
    return _Draft(label, reads, expert_fraction(model), pairs, s.n_embd, kv, n_max, layers)


@dataclass(frozen=True)
class StepReads:
    """What one step of speculative decoding reads of a layer's routed experts, over what one plain
    token reads (``n_expert_used / n_expert`` of them): the target's trunk in the verify batch of
    ``n + 1`` tokens (the experts any of them routes to), and an MTP head's NextN block in its ``n``
    one-token draft passes and its batch (:func:`speculation`).  A layout for the step (the fastest
    plan's :mod:`layout`) weighs the experts' bytes with them: with MTP the NextN block's experts
    are worth ~4x a trunk layer's on the GPU, and every expert byte more against a graph split."""

    trunk: float
    nextn: float
    n_trunk: int  # layers from here are NextN blocks


def step_reads(plan: Plan) -> StepReads | None:
    """:class:`StepReads` of the plan's draft model or MTP (None without one, or with no draft)."""
    spec = plan.spec
    if spec is None or not spec.active:
        return None
    s = plan.model.summary
    mtp = not spec.drafting and spec.mtp and s.n_nextn > 0
    if not spec.drafting and not mtp:
        return None
    n = min(spec.n_max, s.n_nextn) if mtp and s.n_nextn > 1 else spec.n_max
    frac = expert_fraction(plan.model)
    if n < 1 or not 0.0 < frac < 1.0:
        return None
    hit = 1.0 - (1.0 - frac) ** (n + 1)
    return StepReads(hit / frac, (n * frac + hit) / frac if mtp else hit / frac, s.n_layer_trunk)


def with_speculation(est: SpeedEstimate, plan: Plan, hw: Hardware, eff: Efficiencies, *,
                     placement: Placement | None = None, accept: AcceptArg = None) -> SpeedEstimate:
    """``est`` with tg as the plan's draft model or MTP makes it (``est.spec`` says how, and keeps
    the figures without it); unchanged when the plan has neither."""
    placement = placement or plan.placement()
    target_kv = {d.name: d.kv_bytes_at_ctx for d in est.devices if d.kv_bytes_at_ctx}
    spec = speculation(plan, placement, hw, eff, depth=est.n_ctx, target_kv=target_kv,
                       plain=(est.tg_tps, est.tg_tps_at_ctx), accept=accept)
    if spec is None:
        return est
    at_depth = est.tg_tps_at_depth
    if est.depth > 0:
        s = plan.model.summary
        ctx = resolve_context(plan.context, s.n_ctx_train, s.n_swa)
        kv = kv_bytes_at(plan.model, placement, plan.context, ctx, plan, est.depth)
        deep = speculation(plan, placement, hw, eff, depth=est.depth, target_kv=kv,
                           plain=(est.tg_tps, est.tg_tps_at_ctx), accept=accept)
        at_depth = deep.tg_tps_at_ctx if deep is not None else at_depth
    notes = [Assumption(f"{spec.kind}: acceptance", spec.accept), *_draft_length(spec, plan)]
    if plan.spec is not None and plan.spec.draft is not None:  # -md's own context: -td/-tbd
        notes += draft_assumptions(hw)
    return replace(est, tg_tps=spec.tg_tps, tg_tps_at_ctx=spec.tg_tps_at_ctx, tg_tps_at_depth=at_depth,
                   spec=spec, assumptions=[*est.assumptions, *notes])


def _draft_length(spec: SpecEstimate, plan: Plan) -> list[Assumption]:
    """With a ``p_min`` above 0 the server stops a draft early when the draft's probability falls below
    it: that is not modelled, the draft counted at its maximum length, said so."""
    s = plan.spec
    if s is None or s.p_min <= 0:
        return []
    note = (f"{s.p_min_from}: the server stops a draft early when the draft's probability falls below "
            f"{s.p_min:g} (not modelled): the draft length counted as the maximum; the estimate is then "
            "an upper bound on draft cost")
    source = Source.DECLARED if s.p_min_given else Source.DEFAULT
    return [Assumption(f"{spec.kind}: draft length", Figure(spec.n_draft, "tokens a step", source, note))]


def speculation(plan: Plan, placement: Placement, hw: Hardware, eff: Efficiencies, *, depth: int,
                target_kv: dict[str, int], plain: tuple[float, float],
                accept: AcceptArg = None) -> SpecEstimate | None:
    """tg with the plan's draft model or MTP (None without one) at depth 0 and at ``depth`` tokens
    (``target_kv``: the target's KV read per token there); ``plain``: tg without speculation at
    depth 0 and at the full context."""
    draft = _draft_side(plan, placement, depth)
    if draft is None or draft.n_max < 1:
        return None
    n = draft.n_max
    acc = accept_figure(accept, n)
    b = n + 1
    e_tokens = tokens_per_step(acc.value, n)
    target = model_reads(plan.model, placement)
    frac = expert_fraction(plan.model)
    tpairs = token_split_pairs(plan, placement)
    n_embd = plan.model.summary.n_embd
    target_layers = pass_layers(placement)
    host_kv = host_kv_layers(plan, placement)  # -nkvo: the target's layers round-trip to the CPU
    dialect = plan.dialect
    copies = nkvo_attention_on_gpu(plan)  # ... and with flash attention copy the cache's views back
    dhw = hw.for_draft() if draft.own_context else hw

    def step(target_kv_: dict[str, int], draft_kv: dict[str, int]) -> tuple[float, float, float]:
        host_s = host_kv_seconds(host_kv, hw, eff, b)
        if copies:
            host_s += kv_copy_seconds(target_kv_, hw, eff)
        splits = batch_split_seconds(hw, eff, tpairs, n_embd, b) + host_s
        verify = pass_seconds(target, hw, eff, frac, b, target_kv_, splits, target_layers, dialect=dialect)
        one = pass_seconds(draft.reads, dhw, eff, draft.frac, 1, draft_kv,
                           batch_split_seconds(hw, eff, draft.pairs, draft.n_embd, 1), draft.layers,
                           dialect=dialect)
        catch_up = pass_seconds(draft.reads, dhw, eff, draft.frac, b, draft_kv,
                                batch_split_seconds(hw, eff, draft.pairs, draft.n_embd, b), draft.layers,
                                dialect=dialect)
        return verify, one, verify + n * one + catch_up

    verify0, one0, step0 = step({}, {})
    _, _, step1 = step(target_kv, draft.kv_depth)
    return SpecEstimate(
        kind=draft.label, n_draft=n, accept=acc, tokens_per_step=e_tokens, verify_ms=1e3 * verify0,
        draft_ms=1e3 * one0, step_ms=1e3 * step0,
        tg_tps=e_tokens / step0 if step0 else math.inf, tg_tps_at_ctx=e_tokens / step1 if step1 else math.inf,
        tg_tps_plain=plain[0], tg_tps_at_ctx_plain=plain[1])


def tg_tps_as_shown(plan: Plan, hw: Hardware, eff: Efficiencies, *, placement: Placement | None = None,
                    accept: AcceptArg = None) -> float:
    """tg at depth 0 as the estimate shows it (:func:`with_speculation` over ``estimate``: with the
    plan's draft model or MTP), without the rest of the estimate (no prompt processing): for
    previews of a move."""
    placement = placement or plan.placement()
    plain = tg_tps(plan, hw, eff=eff, placement=placement)
    spec = speculation(plan, placement, hw, eff, depth=0, target_kv={}, plain=(plain, plain), accept=accept)
    return plain if spec is None else spec.tg_tps
