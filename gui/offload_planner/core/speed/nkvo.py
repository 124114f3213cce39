"""-nkvo: the KV cache and the attention ops on the CPU (a GPU layer's round trips to the host), or
with flash attention the host cache's K/V views copied to the GPU whose attention reads them."""

from __future__ import annotations

from dataclasses import dataclass, replace

from offload_planner.core.placement import CPU, Placement
from offload_planner.core.plan import Plan
from offload_planner.core.roles import Role
from offload_planner.core.speed.efficiency import Efficiencies
from offload_planner.core.speed.hardware import Hardware
from offload_planner.core.speed.rates import _link
from offload_planner.core.speed.reads import _running


@dataclass(frozen=True)
class HostKV:
    """A layer whose attention weights are on ``device`` (not the CPU) while -nkvo keeps its KV cache
    on the CPU: llama.cpp pins the attention output to the CPU backend (llama-graph.cpp
    ``build_attn_mha``, ``!cparams.offload_kqv``) and the scheduler runs every node from the KV store
    to it there (``ggml_backend_sched_split_graph``: the K/V stores are views of the host cache, pass
    1 ``1.vsrc``; "expand rest" gives the CPU the attention ops between them).  So two graph splits a
    layer: Q and the new K and V rows (f32) down to the host, the attention output back."""

    device: str
    down: int  # bytes a token: Q, K and V rows to the host
    up: int  # bytes a token: the attention output back


def nkvo_attention_on_gpu(plan: Plan) -> bool:
    """-nkvo whose attention op still runs on each layer's GPU, the host cache's K/V views copied to
    it (the dialect's rule, :meth:`Dialect.nkvo_attention_on_gpu`: with flash attention)."""
    return not plan.context.offload_kqv and plan.dialect.nkvo_attention_on_gpu(plan.context.flash_attn)


def attention_plan(plan: Plan) -> Plan:
    """The plan as its attention sees the KV cache: where the attention op runs on the layer's GPU
    (:func:`nkvo_attention_on_gpu`), its KV is read there (after the copy) as without -nkvo."""
    if not nkvo_attention_on_gpu(plan):
        return plan
    return replace(plan, context=replace(plan.context, offload_kqv=True))


def kv_copy_seconds(kv: dict[str, int], hw: Hardware, eff: Efficiencies) -> float:
    """The host cache's K/V views copied to the GPUs whose attention reads them (``kv``: bytes per
    device, :func:`nkvo_attention_on_gpu`), over each one's link."""
    return sum(n / (hw[d].link.value * eff.link.value * 1e9) for d, n in kv.items() if d != CPU)


def host_kv_layers(plan: Plan, placement: Placement) -> list[HostKV]:
    """The layers -nkvo sends to the CPU for their KV store (and attention, unless
    :func:`nkvo_attention_on_gpu`: then only the K and V rows go down; the cache's views come back,
    :func:`kv_copy_seconds`).  None without -nkvo, nor for a layer whose attention weights are on the
    CPU already: it runs there anyway."""
    if plan.context.offload_kqv:
        return []
    gpu_attn = nkvo_attention_on_gpu(plan)
    s = plan.model.summary
    trunk = s.n_layer - s.n_nextn
    attn: dict[int, str] = {}
    for p in _running(placement):
        t = p.tensor
        if t.layer is not None and t.layer < trunk and t.role is Role.ATTENTION and not p.copy:
            assert p.device is not None
            attn.setdefault(t.layer, p.device)
    out = []
    for il, dev in sorted(attn.items()):
        if dev == CPU:
            continue
        nh, nkv = s.per_layer(s.n_head, il), s.per_layer(s.n_head_kv, il)
        q = 0 if gpu_attn else nh * s.head_dim_k
        out.append(HostKV(dev, 4 * (q + nkv * (s.head_dim_k + s.head_dim_v)),
                          0 if gpu_attn else 4 * nh * s.head_dim_v))
    return out


def host_kv_seconds(layers: list[HostKV], hw: Hardware, eff: Efficiencies, tokens: float = 1.0) -> float:
    """The round trips of ``layers`` for a batch of ``tokens``: two graph splits each (their latency
    and activations over the device's link to the host) plus the CPU's side of it
    (``host_attention_us``: a synchronous copy down, the CPU's threads woken for the attention graph,
    the copy up).  The attention's own work (the KV read at depth, its FLOPs) is the CPU's device
    time (:func:`kv_read_at`, :func:`attention_flops_at`)."""
    out = 0.0
    known: dict[str, tuple[float, float]] = {}
    rt = eff.host_attention_us.value * 1e-6
    for h in layers:
        if h.device not in known:
            known[h.device] = _link(hw[h.device], hw[CPU], eff)
        gb, lat = known[h.device]
        out += 2 * lat + rt + (h.down + h.up) * tokens / (gb * 1e9)
    return out
