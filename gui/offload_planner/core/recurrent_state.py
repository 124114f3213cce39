"""The recurrent state of hybrid (attention + recurrent) models, as the pinned llama.cpp allocates it.

For an architecture ``llm_arch_is_hybrid`` names, ``llama_model::create_memory`` builds a
``llama_memory_hybrid``: a KV cache holding only the attention layers (``filter_attn``) and a
``llama_memory_recurrent`` holding, per recurrent layer (``filter_recr``), two f32 tensors of
``n_embd_r()`` (the convolution's last ``d_conv - 1`` inputs) and ``n_embd_s()`` (the delta net's
state) elements per row, ``mem_size * (1 + n_rs_seq)`` rows, ``mem_size = max(1, n_seq_max)``
(src/llama-memory-recurrent.cpp 20-126).  Each row set sits on its layer's device when the KV is
offloaded (``model.dev_layer(il)``'s default buffer type), else in the ``CPU`` buffer type, one buffer
per buffer type, in buffer-type name order, logged as ``<buft> RS buffer size``.  ``-ctk``/``-ctv``
do not touch it (``create_memory`` passes ``GGML_TYPE_F32`` for both), nor does ``--kv-unified``.
``n_rs_seq`` is the speculative draft length with a type that rolls the state back (draft-mtp,
eagle3, dflash, dspark: ``common_params_speculative::need_n_rs_seq``), kept only on the
architectures ``llm_arch_supports_rs_rollback`` names (``llama_context``: else clamped to 0).

The per-architecture differences are one :class:`HybridArch` each in :data:`HYBRID_ARCHS`.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from offload_planner.core.buffer import Buffer
from offload_planner.core.compressed_kv import COMPRESSED_KV_ARCHS
from offload_planner.core.compressed_kv import layer_note as compressed_layer_note
from offload_planner.core.compressed_kv import memory_notes as compressed_kv_notes
from offload_planner.core.devices import Device, DeviceSet
from offload_planner.core.hybrid_indexer import indexer_buffers, indexer_layers
from offload_planner.core.placement import CPU, Placement
from offload_planner.core.units import pad

if TYPE_CHECKING:
    from offload_planner.core.dialects.base import Dialect
    from offload_planner.core.memory import ContextParams, ResolvedContext
    from offload_planner.core.model import Model

F32_BYTES = 4
KIND = "rs"  # the buffer kind (the server's "RS buffer size" lines parse to it too)


@dataclass(frozen=True)
class StateDims:
    """``n_embd_r()`` and ``n_embd_s()`` of one model (elements per cell)."""

    r: int
    s: int


@dataclass(frozen=True)
class HybridArch:
    """One hybrid architecture's memory layout in the pinned build.

    ``recurrent``: per layer (all ``block_count`` layers), whether ``is_recr(il)``, as its
    ``load_arch_hparams`` sets ``is_recr_impl``.  ``trunk_only``: the filters keep ``il < n_layer()``
    (the NextN/MTP blocks are never cached by the main context).  ``dims``: ``n_embd_r``/``n_embd_s``
    (src/llama-hparams.cpp 208-258).  ``rollback``: in ``llm_arch_supports_rs_rollback``."""

    recurrent: Callable[[Model], tuple[bool, ...]]
    dims: Callable[[Model], StateDims]
    rollback: bool
    trunk_only: bool = True
    #: ik_llama.cpp's recurrent layers (its llama-hparams.cpp), None: its memory for the arch not modelled
    ik_recurrent: Callable[[Model], tuple[bool, ...]] | None = None
    #: the layers the KV cache holds (``filter_attn``); None: the layers that are not recurrent
    attention: Callable[[Model], tuple[bool, ...]] | None = None
    #: elements of a third f32 row tensor of layer ``il`` (qwen4exp's PLE conv history), 0: none
    extra_row: Callable[[Model, int], int] | None = None


def _interval_layers(model: Model) -> tuple[bool, ...]:
    """Qwen3-Next / Qwen3.5: ``attention.recurrent_layers`` when the file has it, else every layer of
    the trunk but each ``full_attention_interval``-th (default 4) is recurrent
    (src/models/qwen3next.cpp 16-23, qwen35.cpp, qwen35moe.cpp)."""
    s = model.summary
    key = f"{model.arch}.attention.recurrent_layers"
    arr = model.metadata.get(key)
    if isinstance(arr, Sequence) and not isinstance(arr, str):
        flags = [bool(x) for x in arr][: s.n_layer]
        return tuple(flags + [False] * (s.n_layer - len(flags)))
    if arr is not None:  # one value for every layer (get_key_or_arr)
        return (bool(model.meta.count(key)),) * s.n_layer
    every = model.arch_int("full_attention_interval", 4) or 4
    return tuple(il < s.n_layer_trunk and (il + 1) % every != 0 for il in range(s.n_layer))


def _mamba_dims(model: Model) -> StateDims:
    """The Mamba-style state: ``(d_conv - 1) * (d_inner + 2 * n_group * d_state)`` conv elements and
    ``d_state * d_inner`` state elements."""
    d_conv = model.arch_int("ssm.conv_kernel", 0)
    d_inner = model.arch_int("ssm.inner_size", 0)
    d_state = model.arch_int("ssm.state_size", 0)
    n_group = model.arch_int("ssm.group_count", 0)
    return StateDims(max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state), d_state * d_inner)


def _ik_every_fourth(model: Model) -> tuple[bool, ...]:
    """ik_llama.cpp's qwen3next: ``recurrent_layer_arr[i] = (i + 1) % 4 != 0`` for every block, no key
    read (ik 8337e4cd3 src/llama-hparams.cpp 601-604)."""
    return tuple((il + 1) % 4 != 0 for il in range(model.summary.n_layer))


def _ik_interval(model: Model) -> tuple[bool, ...]:
    """ik_llama.cpp's qwen35/qwen35moe: ``full_attention_interval`` (default 4) over the trunk, the
    NextN blocks attention (src/llama-hparams.cpp 633-644); ``attention.recurrent_layers`` is not read."""
    s = model.summary
    every = model.arch_int("full_attention_interval", 4) or 4
    return tuple(il < s.n_layer_trunk and (il + 1) % every != 0 for il in range(s.n_layer))


def _nemotron_h_layers(model: Model) -> tuple[bool, ...]:
    """Nemotron-H: a trunk layer is recurrent (Mamba2) iff its ``head_count_kv`` and its
    ``feed_forward_length`` are 0 (src/models/nemotron-h.cpp 12-16)."""
    s = model.summary
    return tuple(il < s.n_layer_trunk and s.head_kv(il) == 0 and s.per_layer(s.n_ff, il) == 0
                 for il in range(s.n_layer))


def _nemotron_h_attention(model: Model) -> tuple[bool, ...]:
    """``filter_attn = !is_recr(il) && n_ff(il) == 0`` (create_memory): the attention blocks, not the
    MoE/MLP ones."""
    s = model.summary
    return tuple(not r and s.per_layer(s.n_ff, il) == 0 for il, r in enumerate(_nemotron_h_layers(model)))


def _kv_head_less_layers(model: Model) -> tuple[bool, ...]:
    """Kimi-Linear, Kimi-K3, Granite hybrid: a trunk layer is recurrent (KDA, Mamba2) iff its
    ``head_count_kv`` is 0 (src/models/kimi-linear.cpp 17-19, kimi-k3.cpp 30-33, granite-hybrid.cpp 22-25)."""
    s = model.summary
    return tuple(il < s.n_layer_trunk and s.head_kv(il) == 0 for il in range(s.n_layer))


def _kda_dims(model: Model) -> StateDims:
    """Kimi's KDA state (``n_embd_head_kda != 0``): the q, k and v convolutions' last ``d_conv - 1``
    inputs, ``3 * (d_conv - 1) * n_head * head_dim`` (``d_conv`` 0: 3), and ``head_dim^2 * n_head``."""
    hd = model.arch_int("kda.head_dim", 0)
    d_conv = model.arch_int("ssm.conv_kernel", 0)
    s = model.summary
    n_head = s.per_layer(s.n_head, 0)
    return StateDims(3 * (d_conv - 1 if d_conv > 0 else 3) * n_head * hd, hd * hd * n_head)


def _qwen4exp_ple_row(model: Model, il: int) -> int:
    """qwen4exp's PLE layer keeps its conv history in its own row ``cache_ple_r_l``:
    ``ple_conv_state() = (ple.conv_kernel - 1) * ple.ngram_size * hyper_connection.count * n_embd``
    elements (src/llama-hparams.cpp ``ple_conv_state``, src/llama-memory-recurrent.cpp 109-114), on the
    one layer ``ple.layers`` names; 0 without PLE keys (``ple_n_heads = 0``)."""
    layers = model.metadata.get(f"{model.arch}.ple.layers")
    if not isinstance(layers, Sequence) or isinstance(layers, str) or il not in [int(x) for x in layers]:
        return 0
    n_heads = (model.arch_int("ple.ngram_size", 0) - 1) * model.arch_int("ple.heads_per_ngram", 0)
    kernel = model.arch_int("ple.conv_kernel", 0)
    if n_heads <= 0 or kernel == 0:
        return 0
    return ((kernel - 1) * model.arch_int("ple.ngram_size", 0) * model.arch_int("hyper_connection.count", 0)
            * model.summary.n_embd)


_NEMOTRON_H = HybridArch(_nemotron_h_layers, _mamba_dims, rollback=True, attention=_nemotron_h_attention)

_QWEN_HYBRID = HybridArch(_interval_layers, _mamba_dims, rollback=True, ik_recurrent=_ik_interval)

#: The hybrid architectures modelled, by ``general.architecture``.
HYBRID_ARCHS: dict[str, HybridArch] = {
    "qwen3next": HybridArch(_interval_layers, _mamba_dims, rollback=False, ik_recurrent=_ik_every_fourth),
    "qwen35": _QWEN_HYBRID,
    "qwen35moe": _QWEN_HYBRID,
    "nemotron_h": _NEMOTRON_H,
    "nemotron_h_moe": _NEMOTRON_H,
    "kimi-linear": HybridArch(_kv_head_less_layers, _kda_dims, rollback=False),
    # src/models/kimi-k3.cpp 30-33: kimi-linear's KDA/MLA split and KDA state
    "kimi-k3": HybridArch(_kv_head_less_layers, _kda_dims, rollback=True),
    # src/models/granite-hybrid.cpp 22-25: Mamba2 where head_count_kv is 0; default filters
    "granitehybrid": HybridArch(_kv_head_less_layers, _mamba_dims, rollback=False),
    # src/models/qwen4exp.cpp 149-163: Qwen3.5's layer rule and gated delta net (n_embd_r, n_embd_s), a PLE
    # row on its PLE layer; llama_memory_hybrid_idx's indexer cache: core.hybrid_indexer
    "qwen4exp": HybridArch(_interval_layers, _mamba_dims, rollback=True, extra_row=_qwen4exp_ple_row),
    # src/models/glm5-next.cpp 21-23: KDA where head_count_kv is 0 (Kimi's KDA state), the DSA layers an
    # MLA cache and the indexer cache (core.hybrid_indexer)
    "glm5-next": HybridArch(_kv_head_less_layers, _kda_dims, rollback=True),
}


#: ``llm_arch_is_hybrid`` and ``llm_arch_is_recurrent`` of the pinned build (src/llama-arch.cpp
#: 1110-1148) by GGUF name: their memory is a recurrent state beside (or instead of) a KV cache;
#: deepseek4's (a compressed KV cache and compressor states) is core.compressed_kv's
STATEFUL_ARCHS = frozenset({
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe",
    "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next", "qwen35", "qwen35moe", "qwen4exp",
    "minimax-01", "mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7",
})


def memory_notes(model: Model, dialect: Dialect) -> list[str]:
    """What the plan must say when a model's recurrent memory is not modelled (no silent wrong figure)."""
    h = hybrid_arch(model)
    if model.arch in COMPRESSED_KV_ARCHS:
        return compressed_kv_notes(model, dialect)
    if h is None and model.arch in STATEFUL_ARCHS:
        return [f"{model.arch} keeps a recurrent state beside its KV cache (llama.cpp's RS buffers) and "
                "caches the KV of its attention layers only: this architecture's memory is not modelled "
                "(the KV shown counts every layer, the recurrent state is missing)"]
    if h is not None and dialect.recurrent_state_in_kv and h.ik_recurrent is None:
        return [f"{model.arch}: the memory this build gives its recurrent layers is not modelled"]
    return []


