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

import functools
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from offload_planner.core.buffer import Buffer
from offload_planner.core.devices import Device, DeviceSet
from offload_planner.core.placement import CPU, Placement

if TYPE_CHECKING:
    from offload_planner.core.memory import ContextParams
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


_QWEN_HYBRID = HybridArch(_interval_layers, _mamba_dims, rollback=True)

#: The hybrid architectures modelled, by ``general.architecture``.
HYBRID_ARCHS: dict[str, HybridArch] = {
    "qwen3next": HybridArch(_interval_layers, _mamba_dims, rollback=False),
    "qwen35": _QWEN_HYBRID,
    "qwen35moe": _QWEN_HYBRID,
}


def hybrid_arch(model: Model) -> HybridArch | None:
    return HYBRID_ARCHS.get(model.arch)


@functools.lru_cache(maxsize=16)
def recurrent_layers(model: Model) -> tuple[bool, ...]:
    """Per layer, whether it is recurrent (all False for a model that is not a modelled hybrid)."""
    h = hybrid_arch(model)
    return h.recurrent(model) if h is not None else (False,) * model.summary.n_layer


def layer_cache_note(model: Model, il: int) -> str:
    """What a layer of a hybrid model keeps per sequence, for the per-layer map ("" for another model)."""
    if hybrid_arch(model) is None or il >= len(recurrent_layers(model)):
        return ""
    if recurrent_layers(model)[il]:
        return ("recurrent layer: no KV cache; its state (conv R + delta-net S, f32, one cell per "
                "sequence) is in its device's recurrent state buffer (RS)")
    return "attention layer: its KV cache is on its device (the recurrent layers have none)"


def kv_layers(model: Model, layers: Iterable[int]) -> list[int]:
    """The layers of ``layers`` the KV cache holds: the attention layers of a hybrid model
    (``filter_attn``), every one of another."""
    if hybrid_arch(model) is None:
        return list(layers)
    recr = recurrent_layers(model)
    return [il for il in layers if not recr[il]]


def state_rows(model: Model, p: ContextParams) -> int:
    """``mem_size * (1 + n_rs_seq)``: one cell per sequence, times the rollback snapshots."""
    h = hybrid_arch(model)
    n_rs_seq = p.n_rs_seq if h is not None and h.rollback else 0
    return max(1, p.n_seq_max) * (1 + n_rs_seq)


def rs_buffers(model: Model, placement: Placement, p: ContextParams, devices: DeviceSet) -> list[Buffer]:
    """The ``RS buffer size`` buffers: per buffer type, each recurrent layer's R and S tensors, each
    padded to the device's alignment; in buffer-type name order (the constructor's ``ctx_map``)."""
    h = hybrid_arch(model)
    if h is None:
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
        per[name] += _pad(dims.r * F32_BYTES * rows, a) + _pad(dims.s * F32_BYTES * rows, a)
        layers[name] += 1
    cells = max(1, p.n_seq_max)
    snap = f" x (1 + {rows // cells - 1} rollback snapshots)" if rows > cells else ""
    return [Buffer(name, name, KIND, per[name],
                   f"recurrent state: {layers[name]} layers x {cells} cells{snap}, "
                   f"R {dims.r} + S {dims.s} f32 per cell")
            for name in sorted(per)]


def _pad(x: int, n: int) -> int:
    return -(-x // n) * n
