"""Tokens per second of a plan: token generation bound by the bytes each device reads, prompt
processing bound by compute and by the host weights op offload copies to the GPU.

Token generation at a context depth ``d``: per token each device reads its always-active weights
in full, its routed experts by ``n_expert_used / n_expert``, one row of the token embedding and
its layers' KV cache for ``d`` cells (the engine's own KV sizing, :func:`memory.kv_buffers`);
the time is those bytes over the device's effective bandwidth.  Devices run one after another
along the layers, so the times add, plus every graph split (a device change along the graph:
activations copied over PCIe or the network, and a fixed latency).  The splits are the scheduler's
of the one-token graph (``ggml_backend_sched_split_graph``; tests/core/test_speed_splits.py holds them
equal to the simulated scheduler's): each layer's steps in graph order, the device of each step's
weight (routed experts gate, up, down; a layer whose matrices sit on two devices changes device at
every step that moves), and a CPU layer's per-head Q norm taken by the GPU's op offload.

Prompt processing of ``N`` tokens in ``-ub`` micro-batches: each device computes
``2 x params x tokens`` FLOPs for its weights (routed experts by ``n_expert_used / n_expert``)
plus attention over the cache, at its effective TFLOPS, and reads its weights once per
micro-batch; at or above the op-offload batch (``compute.OP_OFFLOAD_MIN_BATCH``, 32 for CUDA;
ik_llama.cpp: MoE ops only when ``batch x n_expert_used >= 32 x n_expert``) the host-resident
weights are copied to the first GPU that offloads, once per micro-batch, over its host link, and
computed there.  Mainline copies only the experts the batch routes to (``used_ids`` in
``ggml_backend_sched_compute_splits``): with uniform routing a share ``1 - (1 - k/n)^batch``.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from offload_planner.core.compute import OP_OFFLOAD_MIN_BATCH, model_gpus
from offload_planner.core.compute.scheduler import OP_OFFLOAD_ONLY
from offload_planner.core.devices import DeviceKind, DeviceSet
from offload_planner.core.ik_repack import interleaved_off_gpu, repacked_off_gpu
from offload_planner.core.memory import ContextParams, ResolvedContext, kv_buffers, resolve_context
from offload_planner.core.model import Model
from offload_planner.core.placement import CPU, Placed, Placement
from offload_planner.core.plan import Plan
from offload_planner.core.roles import ROUTED_EXPERT_ROLES, Role
from offload_planner.core.speed.efficiency import Efficiencies, cpu_cost, defaults_for, gpu_rows_factor
from offload_planner.core.speed.hardware import DeviceSpeed, Figure, Hardware, Source

if TYPE_CHECKING:
    from offload_planner.core.dialects.base import Dialect
    from offload_planner.core.speed.speculation import SpecEstimate

DEFAULT_PROMPT = 4096
#: Stages of one layer in graph order (llama.cpp builds attention, then the router, the routed
#: experts, the shared expert; dense FFN layers have no router).
_STAGES: tuple[tuple[Role, ...], ...] = (
    (Role.ATTN_NORM, Role.ATTENTION),
    (Role.FFN_NORM, Role.ROUTER),
    (Role.EXPERTS_GATE_UP, Role.EXPERTS_UP, Role.EXPERTS_GATE, Role.EXPERTS_DOWN),
    (Role.SHARED_EXPERT,),
    (Role.FFN_DENSE,),
)
_STAGE_OF = {r: i for i, roles in enumerate(_STAGES) for r in roles}
_STAGE_NOT_NORM = {r: i for r, i in _STAGE_OF.items() if not r.is_norm}
#: Steps of a stage in graph order: ``build_moe_ffn`` multiplies by the fused gate+up experts, or by
#: the gate and up experts, then the down experts; ``build_ffn`` (the shared expert, a dense FFN) by
#: its gate, up, then down matrix.  ggml adds a node after its sources, left to right, and the GLU
#: takes the gate first (``ggml_swiglu_split(ctx, gate, up)``): the gate's matmul is the earlier node
#: although ``up`` is built first.  Each step's ops run where its weight is, so a layer whose matrices
#: sit on two devices changes device at every step that moves (``ggml_backend_sched_split_graph``).
_STEP_OF_ROLE = {Role.EXPERTS_GATE_UP: 0, Role.EXPERTS_GATE: 1, Role.EXPERTS_UP: 2, Role.EXPERTS_DOWN: 3}
_STEPPED_BY_NAME = frozenset({Role.SHARED_EXPERT, Role.FFN_DENSE})
#: Steps of the attention stage: its matrices (their first device), the per-head Q and K norms
#: (:func:`_attention_step`), the output matrix, and the post-norm in the stage's last step.
_STEPS = 8


@dataclass(frozen=True)
class Assumption:
    what: str
    figure: Figure

    def text(self) -> str:
        return f"{self.what}: {self.figure.describe()}"

    def as_json(self) -> dict[str, object]:
        f = self.figure
        return {"what": self.what, "value": f.value, "unit": f.unit, "source": str(f.source), "note": f.note}


@dataclass
class DeviceTime:
    name: str
    bytes_per_token: int  # at depth 0 (weights only)
    kv_bytes_at_ctx: int  # KV cache read per token at the full context
    tg_ms_per_token: float  # at depth 0
    tg_ms_at_ctx: float
    pp_ms: float = 0.0  # of the whole prompt: compute / reads on this device
    share: float = 0.0  # of the time per token at depth 0
    pp_reads_ms: float = 0.0  # of pp_ms: a CPU's weight and KV reads, added to its compute


@dataclass
class SpeedEstimate:
    tg_tps: float
    tg_tps_at_ctx: float
    pp_tps: float
    prompt: int
    n_ctx: int  # the depth of tg_tps_at_ctx
    n_ubatch: int
    devices: list[DeviceTime]
    n_splits: int
    split_ms: float  # per generated token
    pp_transfer_ms: float  # op offload copies over the whole prompt
    pp_split_ms: float
    op_offload: bool  # the micro-batch reaches the op-offload batch
    bottleneck: str
    pp_bottleneck: str
    calibrated: bool
    assumptions: list[Assumption] = field(default_factory=list)
    spec: SpecEstimate | None = None  # tg_tps/tg_tps_at_ctx are with it (core.speed.speculation)
    depth: int = 0  # --depth: the context before the prompt (0: pp from an empty cache)
    pp_tps_at_depth: float | None = None  # the prompt after ``depth`` tokens (depth > 0)
    tg_tps_at_depth: float | None = None  # a token after ``depth`` tokens (depth > 0)
    warnings: list[str] = field(default_factory=list)  # e.g. more compute threads than cores
    host_kv_layers: int = 0  # -nkvo: GPU layers whose KV cache and attention ops are on the CPU
    host_kv_ms: float = 0.0  # their round trips a token (in n_splits, not in split_ms)
    bottleneck_at_ctx: str = ""  # of tg_tps_at_ctx

    def device(self, name: str) -> DeviceTime:
        return next(d for d in self.devices if d.name == name)


# --- what one token reads --------------------------------------------------------------------------


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


def kv_read_at(model: Model, placement: Placement, params: ContextParams, ctx: ResolvedContext,
               devices: DeviceSet, depth: int, cached: range | None = None) -> dict[str, int]:
    """KV bytes one token of one sequence reads at ``depth`` cells, per device: the engine's KV
    sizing (:func:`memory.kv_buffers`) of ``depth`` cells, where a sliding-window layer reads
    ``min(depth, its cache's cells)``: its cache (``ctx.swa_cells``, ``n_swa x sequences + -ub``
    padded to 256; ``--swa-full``: the context) is a ring whose masked cells are overwritten only
    when reused, so once it wraps the attention spans all of it (``llama_kv_cache::get_n_kv``);
    with flash attention on a backend that skips masked cells (:data:`SKIPS_MASKED_CELLS`) it reads
    ``min(depth, n_swa)``."""
    if depth <= 0:
        return {}
    s = model.summary

    def read(swa_cells: int) -> dict[str, int]:
        sub = replace(ctx, n_ctx=depth, n_ctx_seq=depth, n_stream=1, swa_cells=swa_cells)
        out: dict[str, int] = defaultdict(int)
        for b in kv_buffers(model, placement, sub, params, devices, cached=cached):
            out[b.device] += b.bytes
        return dict(out)

    ring = read(min(depth, ctx.swa_cells))
    if not (s.has_swa and s.n_swa and params.flash_attn and ctx.swa_cells > s.n_swa):
        return ring
    window = read(min(depth, s.n_swa))
    skips = {d.name for d in devices if d.kind in SKIPS_MASKED_CELLS}
    return {name: window[name] if name in skips else n for name, n in ring.items()}


def _base(name: str) -> str:
    """``ffn_up`` of ``blk.3.ffn_up.weight``."""
    return name.split(".")[2] if name.startswith("blk.") and name.count(".") >= 3 else name


def _ffn_step(base: str) -> int:
    """A shared expert's or dense FFN's matrix in graph order (:data:`_STEP_OF_ROLE`: gate+up, gate,
    up, down; Qwen2-MoE's shared expert gate ``ffn_gate_inp_shexp`` multiplies the shared expert's
    output, after it)."""
    return (0 if base.startswith("ffn_gate_up") else 4 if base.startswith("ffn_gate_inp")
            else 1 if base.startswith("ffn_gate") else 2 if base.startswith("ffn_up")
            else 3 if base.startswith("ffn_down") else 0)


def _norm_key(base: str) -> int | None:
    """Where a norm weight whose ``MUL`` may run elsewhere than its layer sits among a layer's steps:
    the per-head Q and K norms (op offload, :func:`stage_devices`), the attention's post-norm (Gemma's
    ``post_attention_norm``; GLM-4.5's and gpt-oss's FFN pre-norm of that name) after the attention's
    matrices, the FFN's (``post_ffw_norm``) after the FFN: a layer whose last matrix is on another
    device than the norm's weight changes device for it.  Other norms follow their layer (None)."""
    if base == "attn_q_norm":
        return 1
    if base == "attn_k_norm":
        return 2
    if base.startswith("post_attention_norm"):
        return _STEPS - 1
    return len(_STAGES) * _STEPS if base.startswith("post_ffw_norm") else None