def hybrid_arch(model: Model) -> HybridArch | None:
    return HYBRID_ARCHS.get(model.arch)


def recurrent_layers(model: Model) -> tuple[bool, ...]:
    """Per layer, whether it is recurrent (all False for a model that is not a modelled hybrid)."""
    h = hybrid_arch(model)
    if h is None:
        return (False,) * model.summary.n_layer
    return _memo(model, "recurrent", h.recurrent)


def layer_cache_note(model: Model, il: int) -> str:
    """What a layer of a hybrid model keeps per sequence, for the per-layer map ("" for another model)."""
    if model.arch in COMPRESSED_KV_ARCHS:
        return compressed_layer_note(model, il)
    if hybrid_arch(model) is None or il >= len(recurrent_layers(model)):
        return ""
    if recurrent_layers(model)[il]:
        return ("recurrent layer: no KV cache; its state (conv R + recurrent S, f32, one cell per "
                "sequence) is in its device's recurrent state buffer (RS)")
    h = hybrid_arch(model)
    if h is not None and h.attention is not None and not _attention_layers(model)[il]:
        return "feed-forward block: neither a KV cache nor a recurrent state"
    if il in indexer_layers(model, recurrent_layers(model)):
        return ("attention layer: its KV cache and its indexer keys (a second KV buffer) are on its device "
                "(the recurrent layers have neither)")
    return "attention layer: its KV cache is on its device (the recurrent layers have none)"


