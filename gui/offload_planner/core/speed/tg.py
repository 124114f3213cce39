"""Token generation at a context depth ``d``: per token each device reads its always-active weights
in full, its routed experts by ``n_expert_used / n_expert``, one row of the token embedding and
its layers' KV cache for ``d`` cells (the engine's own KV sizing, :func:`memory.kv_buffers`);
the time is those bytes over the device's effective bandwidth.  Devices run one after another
along the layers, so the times add, plus every graph split (:mod:`.splits`) and -nkvo's round trips
(:mod:`.nkvo`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from offload_planner.core.devices import DeviceKind
from offload_planner.core.memory import ResolvedContext
from offload_planner.core.placement import CPU, Placement
from offload_planner.core.plan import Plan
from offload_planner.core.roles import ROUTED_EXPERT_ROLES, Role
from offload_planner.core.speed.efficiency import Efficiencies, cpu_cost
from offload_planner.core.speed.hardware import Hardware
from offload_planner.core.speed.rates import _effective_bandwidth, _is_gpu, compute_tflops, cpu_isa_gain
from offload_planner.core.speed.reads import _running, expert_fraction, skipping_devices
from offload_planner.core.speed.sparse_attention import indexer_flops, top_k


@dataclass(frozen=True)
class TokenExtras:
    """What a generated token costs beyond its bytes, from one pass over the placement."""

    cpu_flops: float  # FLOPs of the CPU weights whose kernels cost more than the default
    layers: dict[str, int]  # layers with a running weight, by device
    pageable_cpu: bool  # a CPU weight outside a pinned ``<GPU>_Host`` buffer


def token_extras(plan: Plan, placement: Placement, isa_gain: float = 1.0) -> TokenExtras:
    """``cpu_flops``: one generated token's CPU weight matrices of the types whose CPU kernels cost
    more than the default (:func:`efficiency.cpu_cost` > 1: mainline multiplies the lattice i-quants
    row by row through their ``vec_dot`` with its grid look-ups, the same kernel for one token as for
    a batch), 2 FLOPs a weight, routed experts by ``n_expert_used / n_expert``, weighted by that cost:
    a token of them can take longer to compute than to read (other types' token is bound by its reads,
    every CPU record of the public development set).  ``layers``: how many of the model's layers
    have a running weight on each device.  ``pageable_cpu``: whether a CPU weight is pageable."""
    frac = expert_fraction(plan.model)
    embd, experts, dialect = Role.TOKEN_EMBD, ROUTED_EXPERT_ROLES, plan.dialect
    costs: dict[str, float] = {}
    flops = 0.0
    seen: dict[str, set[int]] = defaultdict(set)
    pageable = False
    for p in _running(placement):
        t = p.tensor
        assert p.device is not None
        if t.layer is not None:
            seen[p.device].add(t.layer)
        if p.device != CPU:
            continue
        pageable = pageable or not (p.buft or "").endswith("_Host")
        if len(t.shape) < 2 or (t.role is embd and not p.copy):
            continue
        cost = costs.get(t.type.name)
        if cost is None:
            cost = costs[t.type.name] = cpu_cost(t.type.name, dialect, isa_gain)
        if cost > 1.0:
            flops += 2.0 * t.n_elements * cost * (frac if t.role in experts else 1.0)
    return TokenExtras(flops, {k: len(v) for k, v in seen.items()}, pageable)


def tg_times(plan: Plan, placement: Placement, hw: Hardware, eff: Efficiencies, weights: dict[str, int],
              kv: dict[str, int], attn: dict[str, float] | None = None,
              extras: TokenExtras | None = None) -> dict[str, float]:
    """Seconds per token per device: its weights over its effective bandwidth (the CPU's: or, where
    slower, their FLOPs over its compute, :attr:`TokenExtras.cpu_flops`; a GPU's: plus
    ``gpu_layer_us`` for each of its layers, :attr:`TokenExtras.layers`), plus its attention:
    the KV bytes over the bandwidth or, where slower, the attention FLOPs (``attn``,
    :func:`attention_flops_at`) over its attention compute (an MLA model's 128 heads share one
    576-wide cell: about 240 FLOPs a byte, compute-bound on a CPU and on most GPUs)."""
    times: dict[str, float] = {}
    attn = attn or {}
    extras = extras or token_extras(plan, placement, cpu_isa_gain(hw))
    per_layer = eff.gpu_layer_us.value * 1e-6
    for name in dict.fromkeys([*weights, *kv]):  # first-seen order, whatever the hash seed
        d = hw[name]
        bw = _effective_bandwidth(d, eff)
        kv_s = kv.get(name, 0) / (bw * 1e9)
        flops = attn.get(name, 0.0)
        if flops:
            tf = (d.tflops.value * eff.cpu_attention.value * d.share if not _is_gpu(d)
                  else compute_tflops(d, eff))
            kv_s = max(kv_s, flops / (tf * 1e12))
        w_s = weights.get(name, 0) / (bw * 1e9)
        if _is_gpu(d):
            w_s += extras.layers.get(name, 0) * per_layer
        if name == CPU and d.kind is DeviceKind.CPU and w_s and extras.cpu_flops:
            w_s = max(w_s, extras.cpu_flops / (compute_tflops(d, eff) * 1e12))
        times[name] = w_s + kv_s
    return times


def attention_flops_at(plan: Plan, placement: Placement, ctx: ResolvedContext,
                       depth: int) -> dict[str, float]:
    """FLOPs of one generated token's attention over ``depth`` cells, per device: 2 x heads x (K + V
    dims) a cell a layer (MLA: its absorbed 576 + 512 dims), a sliding-window layer over at most its
    cache's cells; on the device holding each layer's KV (the CPU with -nkvo)."""
    if depth <= 0:
        return {}
    s = plan.model.summary
    out: dict[str, float] = defaultdict(float)
    k = top_k(plan.model, plan.context)
    sparse = skipping_devices(plan.devices, plan.context) if k else frozenset()
    indexer = indexer_flops(plan.model, depth) if k else {}
    for il in range(s.n_layer - s.n_nextn):
        dev = placement.layer_device(il) if plan.context.offload_kqv else CPU
        cells = min(depth, ctx.swa_cells) if s.swa_layers[il] else min(depth, k) if dev in sparse else depth
        attn = 2.0 * s.per_layer(s.n_head, il) * (s.head_dim_k + s.head_dim_v) * cells
        out[dev] += attn + indexer.get(il, 0.0)
    return dict(out)