@dataclass(frozen=True)
class _GraphKeys:
    """Each layer tensor's place among the layers' steps in graph order (``layer x stride + step``;
    absent: not a step of its own, e.g. a pre-norm, which follows its layer), and the rows one token's
    ``MUL`` by a per-head Q or K norm has (heads: op offload takes it at >= the GPU's batch)."""

    keys: dict[str, int]
    rows: dict[str, int]


def _graph_keys(model: Model) -> _GraphKeys:
    """:class:`_GraphKeys` of the model, remembered for the last few models (an estimate in a search
    asks for every candidate)."""
    for m, known in _KEYS:
        if m is model:
            return known
    s = model.summary
    stride = (len(_STAGES) + 1) * _STEPS
    keys: dict[str, int] = {}
    rows: dict[str, int] = {}
    for t in model.tensors:
        role, il = t.role, t.layer
        if il is None or role is Role.OUTPUT:
            continue
        base = _base(t.name)
        if (st := _STAGE_NOT_NORM.get(role)) is not None:
            step = (_STEP_OF_ROLE.get(role, 0) if role not in _STEPPED_BY_NAME else _ffn_step(base))
            if role is Role.ATTENTION and base.startswith("attn_output"):
                step = 5
            keys[t.name] = il * stride + st * _STEPS + step
        elif role.is_norm and (post := _norm_key(base)) is not None:
            keys[t.name] = il * stride + post
            if post in (1, 2) and il < s.n_layer:
                rows[t.name] = s.per_layer(s.n_head if post == 1 else s.n_head_kv, il)
    known = _GraphKeys(keys, rows)
    _KEYS.insert(0, (model, known))
    del _KEYS[4:]
    return known