def kv_layers(model: Model, layers: Iterable[int], dialect: Dialect) -> list[int]:
    """The layers of ``layers`` the KV cache holds: the attention layers of a hybrid model
    (``filter_attn``; ik_llama.cpp: its own flags), every one of another."""
    h = hybrid_arch(model)
    if h is not None and h.attention is not None and not dialect.recurrent_state_in_kv:
        attn = _attention_layers(model)
        return [il for il in layers if attn[il]]
    recr = _flags(model, dialect)
    return list(layers) if recr is None else [il for il in layers if not recr[il]]


def _attention_layers(model: Model) -> tuple[bool, ...]:
    h = hybrid_arch(model)
    assert h is not None and h.attention is not None
    return _memo(model, "attention", h.attention)


#: per model (kept while the model lives), the layer flags worked out once
_FLAGS: weakref.WeakKeyDictionary[Model, dict[str, tuple[bool, ...]]] = weakref.WeakKeyDictionary()


def _memo(model: Model, key: str, fn: Callable[[Model], tuple[bool, ...]]) -> tuple[bool, ...]:
    per = _FLAGS.setdefault(model, {})
    flags = per.get(key)
    if flags is None:
        flags = per[key] = fn(model)
    return flags


def _flags(model: Model, dialect: Dialect) -> tuple[bool, ...] | None:
    h = hybrid_arch(model)
    if h is None:
        return None
    if dialect.recurrent_state_in_kv:
        return None if h.ik_recurrent is None else _ik_layers(model)
    return recurrent_layers(model)


