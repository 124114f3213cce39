"""Tokens per second of a plan: token generation (:mod:`.tg`) bound by the bytes each device reads
(:mod:`.reads`) plus the graph splits (:mod:`.splits`) and -nkvo's round trips (:mod:`.nkvo`), prompt
processing (:mod:`.pp`) bound by compute and by the host weights op offload copies to the GPU; the
result (:mod:`.result`) names its bottlenecks (:mod:`.bottleneck`) and assumptions
(:mod:`.assumptions`)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

from offload_planner.core.memory import resolve_context
from offload_planner.core.placement import CPU, Placement
from offload_planner.core.plan import Plan
from offload_planner.core.speed.assumptions import _assumptions, thread_warnings
from offload_planner.core.speed.bottleneck import _bottleneck, _pp_bottleneck
from offload_planner.core.speed.efficiency import Efficiencies, defaults_for
from offload_planner.core.speed.hardware import Hardware, Source
from offload_planner.core.speed.nkvo import attention_plan, host_kv_layers, host_kv_seconds, kv_copy_seconds
from offload_planner.core.speed.pp import pp_time
from offload_planner.core.speed.rates import cpu_isa_gain
from offload_planner.core.speed.reads import kv_bytes_at, weight_bytes_per_token
from offload_planner.core.speed.result import Assumption, DeviceTime, SpeedEstimate
from offload_planner.core.speed.splits import _split_seconds, token_split_pairs
from offload_planner.core.speed.tg import attention_flops_at, tg_times, token_extras

DEFAULT_PROMPT = 4096


def estimate(plan: Plan, hw: Hardware, *, prompt: int = DEFAULT_PROMPT, eff: Efficiencies | None = None,
             placement: Placement | None = None, depth: int = 0) -> SpeedEstimate:
    """The speed of ``plan`` on ``hw``: tg at depth 0 and at the full context, pp of ``prompt``
    from an empty cache and, with ``depth``, pp and tg after ``depth`` tokens of context (``eff``:
    the backend's defaults, :func:`efficiency.defaults_for`, unless given)."""
    eff = eff or defaults_for(plan.dialect)
    placement = placement or plan.placement()
    s = plan.model.summary
    ctx = resolve_context(plan.context, s.n_ctx_train, s.n_swa)
    weights = weight_bytes_per_token(plan.model, placement)
    ap = attention_plan(plan)  # -nkvo with flash attention: the KV read on the GPU after its copy
    kv1 = kv_bytes_at(plan.model, placement, ap.context, ctx, ap, ctx.n_ctx_seq)
    extras = token_extras(plan, placement, cpu_isa_gain(hw))
    t0 = tg_times(plan, placement, hw, eff, weights, {}, extras=extras)
    attn1 = attention_flops_at(ap, placement, ctx, ctx.n_ctx_seq)
    t1 = tg_times(plan, placement, hw, eff, weights, kv1, attn1, extras)
    pairs = token_split_pairs(plan, placement)
    split_s = _split_seconds(plan, hw, eff, pairs)
    host_kv = host_kv_layers(plan, placement)
    host_kv_s = host_kv_seconds(host_kv, hw, eff)
    copy1 = kv_copy_seconds(kv1, hw, eff) if ap is not plan else 0.0
    total0 = sum(t0.values()) + split_s + host_kv_s
    total1 = sum(t1.values()) + split_s + host_kv_s + copy1
    kv_cell = {k: v / ctx.n_ctx_seq for k, v in kv1.items()} if ctx.n_ctx_seq else {}
    pp = pp_time(plan, placement, hw, eff, prompt, ctx.n_ubatch, pairs, kv_cell=kv_cell)
    pp_total = sum(pp.device_s.values()) + pp.transfer_s + pp.split_s
    pp_d: float | None = None
    tg_d: float | None = None
    if depth > 0:
        ppd = pp_time(plan, placement, hw, eff, prompt, ctx.n_ubatch, pairs, depth=depth, kv_cell=kv_cell)
        ppd_total = sum(ppd.device_s.values()) + ppd.transfer_s + ppd.split_s
        kvd = kv_bytes_at(plan.model, placement, ap.context, ctx, ap, depth)
        attn_d = attention_flops_at(ap, placement, ctx, depth)
        tgd = tg_times(plan, placement, hw, eff, weights, kvd, attn_d, extras)
        tgd_total = (sum(tgd.values()) + split_s + host_kv_s
                     + (kv_copy_seconds(kvd, hw, eff) if ap is not plan else 0.0))
        pp_d = prompt / ppd_total if ppd_total else math.inf
        tg_d = 1.0 / tgd_total if tgd_total else math.inf
    devs = [DeviceTime(n, weights.get(n, 0), kv1.get(n, 0), 1e3 * t0.get(n, 0.0), 1e3 * t1.get(n, 0.0),
                       1e3 * pp.device_s.get(n, 0.0), t0.get(n, 0.0) / total0 if total0 else 0.0,
                       1e3 * pp.reads_s.get(n, 0.0))
            for n in plan.devices.names if n in t0 or n in t1 or n in pp.device_s]
    assumptions = _assumptions(plan, placement, hw, eff)
    if host_kv:
        assumptions.append(Assumption("-nkvo: the CPU's round trip of a GPU layer",
                                      eff.host_attention_us))
    if pp.transfer_s and extras.pageable_cpu:
        assumptions.append(Assumption("op offload copies from pageable host weights (mmap; --load-mode none "
                                      "pins them)", eff.pageable_copy))
    calibrated = any(a.figure.source is Source.CALIBRATED for a in assumptions)
    return SpeedEstimate(
        tg_tps=1.0 / total0 if total0 else math.inf,
        tg_tps_at_ctx=1.0 / total1 if total1 else math.inf,
        pp_tps=prompt / pp_total if pp_total else math.inf,
        prompt=prompt, n_ctx=ctx.n_ctx_seq, n_ubatch=ctx.n_ubatch, devices=devs,
        n_splits=len(pairs) + 2 * len(host_kv), split_ms=1e3 * split_s,
        pp_transfer_ms=1e3 * pp.transfer_s, pp_split_ms=1e3 * pp.split_s, op_offload=pp.offload,
        bottleneck=_bottleneck(t0, split_s, total0, host_kv_s),
        pp_bottleneck=_pp_bottleneck(pp, pp_total, bool(host_kv)),
        host_kv_layers=len(host_kv), host_kv_ms=1e3 * host_kv_s,
        bottleneck_at_ctx=_bottleneck(t1, split_s, total1, host_kv_s + copy1,
                                      t1.get(CPU, 0.0) - t0.get(CPU, 0.0) if host_kv and ap is plan else 0.0),
        calibrated=calibrated, assumptions=assumptions, depth=max(depth, 0),
        warnings=thread_warnings(hw),
        pp_tps_at_depth=pp_d, tg_tps_at_depth=tg_d)


def tg_tps(plan: Plan, hw: Hardware, *, eff: Efficiencies | None = None,
           placement: Placement | None = None) -> float:
    """Token generation at depth 0 alone (no prompt processing): for previews of a move."""
    eff = eff or defaults_for(plan.dialect)
    placement = placement or plan.placement()
    times = tg_times(plan, placement, hw, eff, weight_bytes_per_token(plan.model, placement), {})
    total = (sum(times.values()) + _split_seconds(plan, hw, eff, token_split_pairs(plan, placement))
             + host_kv_seconds(host_kv_layers(plan, placement), hw, eff))
    return 1.0 / total if total else math.inf


def ubatch_sweep(plan: Plan, hw: Hardware, ubatches: Iterable[int], *, prompt: int = DEFAULT_PROMPT,
                 eff: Efficiencies | None = None) -> list[tuple[int, float]]:
    """pp tokens/s of the plan's placement for each ``-ub`` (``-b`` raised to match where lower)."""
    eff = eff or defaults_for(plan.dialect)
    placement = plan.placement()
    out = []
    for ub in ubatches:
        p = replace(plan, context=replace(plan.context, n_ubatch=ub, n_batch=max(ub, plan.context.n_batch)))
        pp = pp_time(p, placement, hw, eff, prompt, min(ub, prompt))
        total = sum(pp.device_s.values()) + pp.transfer_s + pp.split_s
        out.append((ub, prompt / total if total else math.inf))
    return out