#: :func:`_graph_keys` of the last models
_KEYS: list[tuple[Model, _GraphKeys]] = []


def one_token_offload(devices: DeviceSet, placement: Placement, op_offload: bool) -> tuple[str, int] | None:
    """The first of the model's GPUs whose backend takes an elementwise op of a host weight (``MUL``;
    Metal offloads matrix multiplications only), and its batch: ``ggml_backend_sched_backend_id_from_cur``
    gives it a one-token ``MUL`` by a host per-head norm of at least that many rows (CUDA's
    ``get_op_batch_size``: the rows; Qwen3's 32-64 query heads), so a layer on the CPU goes to the GPU
    for its Q norm and back.  None with ``--no-op-offload`` (``op_offload`` False)."""
    if not op_offload:
        return None
    for g in model_gpus(devices, placement):
        n = OP_OFFLOAD_MIN_BATCH.get(g.kind)
        only = OP_OFFLOAD_ONLY.get(g.kind)
        if n is not None and (only is None or "MUL" in only):
            return g.name, n
    return None


def stage_devices(model: Model, placement: Placement, offload: tuple[str, int] | None = None) -> list[str]:
    """The device of every step of the graph in order: the embedding lookup, each layer's attention
    (its per-head Q and K norms on ``offload``'s GPU where a host one has enough rows,
    :func:`one_token_offload`), router, routed experts (gate+up or gate, up, down:
    :data:`_STEP_OF_ROLE`), shared expert and dense FFN (the same order, :func:`_ffn_step`), then the
    output.  Norms follow their layer, but for those of :func:`_norm_key`."""
    first: dict[int, str] = {}
    embd = CPU
    out_dev: str | None = None
    token_embd, output = Role.TOKEN_EMBD, Role.OUTPUT
    gk = _graph_keys(model)
    keys, rows = gk.keys, gk.rows
    for p in _running(placement):
        assert p.device is not None
        t = p.tensor
        if not p.copy and (k := keys.get(t.name, -1)) >= 0:
            if k not in first:
                dev = p.device
                if offload is not None and dev == CPU and rows.get(t.name, 0) >= offload[1]:
                    dev = offload[0]
                first[k] = dev
        elif t.role is token_embd and not p.copy and t.layer is None:
            embd = p.device
        elif t.role is output or p.copy:
            out_dev = p.device
    seq = [embd] + [first[k] for k in sorted(first)]
    seq.append(out_dev or placement.output_device)
    return seq


