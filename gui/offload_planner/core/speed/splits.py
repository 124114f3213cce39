"""The graph splits of a token (a device change along the graph: activations copied over PCIe or
the network, and a fixed latency) and what they cost.  The splits are the scheduler's of the
one-token graph (``ggml_backend_sched_split_graph``; tests/core/test_speed_splits.py holds them
equal to the simulated scheduler's): each layer's steps in graph order, the device of each step's
weight (attention matrices in the order ``build_attn`` expands them, Q, V, K or Q, K, V, and MLA's;
routed experts gate, up, down; a layer whose matrices sit on two devices changes device at every
step that moves), the layer's own device for its KV store and its norms' ``RMS_NORM``, ropes and
flash attention beside their neighbours, a split of its own where a step's weight is on another
device than the step (a per-layer ``rope_freqs``, sinks, a host norm taken by op offload), and a
CPU layer's per-head Q norm taken by the GPU's op offload."""

from __future__ import annotations

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
#: Positions of an FFN stage's steps.
_STEPS = 8
#: Positions of a layer's attention steps: its norm, matrices, per-head norms, rope, KV store, output.
_ATTN_STEPS = 16
_ROPE_Q, _ROPE_K, _KV = "<rope q>", "<rope k>", "<kv store>"
#: A layer's attention in graph order, by ``build_attn``'s input (llama-graph.cpp): it expands Q, V,
#: K (``llm_graph_input_attn_kv``, ``_k``) or Q, K, V (``_kv_iswa``: a model with sliding-window
#: layers) together, each with what it is built from (the matrix, its bias, the per-head norm; the
#: rope), then stores K and V in the layer's cache (:data:`_KV`, the layer's device), attends (ops
#: without weights: they run beside their neighbours) and multiplies by the output.  A pre-norm's
#: ``RMS_NORM`` is pinned to the layer's device (``norm`` callback) and its ``MUL`` runs where its
#: weight is.  DeepSeek's MLA: Q (or Q through its LoRA, ``attn_q_a``, norm, ``attn_q_b``) and its
#: absorbed ``attn_k_b``, then the compressed KV (``attn_kv_a_mqa``, norm; ``attn_kv_b`` without
#: absorption), the store, ``attn_v_b`` after the attention, the output.
_ATTN_KV = ("attn_norm", "attn_qkv", "attn_q", "attn_q_norm", _ROPE_Q, "attn_v", "attn_k", "attn_k_norm",
            _ROPE_K, _KV, "attn_output", "post_attention_norm")
_ATTN_ISWA = ("attn_norm", "attn_qkv", "attn_q", "attn_q_norm", _ROPE_Q, "attn_k", "attn_k_norm", _ROPE_K,
              "attn_v", _KV, "attn_output", "post_attention_norm")
_ATTN_MLA = ("attn_norm", "attn_q", "attn_q_a", "attn_q_a_norm", "attn_q_b", "attn_k_b", "attn_kv_a_mqa",
             "attn_kv_a_norm", "attn_kv_b", _KV, "attn_v_b", "attn_output", "post_attention_norm")
#: Attention weights placed apart (:attr:`_GraphKeys.sinks`): the sinks, an operand of the attention op
#: after the KV store, which with flash attention the scheduler places by its neighbours
#: (``ggml_backend_sched_backend_id_from_cur`` skips ``FLASH_ATTN_EXT``) and without runs the
#: ``SOFT_MAX`` where the sinks are.
_NOT_STEPS = frozenset({"attn_sinks"})
#: Where the FFN's pre-norm, its stages (:data:`_STAGES` from the router on) and post-norm sit.
_FFN_NORM = _ATTN_STEPS
_POST_FFW = _ATTN_STEPS + len(_STAGES) * _STEPS


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


def _attention_order(model: Model) -> tuple[str, ...]:
    """The model's :data:`_ATTN_KV`, :data:`_ATTN_ISWA` or :data:`_ATTN_MLA`."""
    names = {_base(t.name) for t in model.tensors if t.layer == 0}
    if "attn_kv_a_mqa" in names:
        return _ATTN_MLA
    return _ATTN_ISWA if any(model.summary.swa_layers) else _ATTN_KV


def _layer_key(base: str, role: Role, order: dict[str, int]) -> int | None:
    """A layer tensor's position among its layer's steps (None: not a step of its own).  Attention
    matrices by ``order`` (:func:`_attention_order`; one the order does not name takes Q's place),
    norms by theirs (other norms follow their layer), the FFN's by :data:`_STAGES` and
    :data:`_STEP_OF_ROLE` (:func:`_ffn_step` for the shared expert and dense FFN)."""
    if role is Role.ATTENTION:
        return None if base in _NOT_STEPS else order.get(base, order["attn_q"])
    if role.is_norm:
        if base in order:
            return order[base]
        return (_FFN_NORM if base == "ffn_norm" else _POST_FFW if base.startswith("post_ffw_norm")
                else None)
    if (st := _STAGE_NOT_NORM.get(role)) is None:
        return None
    step = _STEP_OF_ROLE.get(role, 0) if role not in _STEPPED_BY_NAME else _ffn_step(base)
    return _ATTN_STEPS + (st - 1) * _STEPS + step


