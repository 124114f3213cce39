"""The graph splits of a token (a device change along the graph: activations copied over PCIe or
the network, and a fixed latency) and what they cost.  The splits are the scheduler's of the
one-token graph (``ggml_backend_sched_split_graph``; tests/core/test_speed_splits.py holds them
equal to the simulated scheduler's): each layer's steps in graph order, the device of each step's
weight (routed experts gate, up, down; a layer whose matrices sit on two devices changes device at
every step that moves), and a CPU layer's per-head Q norm taken by the GPU's op offload."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from offload_planner.core.compute import OP_OFFLOAD_MIN_BATCH, model_gpus
from offload_planner.core.compute.scheduler import OP_OFFLOAD_ONLY
from offload_planner.core.devices import DeviceSet
from offload_planner.core.model import Model
from offload_planner.core.placement import CPU, Placement
from offload_planner.core.plan import Plan
from offload_planner.core.roles import Role
from offload_planner.core.speed.efficiency import Efficiencies
from offload_planner.core.speed.hardware import Hardware
from offload_planner.core.speed.rates import _links
from offload_planner.core.speed.reads import _running

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


def _split_seconds(plan: Plan, hw: Hardware, eff: Efficiencies, pairs: list[tuple[str, str]]) -> float:
    """Per generated token: latency plus one token's activations over the link, per graph split (a
    micro-batch of one, :func:`_pp_splits`)."""
    return _pp_splits(plan, hw, eff, pairs)(1)