def split_pairs(model: Model, placement: Placement,
                offload: tuple[str, int] | None = None) -> list[tuple[str, str]]:
    """(from, to) of every device change along the graph: llama.cpp's graph splits of one token
    (``offload``: :func:`one_token_offload`)."""
    seq = stage_devices(model, placement, offload)
    return [(a, b) for a, b in itertools.pairwise(seq) if a != b]


def token_split_pairs(plan: Plan, placement: Placement) -> list[tuple[str, str]]:
    """:func:`split_pairs` of the plan's model and placement, with its devices' op offload."""
    return split_pairs(plan.model, placement,
                       one_token_offload(plan.devices, placement, plan.context.op_offload))


# --- -nkvo: the KV cache and the attention ops on the CPU ------------------------------------------


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


# --- the estimate ------------------------------------------------------------------------------


def _bandwidth(dev: DeviceSpeed, eff: Efficiencies) -> tuple[float, list[Assumption]]:
    """Effective GB/s of a device's memory, and what it rests on (a device whose threads share
    oversubscribed cores: that share of it, :class:`hardware.Threads`)."""
    notes: list[Assumption] = []
    return _effective_bandwidth(dev, eff, notes), notes


def _effective_bandwidth(dev: DeviceSpeed, eff: Efficiencies,
                         notes: list[Assumption] | None = None) -> float:
    """:func:`_bandwidth`'s GB/s, its assumptions added to ``notes`` when given (the estimate's loops
    ask for the figure alone, per micro-batch and device)."""
    bw = _peak_bandwidth(dev, eff, notes)
    if dev.share < 1.0:
        bw *= dev.share
        if notes is not None:
            notes.append(Assumption(f"{dev.name} oversubscribed: its threads get this share of a core",
                                    Figure(round(dev.share, 3), "x", Source.DEFAULT,
                                           "cores / compute threads on this machine; bandwidth and compute "
                                           "scaled by it")))
    return bw


def _is_gpu(dev: DeviceSpeed) -> bool:
    """A local GPU (not the CPU; not an RPC device, whose server's backend is not known: ggml-rpc-server
    computes on its CPU by default)."""
    return dev.kind not in (DeviceKind.CPU, DeviceKind.RPC)