@dataclass(frozen=True)
class _GraphKeys:
    """Each layer tensor's place among the layers' steps in graph order (``keys``: ``layer x stride +
    2 x step + 1``; absent: not a step of its own), the rows one token's ``MUL`` by a per-head Q or K
    norm has (heads: op offload takes it at >= the GPU's batch), the steps that run on their layer's
    device (``pinned``, ``(layer, place)``: the KV store, and a norm's ``RMS_NORM`` before its weight's
    ``MUL``, which the ``norm`` callback pins there), the ropes by the per-layer ``rope_freqs`` (on
    the layer's device) and the attention sinks (``sinks``: the attention op, which with flash
    attention runs beside its neighbours)."""

    keys: dict[str, int]
    rows: dict[str, int]
    pinned: tuple[tuple[int, int], ...]
    ropes: tuple[tuple[int, int], ...]
    sinks: dict[str, int]
    n_places: int


def _graph_keys(model: Model) -> _GraphKeys:
    """:class:`_GraphKeys` of the model, remembered for the last few models (an estimate in a search
    asks for every candidate)."""
    for m, known in _KEYS:
        if m is model:
            return known
    s = model.summary
    stride = 2 * _POST_FFW + 2
    order = {b: i for i, b in enumerate(_attention_order(model))}
    keys: dict[str, int] = {}
    rows: dict[str, int] = {}
    sinks: dict[str, int] = {}
    pinned: list[tuple[int, int]] = []
    layers: set[int] = set()
    kinds: dict[tuple[str, Role], tuple[int, int, int]] = {}  # (base, role) -> _kind_of's answer
    output, n_layer = Role.OUTPUT, s.n_layer
    for t in model.tensors:
        il = t.layer
        if il is None:
            continue
        role = t.role
        if role is output:
            continue
        name = t.name
        parts = name.split(".", 3)
        base = parts[2] if len(parts) == 4 and parts[0] == "blk" else name  # _base
        kind = kinds.get((base, role))
        if kind is None:
            kind = kinds[(base, role)] = _kind_of(base, role, order)
        what, k, heads = kind
        if what == _NONE:
            continue
        if what == _SINK:
            sinks[name] = il * stride + k  # after the store
            continue
        keys[name] = il * stride + 2 * k + 1
        if what == _ATTN:
            layers.add(il)
        elif what == _PINNED:  # gemma's post_ffw_norm is built with il = -1: not pinned
            pinned.append((il, il * stride + 2 * k))
        if heads and il < n_layer:
            rows[name] = s.per_layer(s.n_head if heads == _Q_HEADS else s.n_head_kv, il)
    rope = model.get("rope_freqs.weight") is not None
    ropes = tuple((il, il * stride + 2 * order[r] + 1) for il in sorted(layers) if rope
                  for r in (_ROPE_Q, _ROPE_K) if r in order)
    pinned += [(il, il * stride + 2 * order[_KV] + 1) for il in sorted(layers)]
    # places renumbered 0..n-1 in order (a placement's steps fill a list, no sort)
    rank = {k: i for i, k in enumerate(sorted({*keys.values(), *sinks.values(),
                                                *(k for _, k in pinned), *(k for _, k in ropes)}))}
    known = _GraphKeys({n: rank[k] for n, k in keys.items()}, rows,
                       tuple((il, rank[k]) for il, k in pinned), tuple((il, rank[k]) for il, k in ropes),
                       {n: rank[k] for n, k in sinks.items()}, len(rank))
    _KEYS.insert(0, (model, known))
    del _KEYS[4:]
    return known


_NONE, _SINK, _ATTN, _PINNED, _KEY = range(5)
_Q_HEADS, _KV_HEADS = 1, 2  # a per-head Q or K norm (its rows: the layer's query or KV heads)


