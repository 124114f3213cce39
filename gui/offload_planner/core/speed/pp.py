"""Prompt processing of ``N`` tokens in ``-ub`` micro-batches: each device computes
``2 x params x tokens`` FLOPs for its weights (routed experts by ``n_expert_used / n_expert``)
plus attention over the cache, at its effective TFLOPS, and reads its weights once per
micro-batch; at or above the op-offload batch (``compute.OP_OFFLOAD_MIN_BATCH``, 32 for CUDA;
ik_llama.cpp: MoE ops only when ``batch x n_expert_used >= 32 x n_expert``) the host-resident
weights are copied to the first GPU that offloads, once per micro-batch, over its host link, and
computed there.  Mainline copies only the experts the batch routes to (``used_ids`` in
``ggml_backend_sched_compute_splits``): with uniform routing a share ``1 - (1 - k/n)^batch``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from offload_planner.core.compute import OP_OFFLOAD_MIN_BATCH, model_gpus
from offload_planner.core.compute.scheduler import CUDA_LIKE
from offload_planner.core.ik_repack import interleaved_off_gpu, repacked_off_gpu
from offload_planner.core.memory import resolve_context
from offload_planner.core.placement import CPU, Placed, Placement
from offload_planner.core.plan import Plan
from offload_planner.core.roles import ROUTED_EXPERT_ROLES, Role
from offload_planner.core.speed.cpu_isa import Isa
from offload_planner.core.speed.efficiency import (
    REPACK_BUFT,
    TILED_MIN_ROWS,
    Efficiencies,
    cpu_pp_cost,
    defaults_for,
    gpu_rows_factor,
    gpu_rows_max_gain,
)
from offload_planner.core.speed.hardware import Hardware
from offload_planner.core.speed.nkvo import (
    host_kv_layers,
    host_kv_seconds,
    kv_copy_seconds,
    nkvo_attention_on_gpu,
)
from offload_planner.core.speed.rates import (
    _effective_bandwidth,
    _is_gpu,
    compute_tflops,
    computes_on_cpu,
    cpu_isa,
    cpu_isa_gain,
)
from offload_planner.core.speed.reads import _running, expert_fraction
from offload_planner.core.speed.splits import _pp_splits, token_split_pairs

if TYPE_CHECKING:
    from offload_planner.core.dialects.base import Dialect


@dataclass
class _Work:
    """What one device's weights cost a micro-batch, summed once per placement: elements and bytes of
    four parts, by index ``routed expert | 2 x refused`` (always-active matrices or routed experts; ops
    the GPU may take, or host weights whose ops it refuses and so never offloads: ik's row-interleaved
    types, core.ik_repack)."""

    el: list[float] = field(default_factory=lambda: [0.0] * 4)
    nbytes: list[float] = field(default_factory=lambda: [0.0] * 4)
    cpu_el: list[float] = field(default_factory=lambda: [0.0] * 4)  # el x the type's CPU cost (cpu_cost)
    #: el x the type's CPU cost when a matrix multiplies fewer rows than the tiled matmul takes
    #: (efficiency.TILED_MIN_ROWS: the kernels of builds before it)
    cpu_el_few: list[float] = field(default_factory=lambda: [0.0] * 4)
    #: bytes as op offload's copy costs them: a host weight outside a pinned buffer counts
    #: 1 / ``Efficiencies.pageable_copy`` (:func:`copy_weight`)
    copy_nb: list[float] = field(default_factory=lambda: [0.0] * 4)

    def parts(self) -> Iterator[tuple[float, float, bool, bool, float, float, float]]:
        """(elements, bytes, routed expert, may be offloaded, elements weighted by their CPU cost, bytes
        weighted by their copy cost, elements weighted by their CPU cost below the tiled matmul's rows)."""
        for i in range(4):
            yield (self.el[i], self.nbytes[i], bool(i & 1), not i & 2, self.cpu_el[i], self.copy_nb[i],
                   self.cpu_el_few[i])


def refused_by_gpu(plan: Plan, placement: Placement) -> frozenset[str]:
    """Host weights whose ops no GPU takes (ik: a file's row-interleaved type the build's CUDA backend
    cannot multiply, and with -rtr every weight repacked into such a type), as ``compute_ik`` rules."""
    host = [(it.tensor.name, it.tensor.shape, it.tensor.type.name) for it in placement.items
            if it.device == CPU and not it.copy]
    refused = interleaved_off_gpu(host, plan.dialect.cuda_multiplies_r4)
    return (refused | repacked_off_gpu(host)) if plan.context.repack else refused


def copy_weight(buft: str | None, eff: Efficiencies) -> float:
    """Cost of a host weight's byte in op offload's copy to the GPU against a pinned one (1): a
    ``<GPU>_Host`` buffer is pinned; a plain CPU buffer (``CPU``, mmap'd ``CPU_Mapped``, repacked
    ``CPU_REPACK``) is pageable, copied through the driver's staging buffer at ``pageable_copy`` of the
    rate (llama-model-loader.cpp: with mmap, CPU weights never take the host buffer type)."""
    return 1.0 if buft is not None and buft.endswith("_Host") else 1.0 / eff.pageable_copy.value


#: The roles of the last layer that run after its rows are cut to the outputs: the model graphs select
#: ``inp_out_ids`` once the last layer's attention is done (src/models/llama.cpp, qwen3moe.cpp, ...:
#: ``if (il == n_layer - 1 && inp_out_ids) { cur = ggml_get_rows(ctx0, cur, inp_out_ids); ...}``), so
#: that layer's FFN and the output matrix multiply only the tokens whose logits are asked for: a
#: prompt's last one (llama-batch.cpp: "if no logits array is given, default to only the last token
#: being an output"; llama-server asks for the last prompt token's alone).
OUTPUT_ROWS_ROLES = frozenset({Role.ROUTER, Role.FFN_DENSE, Role.SHARED_EXPERT, *ROUTED_EXPERT_ROLES})


def output_rows_only(p: Placed, last_layer: int) -> bool:
    """Whether a prompt's micro-batch multiplies this weight for its output rows alone (one token a
    prompt, none in the micro-batches before its last): the output matrix (or the tied embedding's
    output copy) and the last layer's FFN (:data:`OUTPUT_ROWS_ROLES`)."""
    t = p.tensor
    if t.role is Role.OUTPUT or (t.role is Role.TOKEN_EMBD and p.copy):
        return True
    return t.layer == last_layer and t.role in OUTPUT_ROWS_ROLES


def _work(placement: Placement, dialect: Dialect, refused: frozenset[str] = frozenset(),
          eff: Efficiencies | None = None, isa_gain: float = 1.0, last_layer: int = -1,
          isa: Isa | None = None) -> dict[str, _Work]:
    """What each device's weights cost a prompt's micro-batch (``last_layer``: the index of the model's
    last layer in a forward pass, whose FFN a prompt runs for its output token alone, as the output
    matrix: :func:`output_rows_only`; that one token's reads and FLOPs are left out, a generated
    token's worth of a few weights a prompt; ``isa``: the CPU's tier, for the tiled matmul)."""
    out: dict[str, _Work] = defaultdict(_Work)
    costs: dict[tuple[str, str | None, bool], tuple[float, float, float]] = {}  # (type, buft, routed) ->
    eff = eff or defaults_for(dialect)
    embd, experts = Role.TOKEN_EMBD, ROUTED_EXPERT_ROLES  # looked up once, not per tensor
    for p in _running(placement):
        t = p.tensor
        if len(t.shape) < 2 or (t.role is embd and not p.copy):
            continue  # 1-D tensors (norms, biases) cost nothing here; the embedding is a row lookup
        if output_rows_only(p, last_layer):
            continue
        assert p.device is not None
        w = out[p.device]
        i = (t.role in experts) | (2 if refused and t.name in refused else 0)  # the part (_Work)
        n, nb = t.n_elements, t.nbytes
        key = (t.type.name, p.buft, bool(i & 1))
        cost = costs.get(key)
        if cost is None:
            repacked = p.buft == REPACK_BUFT
            cost = costs[key] = (cpu_pp_cost(key[0], dialect, isa_gain, key[2], repacked, isa),
                                 copy_weight(p.buft, eff),
                                 cpu_pp_cost(key[0], dialect, isa_gain, key[2], repacked, isa, rows=1.0))
        w.el[i] += n
        w.nbytes[i] += nb
        w.cpu_el[i] += n * cost[0]
        w.copy_nb[i] += nb * cost[1]
        w.cpu_el_few[i] += n * cost[2]
    return out


def _offload_gpu(plan: Plan, placement: Placement) -> tuple[str | None, int | None]:
    """The first of the model's GPUs that takes host-weight ops, and its batch threshold (the weights it
    refuses are told apart by ``refused_by_gpu``)."""
    if not plan.context.op_offload:
        return None, None
    for g in model_gpus(plan.devices, placement):
        n = OP_OFFLOAD_MIN_BATCH.get(g.kind)
        if n is not None:
            return g.name, n
    return None, None


@dataclass
class _PPParts:
    device_s: dict[str, float]
    transfer_s: float
    split_s: float
    offload: bool
    attn_s: dict[str, float] = field(default_factory=dict)  # of device_s: attention FLOPs over compute
    host_kv_s: float = 0.0  # of split_s: -nkvo's round trips and cache copies
    reads_s: dict[str, float] = field(default_factory=dict)  # of device_s: a CPU's reads (added to compute)


#: a micro-batch's weights: FLOPs and bytes read per device, bytes copied to the op-offload GPU
_Weighed = tuple[dict[str, float], dict[str, float], float]


def _weighed(plan: Plan, hw: Hardware, work: dict[str, _Work],
             offload_to: tuple[str | None, int | None]) -> Callable[[int], _Weighed]:
    """What the weights cost a micro-batch of ``u`` tokens (worked out once per ``u``: a prompt's
    micro-batches share it; their attention and KV reads differ)."""
    memo: dict[int, _Weighed] = {}

    def of(u: int) -> _Weighed:
        got = memo.get(u)
        if got is None:
            got = memo[u] = _weights_work(plan, hw, work, offload_to, u)
        return got

    return of


def _weights_work(plan: Plan, hw: Hardware, work: dict[str, _Work], offload_to: tuple[str | None, int | None],
                  u: int) -> _Weighed:
    s = plan.model.summary
    frac = expert_fraction(plan.model)
    gpu, threshold = offload_to
    hit = 1.0 - (1.0 - frac) ** u  # share of experts at least one token of the batch routes to
    flops: dict[str, float] = defaultdict(float)
    reads: dict[str, float] = defaultdict(float)
    transfer = 0.0
    dense_off = gpu is not None and threshold is not None and u >= threshold
    whole = plan.dialect.copies_whole_experts
    gpu_like = {n: _is_gpu(hw[n]) for n in hw.devices}
    on_cpu_kernels = {n: n == CPU or computes_on_cpu(hw[n]) for n in hw.devices}
    max_gain = {n: gpu_rows_max_gain(plan.dialect, hw[n].kind) for n in hw.devices}
    exp_off = dense_off and (not whole or u * s.n_expert_used >= (threshold or 0) * s.n_expert)
    for dev, w in work.items():
        for el, nb, is_exp, may, cpu_el, copy_nb, cpu_el_few in w.parts():
            if not el:
                continue
            where = dev
            if dev == CPU and may and (exp_off if is_exp else dense_off):
                assert gpu is not None
                # mainline copies only the experts the batch routes to (ggml_backend_sched_compute_splits)
                transfer += copy_nb * (hit if is_exp and not whole else 1.0)
                where = gpu
            rows = u * frac / hit if is_exp else u  # an expert hit multiplies the tokens routed to it
            on_cpu = cpu_el if rows >= TILED_MIN_ROWS else cpu_el_few
            kernels = on_cpu if on_cpu_kernels.get(where, where == CPU) else el
            work_flops = 2.0 * u * kernels * (frac if is_exp else 1.0)
            if gpu_like[where]:  # rows a matrix multiplies: the tokens routed to an expert it hits
                work_flops /= gpu_rows_factor(rows, max_gain[where])
            flops[where] += work_flops
            reads[where] += nb * (hit if is_exp else 1.0)
    return flops, reads, transfer


#: The cache types ggml-cpu's tiled flash attention takes (ops.cpp
#: ``ggml_compute_forward_flash_attn_ext_f16``: ``kv_is_f32_or_f16 = (k->type == GGML_TYPE_F32 ||
#: k->type == GGML_TYPE_F16)``, and ``k->type == v->type``)
TILED_FA_KV_TYPES = frozenset({"f16", "f32"})


def cpu_attention_cost(plan: Plan, eff: Efficiencies) -> float:
    """Cost of a prompt's attention FLOP on the CPU against a matrix product's (1).

    With flash attention over a quantized cache (or K and V of different types) mainline's CPU runs
    the kernel a generated token runs, one query row at a time, for a prompt's batch too: the pinned
    build takes its tiled kernel only for an F32/F16 cache whose K and V share a type (ops.cpp
    ``use_tiled = !use_ref && (q->type == GGML_TYPE_F32 && kv_is_f32_or_f16 && k->type == v->type &&
    neq1 >= Q_TILE_SZ)``, else ``ggml_compute_forward_flash_attn_ext_f16_one_chunk``, which turns each
    quantized V row to float per query and cell).  That kernel's rate is a generated token's
    (``cpu_attention``, from a public mainline sweep; an F16 cache's, so an upper bound for a quantized
    one).  Partial offload with flash attention and a quantized cache was reported far slower in prompt
    processing than with an F16 cache (https://github.com/ggml-org/llama.cpp/pull/8542: "Gemma 2 with
    Flash Attention and quantized KV Cache slows partial offloading down a pompt processing lot. FA
    without quantized KV cache is fine though.").  ik_llama.cpp's own CPU kernels are not this one."""
    ctx = plan.context
    tiled = ctx.type_k == ctx.type_v and ctx.type_k in TILED_FA_KV_TYPES
    if not ctx.flash_attn or tiled or plan.dialect.fast_cpu_kernels:
        return 1.0
    return max(1.0, eff.cpu_compute.value / eff.cpu_attention.value)


@dataclass(frozen=True)
class HostAttention:
    """The CPU layers whose attention an op-offloaded micro-batch runs on the op-offload GPU: their output
    projection ``wo`` (a host weight) goes to that GPU in the scheduler's pass 1 (``1.off``: the batch is at
    least the offload batch), the attention op has no weight of its own and is left unassigned there
    (flash attention skips the weights rule, the non-flash ``KQ`` multiplies the cache's views, not weights),
    and "expand gpu up" from ``wo`` gives it the GPU (ggml-backend.cpp ``ggml_backend_sched_split_graph``,
    pass 2; the K/V stores stay on the CPU, ``1.vsrc``).  The host cache's K/V views become split inputs,
    copied every micro-batch from the plain CPU buffer the cache of a CPU layer takes (llama-kv-cache.cpp:
    ``ggml_backend_cpu_buffer_type()`` unless the layer is offloaded).  Below the offload batch the layer's
    ops stay on the CPU (a generated token's too).  -nkvo without flash attention pins the attention output
    to the CPU (``build_attn_mha``), and ik_llama.cpp's scheduler and graph callback have the same pass and
    pins.  With flash attention the GPU must take the cache's type: CUDA's (and ROCm's, the same
    fattn.cu) ``ggml_cuda_fattn_kv_type_supported`` takes F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0;
    another type leaves the op unsupported there, and the scheduler keeps it on the CPU (pass 2 sets a
    backend only ``if supported``).  Other GPU backends' support is not checked: their CPU layers keep
    the CPU's attention.  ``layers``: such layers by sliding window; ``kv_share``: their share of the
    CPU's KV bytes."""

    layers: dict[bool, int]
    kv_share: float
    threshold: int


#: The cache types CUDA's flash attention takes (ggml-cuda/fattn.cu ``ggml_cuda_fattn_kv_type_supported``)
CUDA_FA_KV_TYPES = frozenset({"f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0"})


def _gpu_takes_attention(plan: Plan, gpu: str) -> bool:
    """Whether the op-offload GPU supports the attention op of this plan (:class:`HostAttention`)."""
    dev = plan.devices.by_name(gpu)
    if dev is None or dev.kind not in CUDA_LIKE:
        return False
    ctx = plan.context
    return not ctx.flash_attn or (ctx.type_k in CUDA_FA_KV_TYPES and ctx.type_v in CUDA_FA_KV_TYPES)


def host_attention(plan: Plan, placement: Placement, refused: frozenset[str],
                   offload_to: tuple[str | None, int | None]) -> HostAttention | None:
    """The CPU layers whose prompt attention follows op offload to the GPU (:class:`HostAttention`), None
    without an op-offload GPU.  A layer whose attention weights the GPU refuses (ik's row-interleaved
    types, :func:`refused_by_gpu`) keeps its attention on the CPU."""
    gpu, threshold = offload_to
    if gpu is None or threshold is None or not _gpu_takes_attention(plan, gpu):
        return None
    if not plan.context.offload_kqv and not nkvo_attention_on_gpu(plan):
        return None
    s = plan.model.summary
    trunk = s.n_layer - s.n_nextn
    kept = {it.tensor.layer for it in placement.items
            if it.tensor.name in refused and it.tensor.role is Role.ATTENTION}
    layers: dict[bool, int] = defaultdict(int)
    on_cpu = 0
    for il in range(trunk):
        if placement.layer_device(il) != CPU:
            continue
        on_cpu += 1
        if il not in kept:
            layers[s.swa_layers[il]] += 1
    moved = sum(layers.values())
    return HostAttention(dict(layers), moved / on_cpu, threshold) if moved else None


def _microbatch(plan: Plan, hw: Hardware, eff: Efficiencies, weighed: Callable[[int], _Weighed],
                attn_layers: dict[tuple[str, bool], int], u: int, start: int, splits: Callable[[int], float],
                gpu: str | None, kv_cell: dict[str, float], swa_cells: float = math.inf,
                flash_attn: bool = True, rates: dict[str, tuple[float, float]] | None = None,
                host_attn: HostAttention | None = None) -> _PPParts:
    """Seconds of one micro-batch of ``u`` tokens after ``start`` tokens in the cache (``kv_cell``:
    KV bytes per cell per device; the micro-batch's attention reads its ``start + u`` cells;
    ``attn_layers``: layers by device and sliding window, whose queries attend at most the
    ``swa_cells`` of their cache; ``weighed``: :func:`_weighed`; ``splits``: :func:`_pp_splits`;
    ``flash_attn``: a query's product runs over the cells it sees, half the batch's own on average (the
    flash-attention kernels skip the causal mask's masked cells and tiles); without it, ``KQ =
    mul_mat(k, q)`` and ``KQV`` run over every cell of the cache's view, the mask applied after them
    (llama-graph.cpp ``build_attn_mha``: ``ggml_soft_max_ext(kq, kq_mask, ...)``);
    ``gpu``: the op-offload GPU; ``rates``: each device's effective GB/s and FLOP/s, kept across a
    prompt's micro-batches; ``host_attn``: the CPU layers whose attention an offloaded micro-batch runs on
    ``gpu``, their K/V views copied to it, :class:`HostAttention`)."""
    s = plan.model.summary
    rates = {} if rates is None else rates
    weights_flops, weights_reads, transfer = weighed(u)
    flops: dict[str, float] = defaultdict(float, weights_flops)
    reads: dict[str, float] = defaultdict(float, weights_reads)
    heads = max(s.n_head) if isinstance(s.n_head, list) else s.n_head
    per_cell = 2.0 * heads * (s.head_dim_k + s.head_dim_v) * u  # the micro-batch against one cell
    attn: dict[str, float] = defaultdict(float)
    seen = start + (u / 2 if flash_attn else u)  # a query attends the mean of start + u / 2 cells
    moved_kv = 0.0
    if host_attn is not None and gpu is not None and u >= host_attn.threshold:
        attn_layers = dict(attn_layers)
        for swa, n in host_attn.layers.items():
            attn_layers[(CPU, swa)] -= n
            attn_layers[(gpu, swa)] = attn_layers.get((gpu, swa), 0) + n
        moved_kv = kv_cell.get(CPU, 0.0) * host_attn.kv_share * (start + u)
    for (dev, swa), n in attn_layers.items():
        attn[dev] += per_cell * (min(seen, swa_cells) if swa else seen) * n
    per_query = cpu_attention_cost(plan, eff)
    for dev in attn:
        if computes_on_cpu(hw[dev]):
            attn[dev] *= per_query
        flops[dev] += attn[dev]
    for dev, per_cell in kv_cell.items():
        reads[dev] += per_cell * (start + u)
    if moved_kv:  # the host cache's views read by the GPU's attention, copied from pageable memory
        assert gpu is not None
        reads[CPU] -= moved_kv
        reads[gpu] += moved_kv
        transfer += moved_kv / eff.pageable_copy.value
    device_s: dict[str, float] = {}
    attn_s: dict[str, float] = {}
    reads_s: dict[str, float] = {}
    for name in dict.fromkeys([*flops, *reads]):  # first-seen order: ties name the same device every run
        d = hw[name]
        rate = rates.get(name)
        if rate is None:
            rate = rates[name] = (_effective_bandwidth(d, eff), compute_tflops(d, eff) * 1e12)
        bw, tf = rate
        # a GPU overlaps its reads with its compute (warps in flight); a CPU's threads both stream the
        # weights and multiply them (ggml-cpu has no copy engine): their times add
        if computes_on_cpu(d):
            reads_s[name] = reads[name] / (bw * 1e9)
            device_s[name] = flops[name] / tf + reads_s[name]
        else:
            device_s[name] = max(flops[name] / tf, reads[name] / (bw * 1e9))
        attn_s[name] = attn.get(name, 0.0) / tf
    transfer_s = 0.0
    if gpu is not None and transfer:
        transfer_s = transfer / (hw[gpu].link.value * eff.link.value * 1e9)
    return _PPParts(device_s, transfer_s, splits(u), transfer > 0, attn_s, reads_s=reads_s)


def pp_time(plan: Plan, placement: Placement, hw: Hardware, eff: Efficiencies, prompt: int,
            n_ubatch: int, pairs: list[tuple[str, str]] | None = None, *, depth: int = 0,
            kv_cell: dict[str, float] | None = None) -> _PPParts:
    """Seconds to process ``prompt`` tokens in micro-batches of ``n_ubatch`` after ``depth`` tokens
    already in the cache (attention over them; ``kv_cell``: KV bytes per cell per device, read by
    each micro-batch's attention, None: not counted).  A micro-batch of more than one token computes
    with ``hw``'s batch figures (``-tb``: :meth:`Hardware.for_tokens`; src/llama-context.cpp:1463
    ``graph_compute(..., ubatch.n_tokens > 1)``), one of a single token with ``-t``'s."""
    pairs = token_split_pairs(plan, placement) if pairs is None else pairs
    s = plan.model.summary
    refused = refused_by_gpu(plan, placement)
    work = _work(placement, plan.dialect, refused, eff, cpu_isa_gain(hw), s.n_layer - s.n_nextn - 1,
                 cpu_isa(hw))
    attn_layers: dict[tuple[str, bool], int] = defaultdict(int)
    on_gpu = nkvo_attention_on_gpu(plan)
    for il in range(s.n_layer - s.n_nextn):
        kv_dev = placement.layer_device(il) if plan.context.offload_kqv or on_gpu else CPU
        attn_layers[(kv_dev, s.swa_layers[il])] += 1
    offload_to = _offload_gpu(plan, placement)
    host_attn = host_attention(plan, placement, refused, offload_to)
    # a sliding-window layer's cache: a ring of swa_cells (n_swa x sequences + -ub, padded)
    swa_cells = resolve_context(plan.context, s.n_ctx_train, s.n_swa).swa_cells if s.has_swa else math.inf
    host_kv = host_kv_layers(plan, placement)
    total = _PPParts(defaultdict(float), 0.0, 0.0, False, defaultdict(float), reads_s=defaultdict(float))
    splits = _pp_splits(plan, hw, eff, pairs)
    weighed = _weighed(plan, hw, work, offload_to)
    start = depth
    # a device's figures: the same for every micro-batch of more than one token (-tb), and of one (-t)
    rates: dict[bool, dict[str, tuple[float, float]]] = {True: {}, False: {}}
    while start < depth + prompt:
        u = min(n_ubatch, depth + prompt - start)
        mb = _microbatch(plan, hw.for_tokens(u), eff, weighed, attn_layers, u, start, splits, offload_to[0],
                         kv_cell or {}, swa_cells, plan.context.flash_attn, rates[u > 1], host_attn)
        for k, v in mb.device_s.items():
            total.device_s[k] += v
        for k, v in mb.attn_s.items():
            total.attn_s[k] += v
        for k, v in mb.reads_s.items():
            total.reads_s[k] += v
        total.transfer_s += mb.transfer_s
        host_s = host_kv_seconds(host_kv, hw, eff, u)
        if on_gpu and kv_cell:  # the cache's views of start + u cells copied to each GPU
            host_s += kv_copy_seconds({d: int(c * (start + u)) for d, c in kv_cell.items()}, hw, eff)
        total.split_s += mb.split_s + host_s
        total.host_kv_s += host_s
        total.offload = total.offload or mb.offload
        start += u
    return total