def compute_tflops(dev: DeviceSpeed, eff: Efficiencies) -> float:
    """Effective TFLOPS of a device: peak x efficiency x its share of oversubscribed cores."""
    e = eff.cpu_compute if dev.kind is DeviceKind.CPU else eff.gpu_compute
    return dev.tflops.value * e.value * dev.share


def _peak_bandwidth(dev: DeviceSpeed, eff: Efficiencies, notes: list[Assumption] | None) -> float:
    """GB/s of a device's memory at its efficiency, limited by its threads (an RPC server's, the
    CPU's ``-t``), before any share of oversubscribed cores; what it rests on added to ``notes``."""
    rpc = dev.kind is DeviceKind.RPC and bool(dev.threads)  # the server computes on its CPU with -t threads
    if rpc:
        e = eff.cpu_bandwidth
    elif dev.kind is DeviceKind.CPU:
        e = eff.probe_bandwidth if dev.bandwidth.source is Source.MEASURED else eff.cpu_bandwidth
    else:
        e = eff.gpu_bandwidth
    bw = dev.bandwidth.value * e.value
    if notes is not None:
        notes += [Assumption(f"{dev.name} memory bandwidth", dev.bandwidth),
                  Assumption(f"{dev.name} bandwidth efficiency", e)]
    per = eff.cpu_thread_bandwidth
    if (rpc or dev.kind is DeviceKind.CPU) and dev.threads and dev.threads * per.value < bw:
        bw = dev.threads * per.value
        if notes is not None:
            by = f"its server's {dev.threads} threads" if rpc else f"-t {dev.threads}"
            notes.append(Assumption(f"{dev.name} limited by {by}", per))
    return bw


def _link(a: DeviceSpeed, b: DeviceSpeed, eff: Efficiencies) -> tuple[float, float]:
    """(effective GB/s, latency s) of a split between two devices: the slower side's link."""
    gb = min(a.link.value, b.link.value) * eff.link.value
    rpc = DeviceKind.RPC in (a.kind, b.kind)
    # RPC: the server's work per split plus the round trip measured to it (none measured: the default
    # covers a loopback round trip)
    rtt = max((d.latency_us.value for d in (a, b) if d.latency_us is not None), default=0.0)
    lat = ((eff.rpc_latency_us.value + rtt) if rpc else eff.split_latency_us.value) * 1e-6
    return gb, lat


def _links(pairs: list[tuple[str, str]], hw: Hardware, eff: Efficiencies) -> list[tuple[float, float]]:
    """:func:`_link` of every split, in order (worked out once per pair of devices: a MoE model with
    its experts on the CPU has hundreds of splits between two devices)."""
    known = {(a, b): _link(hw[a], hw[b], eff) for a, b in set(pairs)}
    return [known[p] for p in pairs]


@dataclass
class _Work:
    """What one device's weights cost a micro-batch, summed once per placement: elements and bytes of
    four parts, by index ``routed expert | 2 x refused`` (always-active matrices or routed experts; ops
    the GPU may take, or host weights whose ops it refuses and so never offloads: ik's row-interleaved
    types, core.ik_repack)."""

    el: list[float] = field(default_factory=lambda: [0.0] * 4)
    nbytes: list[float] = field(default_factory=lambda: [0.0] * 4)
    cpu_el: list[float] = field(default_factory=lambda: [0.0] * 4)  # el x the type's CPU cost (cpu_cost)
    #: bytes as op offload's copy costs them: a host weight outside a pinned buffer counts
    #: 1 / ``Efficiencies.pageable_copy`` (:func:`copy_weight`)
    copy_nb: list[float] = field(default_factory=lambda: [0.0] * 4)

    def parts(self) -> Iterator[tuple[float, float, bool, bool, float, float]]:
        """(elements, bytes, routed expert, may be offloaded, elements weighted by their CPU cost, bytes
        weighted by their copy cost)."""
        for i in range(4):
            yield self.el[i], self.nbytes[i], bool(i & 1), not i & 2, self.cpu_el[i], self.copy_nb[i]


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