def _kind_of(base: str, role: Role, order: dict[str, int]) -> tuple[int, int, int]:
    """What :func:`_graph_keys` does with a layer tensor of this base name and role (the same in every
    layer: worked out once a model): ``(_SINK, offset after the KV store, 0)``, ``(_NONE, 0, 0)`` (not
    a step of its own), or ``(kind, step, heads)`` (:func:`_layer_key`) of an attention matrix
    (``_ATTN``), a norm whose ``RMS_NORM`` is pinned to its layer (``_PINNED``) or another step
    (``_KEY``), ``heads`` :data:`_Q_HEADS` / :data:`_KV_HEADS` for a per-head Q / K norm, else 0."""
    if role is Role.ATTENTION and base in _NOT_STEPS:
        return _SINK, 2 * order[_KV] + 2, 0
    k = _layer_key(base, role, order)
    if k is None:
        return _NONE, 0, 0
    heads = _Q_HEADS if base == "attn_q_norm" else _KV_HEADS if base == "attn_k_norm" else 0
    if role is Role.ATTENTION:
        return _ATTN, k, heads
    return (_PINNED if role.is_norm and k != _POST_FFW else _KEY), k, heads


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


def stage_devices(model: Model, placement: Placement, offload: tuple[str, int] | None = None,
                  flash_attn: bool = True) -> list[tuple[str, str | None]]:
    """Every step of the graph in order, ``(device it runs on, device of its weight or None)``; the
    device is ``""`` for a step that runs beside its neighbours (:func:`split_pairs`): a rope by a
    per-layer ``rope_freqs``, the flash attention by its sinks.  The embedding lookup, each layer's
    attention (:func:`_attention_order`; its per-head Q and K norms on ``offload``'s GPU where a host
    one has enough rows, :func:`one_token_offload`; its KV store on the layer's device; a norm's
    ``RMS_NORM`` on the layer's device before its ``MUL``), FFN pre-norm, router, routed experts
    (gate+up or gate, up, down: :data:`_STEP_OF_ROLE`), shared expert and dense FFN (the same order,
    :func:`_ffn_step`), then the output.  Norms other than :func:`_layer_key`'s follow their layer."""
    gk = _graph_keys(model)
    first: list[tuple[str, str | None] | None] = [None] * gk.n_places
    embd = CPU
    out_dev: str | None = None
    token_embd, output = Role.TOKEN_EMBD, Role.OUTPUT
    keys, rows, sinks = gk.keys, gk.rows, gk.sinks
    for p in _running(placement):
        assert p.device is not None
        t = p.tensor
        if not p.copy and (k := keys.get(t.name, -1)) >= 0:
            if first[k] is None:
                dev = p.device
                if offload is not None and dev == CPU and rows.get(t.name, 0) >= offload[1]:
                    dev = offload[0]
                first[k] = (dev, p.device)
        elif t.role is token_embd and not p.copy and t.layer is None:
            embd = p.device
        elif t.role is output or p.copy:
            out_dev = p.device
        elif (k := sinks.get(t.name, -1)) >= 0:
            first[k] = ("" if flash_attn else p.device, p.device)
    layer_device = placement.layer_device
    for il, k in gk.pinned:
        first[k] = (layer_device(il), None)
    for il, k in gk.ropes:
        first[k] = ("", layer_device(il))
    seq: list[tuple[str, str | None]] = [(embd, None)]
    seq += [x for x in first if x is not None]
    seq.append((out_dev or placement.output_device, None))
    return seq


def split_pairs(model: Model, placement: Placement, offload: tuple[str, int] | None = None,
                flash_attn: bool = True) -> list[tuple[str, str]]:
    """(from, to) of every graph split along the graph: llama.cpp's splits of one token (``offload``:
    :func:`one_token_offload`; :func:`stage_devices`).  A device change is one; a step that runs
    beside its neighbours takes the previous step's GPU, else the next step's GPU, else the CPU
    (``ggml_backend_sched_split_graph``'s expansions: GPUs down, GPUs up, then the rest); a step
    whose weight is on another device than the one it runs on (that rope's ``rope_freqs``, a host
    norm's ``MUL`` by op offload) opens a split of its own where it does not change device (pass 5:
    a weight the backend cannot read)."""
    seq = stage_devices(model, placement, offload, flash_attn)
    after: list[str] = [seq[-1][0]] * len(seq)  # the next step's device, of those with one
    for i in range(len(seq) - 2, -1, -1):
        after[i] = after[i + 1] if not seq[i + 1][0] else seq[i + 1][0]
    pairs: list[tuple[str, str]] = []
    cur = prev = seq[0][0]
    for i in range(1, len(seq)):
        dev, weight = seq[i]
        if dev:
            prev = dev
        else:
            dev = prev if prev != CPU else after[i]
        if dev != cur:
            pairs.append((cur, dev))
            cur = dev
        elif weight is not None and weight != dev and pairs:
            pairs.append((dev, dev))
    return pairs


def token_split_pairs(plan: Plan, placement: Placement) -> list[tuple[str, str]]:
    """:func:`split_pairs` of the plan's model and placement, with its devices' op offload."""
    return split_pairs(plan.model, placement,
                       one_token_offload(plan.devices, placement, plan.context.op_offload),
                       plan.context.flash_attn)


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
