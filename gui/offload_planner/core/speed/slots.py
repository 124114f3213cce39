"""tg with every server slot generating at once (``-np N``, N > 1), per request and in total.

llama-server decodes one batch a step with the sampled token of every generating slot (the pinned
build's ``tools/server/server-context.cpp``: ``update_slots`` collects the slots in
``SLOT_STATE_GENERATING`` that can batch together, 3183-3194, and adds each one's token to the one
batch, ``handle_last_sampled_token`` 3310-3312; the batch holds ``max(n_batch, n_parallel)`` tokens,
1476-1481, decoded in chunks of ``n_batch``, 3072-3080).  So a step is one pass of ``N`` tokens
(:func:`speculation.pass_seconds`): the weights read once, the routed experts any of the ``N`` tokens
routes to (``1 - (1 - k/E)^N`` of them), each slot's KV at its own depth, the products of ``N`` tokens
with ``-tb``'s threads (``llama_context::decode`` -> ``graph_compute(gf, ubatch.n_tokens > 1)``,
src/llama-context.cpp 1463 and 2612); on a CPU through the kernels ggml-cpu takes for ``N`` columns
(:mod:`cpu_batch`: below 16 mostly one-token kernels, so a CPU gains little from a few busy slots).
Graph splits are the one-token graph's: op offload copies host weights only from 32 tokens an op (the
scheduler asks the GPU backend, ggml-backend.cpp 1110-1112;
ggml-cuda.cu 5757 and 5928, ``GGML_OP_OFFLOAD_MIN_BATCH``), so fewer than 32 busy slots do not
trigger it (more are not modelled: counted as without it).

The full context: the slots share the cache (unified: one stream of ``-c`` cells any slot may fill,
``n_ctx_seq = n_ctx``, llama-context.cpp 294-295; else ``-c / N`` cells each, 297-298), so with every
slot busy and the cache full each slot is ``n_ctx / N`` cells deep.

The figures are those of one request (the estimate's plain tg at depth 0) scaled by one one-token pass
over one ``N``-token pass, both priced the same way, so the single figure and these agree at ``N``
= 1.  At depth each slot adds what one token's attention there costs over one at depth 0, as the
single request's tg prices it (its KV read or, where slower, its FLOPs), computed one slot after
another.  The pinned build drafts for every busy slot (server-context.cpp 3183-3257: ``drafting``,
``common_speculative_draft``); the all-slots figure is without drafting (not modelled), said so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from offload_planner.core.memory import resolve_context
from offload_planner.core.placement import Placement
from offload_planner.core.plan import Plan
from offload_planner.core.speed.efficiency import Efficiencies
from offload_planner.core.speed.hardware import Hardware
from offload_planner.core.speed.nkvo import attention_plan, host_kv_layers, host_kv_seconds, kv_copy_seconds
from offload_planner.core.speed.rates import cpu_isa_gain
from offload_planner.core.speed.reads import expert_fraction, kv_bytes_at, weight_bytes_per_token
from offload_planner.core.speed.result import SpeedEstimate
from offload_planner.core.speed.speculation import batch_split_seconds, model_reads, pass_layers, pass_seconds
from offload_planner.core.speed.splits import token_split_pairs
from offload_planner.core.speed.tg import attention_flops_at, tg_times, token_extras


@dataclass(frozen=True)
class SlotsEstimate:
    n_slots: int
    cells: int  # the cache's cells over all slots (-c, padded)
    depth_at_ctx: int  # each slot's depth with the shared cache full: cells / n_slots
    tg_tps_each: float  # at depth 0, every slot generating
    tg_tps_total: float
    tg_tps_each_at_ctx: float
    tg_tps_total_at_ctx: float
    experts_read: float | None  # of a layer's routed experts a step reads (None: a dense model)
    drafting: bool  # the plan drafts (a draft model or MTP): these figures are without it


def slots_estimate(plan: Plan, placement: Placement, hw: Hardware, eff: Efficiencies,
                   plain_tps: float) -> SlotsEstimate | None:
    """Every one of the plan's ``n_seq_max`` slots generating at once (None with one slot);
    ``plain_tps``: one request's tg at depth 0 without speculative decoding."""
    n = plan.context.n_seq_max
    if n <= 1 or not plain_tps or math.isinf(plain_tps):
        return None
    s = plan.model.summary
    ctx = resolve_context(plan.context, s.n_ctx_train, s.n_swa)
    depth = ctx.n_ctx // n
    reads = model_reads(plan.model, placement)
    frac = expert_fraction(plan.model)
    pairs = token_split_pairs(plan, placement)
    host_kv = host_kv_layers(plan, placement)
    layers = pass_layers(placement)
    n_embd = s.n_embd

    def step(b: int, kv: dict[str, int]) -> float:
        split_s = batch_split_seconds(hw, eff, pairs, n_embd, b) + host_kv_seconds(host_kv, hw, eff, b)
        return pass_seconds(reads, hw, eff, frac, b, kv, split_s, layers, dialect=plan.dialect)

    one = step(1, {})
    each0 = plain_tps * one / step(n, {})
    each1 = 1.0 / (1.0 / each0 + n * _attention_seconds(plan, placement, hw, eff, depth))
    spec = plan.spec
    return SlotsEstimate(
        n_slots=n, cells=ctx.n_ctx, depth_at_ctx=depth, tg_tps_each=each0, tg_tps_total=n * each0,
        tg_tps_each_at_ctx=each1, tg_tps_total_at_ctx=n * each1,
        experts_read=(1.0 - (1.0 - frac) ** n) if 0.0 < frac < 1.0 else None,
        drafting=spec is not None and spec.active)


def _attention_seconds(plan: Plan, placement: Placement, hw: Hardware, eff: Efficiencies,
                       depth: int) -> float:
    """What one slot's token costs at ``depth`` over one at depth 0, as the single request's tg prices
    it (:func:`tg.tg_times`: its KV read, or where slower its attention FLOPs; -nkvo's copies)."""
    ap = attention_plan(plan)
    s = plan.model.summary
    ctx = resolve_context(plan.context, s.n_ctx_train, s.n_swa)
    weights = weight_bytes_per_token(plan.model, placement)
    extras = token_extras(plan, placement, cpu_isa_gain(hw))
    t0 = tg_times(plan, placement, hw, eff, weights, {}, extras=extras)
    kv = kv_bytes_at(plan.model, placement, ap.context, ctx, ap, depth)
    attn = attention_flops_at(ap, placement, ctx, depth)
    td = tg_times(plan, placement, hw, eff, weights, kv, attn, extras)
    copy = kv_copy_seconds(kv, hw, eff) if ap is not plan else 0.0
    return max(sum(td.values()) - sum(t0.values()) + copy, 0.0)


def with_slots(est: SpeedEstimate, plan: Plan, hw: Hardware, eff: Efficiencies, *,
               placement: Placement | None = None) -> SpeedEstimate:
    """``est`` with :attr:`SpeedEstimate.slots` (unchanged with one slot)."""
    plain = est.spec.tg_tps_plain if est.spec is not None else est.tg_tps
    slots = slots_estimate(plan, placement or plan.placement(), hw, eff, plain)
    return est if slots is None else replace(est, slots=slots)