def _work(placement: Placement, dialect: Dialect, refused: frozenset[str] = frozenset(),
          eff: Efficiencies | None = None, isa_gain: float = 1.0) -> dict[str, _Work]:
    out: dict[str, _Work] = defaultdict(_Work)
    costs: dict[tuple[str, str | None], tuple[float, float]] = {}  # (type, buft) -> CPU cost, copy cost
    eff = eff or defaults_for(dialect)
    embd, experts = Role.TOKEN_EMBD, ROUTED_EXPERT_ROLES  # looked up once, not per tensor
    for p in _running(placement):
        t = p.tensor
        if len(t.shape) < 2 or (t.role is embd and not p.copy):
            continue  # 1-D tensors (norms, biases) cost nothing here; the embedding is a row lookup
        assert p.device is not None
        w = out[p.device]
        i = (t.role in experts) | (2 if refused and t.name in refused else 0)  # the part (_Work)
        n, nb = t.n_elements, t.nbytes
        key = (t.type.name, p.buft)
        cost = costs.get(key)
        if cost is None:
            cost = costs[key] = (cpu_cost(key[0], dialect, isa_gain), copy_weight(p.buft, eff))
        w.el[i] += n
        w.nbytes[i] += nb
        w.cpu_el[i] += n * cost[0]
        w.copy_nb[i] += nb * cost[1]
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


def _pp_splits(plan: Plan, hw: Hardware, eff: Efficiencies,
               pairs: list[tuple[str, str]]) -> Callable[[int], float]:
    """Seconds of the graph splits of a micro-batch of ``u`` tokens: per split its latency plus the
    batch's activations over the link (worked out once per ``u``: a prompt's micro-batches share it)."""
    links = _links(pairs, hw, eff)
    n_embd = plan.model.summary.n_embd
    memo: dict[int, float] = {}

    def of(u: int) -> float:
        got = memo.get(u)
        if got is None:
            split_s = 0.0
            for gb, lat in links:
                split_s += lat + 4 * n_embd * u / (gb * 1e9)
            got = memo[u] = split_s
        return got

    return of


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
    exp_off = dense_off and (not whole or u * s.n_expert_used >= (threshold or 0) * s.n_expert)
    for dev, w in work.items():
        for el, nb, is_exp, may, cpu_el, copy_nb in w.parts():
            if not el:
                continue
            where = dev
            if dev == CPU and may and (exp_off if is_exp else dense_off):
                assert gpu is not None
                # mainline copies only the experts the batch routes to (ggml_backend_sched_compute_splits)
                transfer += copy_nb * (hit if is_exp and not whole else 1.0)
                where = gpu
            work_flops = 2.0 * u * (cpu_el if where == CPU else el) * (frac if is_exp else 1.0)
            if gpu_like[where]:  # rows a matrix multiplies: the tokens routed to an expert it hits
                work_flops /= gpu_rows_factor(u * frac / hit if is_exp else u)
            flops[where] += work_flops
            reads[where] += nb * (hit if is_exp else 1.0)
    return flops, reads, transfer


