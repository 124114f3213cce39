"""What one generated token reads, per device: its weights (the always-active ones in full, its routed
experts by ``n_expert_used / n_expert``, one row of the token embedding) and its KV cache at a
context depth (the engine's own KV sizing, :func:`memory.kv_buffers`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from offload_planner.core.devices import DeviceKind, DeviceSet
from offload_planner.core.dsa import indexer_kv_buffers
from offload_planner.core.memory import ContextParams, ResolvedContext, kv_buffers
from offload_planner.core.model import Model
from offload_planner.core.placement import Placed, Placement
from offload_planner.core.plan import Plan
from offload_planner.core.roles import ROUTED_EXPERT_ROLES, Role
from offload_planner.core.speed.sparse_attention import top_k


def expert_fraction(model: Model) -> float:
    s = model.summary
    return s.n_expert_used / s.n_expert if s.n_expert and s.n_expert_used else 1.0


def _running(placement: Placement) -> tuple[Placed, ...]:
    """The placed tensors that take part in a normal forward pass (NextN/MTP blocks do not); the last
    placement's answer is kept (an estimate asks four times; a placement's items are never changed)."""
    items = placement.items
    last = _RUNNING[0]
    if last[0] is items:
        return last[1]
    nextn = Role.NEXTN
    got = tuple(p for p in items if p.device is not None and p.tensor.role is not nextn)
    _RUNNING[0] = (items, got)
    return got


#: :func:`_running`'s last placement items and answer
_RUNNING: list[tuple[object, tuple[Placed, ...]]] = [(None, ())]


def token_bytes(p: Placed, frac: float) -> int:
    """Bytes of this weight one generated token reads: one row of the embedding, the experts the
    router picks, everything else in full (the output copy of tied embeddings is the output)."""
    t = p.tensor
    if t.role is Role.TOKEN_EMBD and not p.copy:
        rows = t.shape[1] if len(t.shape) > 1 else 1
        return t.nbytes // max(rows, 1)
    if t.role.is_routed_expert:
        return int(t.nbytes * frac)
    return t.nbytes


def weight_bytes_per_token(model: Model, placement: Placement) -> dict[str, int]:
    frac = expert_fraction(model)
    out: dict[str, int] = defaultdict(int)
    embd, experts = Role.TOKEN_EMBD, ROUTED_EXPERT_ROLES
    for p in _running(placement):
        assert p.device is not None
        role = p.tensor.role
        # token_bytes inlined for its common cases (a big model has ~1,000 weights)
        if role is embd and not p.copy:
            out[p.device] += token_bytes(p, frac)
        elif role in experts:
            out[p.device] += int(p.tensor.nbytes * frac)
        else:
            out[p.device] += p.tensor.nbytes
    return dict(out)


def kv_bytes_at(model: Model, placement: Placement, params: ContextParams, ctx: ResolvedContext,
                plan: Plan, depth: int) -> dict[str, int]:
    """KV bytes one token reads at ``depth`` cells, per device (:func:`kv_read_at`)."""
    return kv_read_at(model, placement, params, ctx, plan.devices, depth)


#: Backends whose one-token flash attention skips masked K/V cells: ggml-cpu (``mv == -INFINITY``,
#: ``ops.cpp``), Metal (``skip -INF mask`` per block, ``fa_vec_common.metal``) and RPC (ggml-rpc-server's
#: default backend is the CPU).  CUDA/ROCm (no mask scan below 1024 queries, ``fattn-common.cuh``),
#: Vulkan (``use_mask_opt`` from 32 query rows) and SYCL read every cell up to ``n_kv``.
SKIPS_MASKED_CELLS = frozenset({DeviceKind.CPU, DeviceKind.METAL, DeviceKind.RPC})


def skipping_devices(devices: DeviceSet, params: ContextParams) -> frozenset[str]:
    """The devices whose one-token attention skips the cells its mask holds at ``-inf`` (flash
    attention only: without it ``soft_max`` follows the whole KQ product)."""
    if not params.flash_attn:
        return frozenset()
    return frozenset(d.name for d in devices if d.kind in SKIPS_MASKED_CELLS)


def kv_read_at(model: Model, placement: Placement, params: ContextParams, ctx: ResolvedContext,
               devices: DeviceSet, depth: int, cached: range | None = None) -> dict[str, int]:
    """KV bytes one token of one sequence reads at ``depth`` cells, per device: the engine's KV
    sizing (:func:`memory.kv_buffers`) of ``depth`` cells, where a sliding-window layer reads
    ``min(depth, its cache's cells)``: its cache (``ctx.swa_cells``, ``n_swa x sequences + -ub``
    padded to 256; ``--swa-full``: the context) is a ring whose masked cells are overwritten only
    when reused, so once it wraps the attention spans all of it (``llama_kv_cache::get_n_kv``);
    with flash attention on a backend that skips masked cells (:data:`SKIPS_MASKED_CELLS`) it reads
    ``min(depth, n_swa)``.  DeepSeek Sparse Attention on such a backend reads its MLA cache at
    ``min(depth, top_k)`` cells, its indexer's keys at ``depth`` (:mod:`.sparse_attention`)."""
    if depth <= 0:
        return {}
    s = model.summary

    def read(swa_cells: int, cells: int = depth) -> dict[str, int]:
        sub = replace(ctx, n_ctx=cells, n_ctx_seq=cells, n_stream=1, swa_cells=swa_cells)
        out: dict[str, int] = defaultdict(int)
        for b in kv_buffers(model, placement, sub, params, devices, cached=cached):
            out[b.device] += b.bytes
        return dict(out)

    k = top_k(model, params)
    if k and depth > k and (skips := skipping_devices(devices, params)):
        return _sparse_read(read(depth), read(k, k), model, placement, ctx, params, devices, cached, depth, k,
                            skips)
    ring = read(min(depth, ctx.swa_cells))
    if not (s.has_swa and s.n_swa and params.flash_attn and ctx.swa_cells > s.n_swa):
        return ring
    window = read(min(depth, s.n_swa))
    skipping = skipping_devices(devices, params)
    return {name: window[name] if name in skipping else n for name, n in ring.items()}


def _sparse_read(dense: dict[str, int], at_k: dict[str, int], model: Model, placement: Placement,
                 ctx: ResolvedContext, params: ContextParams, devices: DeviceSet, cached: range | None,
                 depth: int, k: int, skips: frozenset[str]) -> dict[str, int]:
    """``dense`` (every cache at ``depth`` cells), where a device skips masked cells: its caches at
    ``k`` cells (``at_k``) with the indexer's keys at ``depth`` instead of ``k``."""

    def indexer(cells: int) -> dict[str, int]:
        sub = replace(ctx, n_ctx=cells, n_ctx_seq=cells, n_stream=1)
        return {b.device: b.bytes for b in indexer_kv_buffers(model, placement, sub, params, devices, cached)}

    idx_depth, idx_k = indexer(depth), indexer(k)
    return {name: (at_k.get(name, 0) - idx_k.get(name, 0) + idx_depth.get(name, 0)) if name in skips else n
            for name, n in dense.items()}