def _ik_layers(model: Model) -> tuple[bool, ...]:
    h = hybrid_arch(model)
    assert h is not None and h.ik_recurrent is not None
    return _memo(model, "ik", h.ik_recurrent)


def with_recurrent_state(model: Model, placement: Placement, p: ContextParams, ctx: ResolvedContext,
                         devices: DeviceSet, kv: list[Buffer]) -> list[Buffer]:
    """The KV buffers and a hybrid model's recurrent state: mainline's RS buffers after them, or (a
    build that keeps the state in its KV cache, ik_llama.cpp) the state added to the KV buffers."""
    if hybrid_arch(model) is None:
        return kv
    if p.dialect.recurrent_state_in_kv:
        return _state_in_kv(model, placement, p, ctx, devices, kv)
    idx = indexer_buffers(model, placement, p, ctx, devices, recurrent_layers(model))
    return kv + idx + rs_buffers(model, placement, p, devices)


def _state_in_kv(model: Model, placement: Placement, p: ContextParams, ctx: ResolvedContext,
                 devices: DeviceSet, kv: list[Buffer]) -> list[Buffer]:
    """ik_llama.cpp (8337e4cd3 src/llama.cpp 1353-1423, as 55d3c05): per recurrent layer one f32 tensor
    ``cache_s_l`` of ``n_embd_v_s()`` = conv ``(d_conv - 1) * (2 * d_state * n_group + d_inner)`` + state
    ``(d_inner / dt_rank)^2 * dt_rank`` elements by ``min(max(1, n_seq_max), kv_size)`` slots, in the
    layer's KV context (its buffer type offloaded, else the CPU's): the ``KV buffer size`` holds it.
    Graph split mode's per-device state splits are not modelled."""
    recr = _flags(model, p.dialect)
    if recr is None:
        return kv
    d_conv = model.arch_int("ssm.conv_kernel", 0)
    d_inner = model.arch_int("ssm.inner_size", 0)
    d_state = model.arch_int("ssm.state_size", 0)
    n_group = model.arch_int("ssm.group_count", 0)
    dt_rank = model.arch_int("ssm.time_step_rank", 0)
    head_v = d_inner // dt_rank if dt_rank else 0
    row = (max(d_conv - 1, 0) * (2 * d_state * n_group + d_inner) + head_v * head_v * dt_rank) * F32_BYTES
    slots = min(max(1, p.n_seq_max), ctx.n_ctx)
    out = [b.copy() for b in kv]
    per: dict[str, int] = defaultdict(int)
    for il in p.dialect.main_kv_layers(model, placement) or range(model.summary.n_layer_trunk):
        if recr[il]:
            per[placement.layer_device(il) if p.offload_kqv else CPU] += 1
    for name, n in per.items():
        dev = devices.by_name(name) or devices.cpu
        b = next((b for b in out if b.device == name and b.kind == "kv"), None)
        if b is None:
            b = Buffer(name, name, "kv", 0, "no attention layer")
            out.append(b)
        b.bytes += n * pad(row * slots, dev.alignment)
        b.why += f"; with the recurrent state of {n} layers ({row // F32_BYTES} f32 x {slots} slots each)"
    return out