def _microbatch(plan: Plan, hw: Hardware, eff: Efficiencies, weighed: Callable[[int], _Weighed],
                attn_layers: dict[tuple[str, bool], int], u: int, start: int, splits: Callable[[int], float],
                gpu: str | None, kv_cell: dict[str, float], swa_cells: float = math.inf) -> _PPParts:
    """Seconds of one micro-batch of ``u`` tokens after ``start`` tokens in the cache (``kv_cell``:
    KV bytes per cell per device; the micro-batch's attention reads its ``start + u`` cells;
    ``attn_layers``: layers by device and sliding window, whose queries attend at most the
    ``swa_cells`` of their cache; ``weighed``: :func:`_weighed`; ``splits``: :func:`_pp_splits`;
    ``gpu``: the op-offload GPU)."""
    s = plan.model.summary
    weights_flops, weights_reads, transfer = weighed(u)
    flops: dict[str, float] = defaultdict(float, weights_flops)
    reads: dict[str, float] = defaultdict(float, weights_reads)
    heads = max(s.n_head) if isinstance(s.n_head, list) else s.n_head
    per_cell = 2.0 * heads * (s.head_dim_k + s.head_dim_v) * u  # the micro-batch against one cell
    attn: dict[str, float] = defaultdict(float)
    for (dev, swa), n in attn_layers.items():  # a query attends the mean of start + u / 2 cells
        attn[dev] += per_cell * (min(start + u / 2, swa_cells) if swa else start + u / 2) * n
    for dev, f in attn.items():
        flops[dev] += f
    for dev, per_cell in kv_cell.items():
        reads[dev] += per_cell * (start + u)
    device_s: dict[str, float] = {}
    attn_s: dict[str, float] = {}
    reads_s: dict[str, float] = {}
    for name in dict.fromkeys([*flops, *reads]):  # first-seen order: ties name the same device every run
        d = hw[name]
        bw = _effective_bandwidth(d, eff)
        tf = compute_tflops(d, eff) * 1e12
        # a GPU overlaps its reads with its compute (warps in flight); a CPU's threads both stream the
        # weights and multiply them (ggml-cpu has no copy engine): their times add
        if d.kind is DeviceKind.CPU:
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
    each micro-batch's attention, None: not counted)."""
    pairs = token_split_pairs(plan, placement) if pairs is None else pairs
    work = _work(placement, plan.dialect, refused_by_gpu(plan, placement), eff, _isa_gain(hw))
    s = plan.model.summary
    attn_layers: dict[tuple[str, bool], int] = defaultdict(int)
    on_gpu = nkvo_attention_on_gpu(plan)
    for il in range(s.n_layer - s.n_nextn):
        kv_dev = placement.layer_device(il) if plan.context.offload_kqv or on_gpu else CPU
        attn_layers[(kv_dev, s.swa_layers[il])] += 1
    offload_to = _offload_gpu(plan, placement)
    # a sliding-window layer's cache: a ring of swa_cells (n_swa x sequences + -ub, padded)
    swa_cells = resolve_context(plan.context, s.n_ctx_train, s.n_swa).swa_cells if s.has_swa else math.inf
    host_kv = host_kv_layers(plan, placement)
    total = _PPParts(defaultdict(float), 0.0, 0.0, False, defaultdict(float), reads_s=defaultdict(float))
    splits = _pp_splits(plan, hw, eff, pairs)
    weighed = _weighed(plan, hw, work, offload_to)
    start = depth
    while start < depth + prompt:
        u = min(n_ubatch, depth + prompt - start)
        mb = _microbatch(plan, hw, eff, weighed, attn_layers, u, start, splits, offload_to[0], kv_cell or {},
                         swa_cells)
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


@dataclass(frozen=True)
class TokenExtras:
    """What a generated token costs beyond its bytes, from one pass over the placement."""

    cpu_flops: float  # FLOPs of the CPU weights whose kernels cost more than the default
    layers: dict[str, int]  # layers with a running weight, by device
    pageable_cpu: bool  # a CPU weight outside a pinned ``<GPU>_Host`` buffer


def _isa_gain(hw: Hardware) -> float:
    """The host CPU's instruction-set gain (``DeviceSpeed.isa_gain``; 1 without a CPU figure)."""
    return hw.devices[CPU].isa_gain if CPU in hw.devices else 1.0


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


def _tg_times(plan: Plan, placement: Placement, hw: Hardware, eff: Efficiencies, weights: dict[str, int],
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
    extras = extras or token_extras(plan, placement, _isa_gain(hw))
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
    for il in range(s.n_layer - s.n_nextn):
        dev = placement.layer_device(il) if plan.context.offload_kqv else CPU
        cells = min(depth, ctx.swa_cells) if s.swa_layers[il] else depth
        out[dev] += 2.0 * s.per_layer(s.n_head, il) * (s.head_dim_k + s.head_dim_v) * cells
    return dict(out)


def _split_seconds(plan: Plan, hw: Hardware, eff: Efficiencies, pairs: list[tuple[str, str]]) -> float:
    """Per generated token: latency plus one token's activations over the link, per graph split (a
    micro-batch of one, :func:`_pp_splits`)."""
    return _pp_splits(plan, hw, eff, pairs)(1)


def _assumptions(plan: Plan, placement: Placement, hw: Hardware, eff: Efficiencies) -> list[Assumption]:
    used = {p.device for p in _running(placement) if p.device is not None}
    used.add(placement.output_device)
    out: list[Assumption] = []
    for name in plan.devices.names:
        if name not in used:
            continue
        d = hw[name]
        out += _bandwidth(d, eff)[1]
        out.append(Assumption(f"{name} compute", d.tflops))
        out.append(Assumption(f"{name} compute efficiency",
                              eff.cpu_compute if d.kind is DeviceKind.CPU else eff.gpu_compute))
        if d.kind is not DeviceKind.CPU:
            out.append(Assumption(f"{name} host link", d.link))
    if any(_is_gpu(hw[n]) for n in used):
        out.append(Assumption("a GPU layer's fixed time a token", eff.gpu_layer_us))
    out.append(Assumption("link efficiency", eff.link))
    out.append(Assumption("graph split latency", eff.split_latency_us))
    if any(hw[n].kind is DeviceKind.RPC for n in used):
        out.append(Assumption("RPC split latency", eff.rpc_latency_us))
    for n in used:
        lat = hw[n].latency_us
        if lat is not None:
            out.append(Assumption(f"{n} RPC round trip per split", lat))
    if plan.placement_options.split_mode in ("row", "tensor"):
        out.append(Assumption(f"-sm {plan.placement_options.split_mode} estimated as -sm layer",
                              Figure(1, "x", Source.DEFAULT, "devices summed, not run in parallel")))
    return out


def thread_warnings(hw: Hardware) -> list[str]:
    """More compute threads than physical cores on this machine: said, with the slowdown assumed."""
    t = hw.threads
    if t is None or not t.oversubscribed:
        return []
    free = t.cores - sum(t.rpc.values())
    fix = (f"-t {free} (the cores left beside the rpc-servers)" if t.rpc and free >= 1
           else f"-t {t.cores}" if not t.rpc else "fewer rpc-server threads (rpc-server -t)")
    return [f"{t.describe()}: oversubscribed; the estimate gives each thread {t.share:.2f} of a core, "
            f"{', '.join(t.local)} {1 / t.share:.2f}x slower (llama.cpp's threads wait for each other at "
            f"every op: a busy machine is slower still); consider {fix}"]


#: How the bottleneck names -nkvo's part of a token.
HOST_KV_PART = "attention over the host KV cache (-nkvo)"


def _bottleneck(times: dict[str, float], split_s: float, total: float, host_kv_s: float = 0.0,
                host_kv_cpu_s: float = 0.0) -> str:
    """The largest part of a token's time (``host_kv_s``: -nkvo's round trips; ``host_kv_cpu_s``:
    of the CPU's time, its KV reads and attention for them)."""
    parts = dict(times)
    parts["graph splits"] = split_s
    if host_kv_s:
        parts[HOST_KV_PART] = host_kv_s + host_kv_cpu_s
        if CPU in parts:
            parts[CPU] -= host_kv_cpu_s
    name, t = max(parts.items(), key=lambda kv: kv[1])
    what = name if name in ("graph splits", HOST_KV_PART) else f"{name} memory bandwidth"
    return f"{what} ({100 * t / total:.0f}% of the time per token)"


def _pp_bottleneck(pp: _PPParts, total: float, host_kv: bool = False) -> str:
    parts = {f"{k} compute": v for k, v in pp.device_s.items()}
    cpu_attn = pp.attn_s.get(CPU, 0.0) if host_kv else 0.0
    if host_kv:  # -nkvo: the CPU's attention over the host cache, its round trips and copies
        parts[HOST_KV_PART] = cpu_attn + pp.host_kv_s
        if f"{CPU} compute" in parts:
            parts[f"{CPU} compute"] = max(0.0, parts[f"{CPU} compute"] - cpu_attn)
    parts["op offload copies over the host link"] = pp.transfer_s
    parts["graph splits"] = pp.split_s - pp.host_kv_s
    name, t = max(parts.items(), key=lambda kv: kv[1])
    return f"{name} ({100 * t / total:.0f}% of the prompt time)"


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
    extras = token_extras(plan, placement, _isa_gain(hw))
    t0 = _tg_times(plan, placement, hw, eff, weights, {}, extras=extras)
    attn1 = attention_flops_at(ap, placement, ctx, ctx.n_ctx_seq)
    t1 = _tg_times(plan, placement, hw, eff, weights, kv1, attn1, extras)
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
        tgd = _tg_times(plan, placement, hw, eff, weights, kvd, attn_d, extras)
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
    times = _tg_times(plan, placement, hw, eff, weight_bytes_per_token(plan.model, placement), {})
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