def state_rows(model: Model, p: ContextParams) -> int:
    """``mem_size * (1 + n_rs_seq)``: one cell per sequence, times the rollback snapshots."""
    h = hybrid_arch(model)
    n_rs_seq = p.n_rs_seq if h is not None and h.rollback else 0
    return max(1, p.n_seq_max) * (1 + n_rs_seq)


def rs_buffers(model: Model, placement: Placement, p: ContextParams, devices: DeviceSet) -> list[Buffer]:
    """The ``RS buffer size`` buffers: per buffer type, each recurrent layer's R and S tensors, each
    padded to the device's alignment; in buffer-type name order (the constructor's ``ctx_map``)."""
    h = hybrid_arch(model)
    if h is None or p.dialect.recurrent_state_in_kv:
        return []
    s = model.summary
    recr = recurrent_layers(model)
    dims = h.dims(model)
    rows = state_rows(model, p)
    per: dict[str, int] = defaultdict(int)
    layers: dict[str, int] = defaultdict(int)
    devs: dict[str, Device] = {}
    for il in range(s.n_layer_trunk if h.trunk_only else s.n_layer):
        if not recr[il]:
            continue
        name = placement.layer_device(il) if p.offload_kqv else CPU
        dev = devs.get(name) or devs.setdefault(name, devices.by_name(name) or devices.cpu)
        a = dev.alignment
        per[name] += pad(dims.r * F32_BYTES * rows, a) + pad(dims.s * F32_BYTES * rows, a)
        extra = h.extra_row(model, il) if h.extra_row is not None else 0
        if extra:
            per[name] += pad(extra * F32_BYTES * rows, a)
        layers[name] += 1
    cells = max(1, p.n_seq_max)
    snap = f" x (1 + {rows // cells - 1} rollback snapshots)" if rows > cells else ""
    return [Buffer(name, name, KIND, per[name],
                   f"recurrent state: {layers[name]} layers x {cells} cells{snap}, "
                   f"R {dims.r} + S {dims.s} f32 per cell")
            for name in sorted(per)]
