"""DeepSeek V4's compressed attention cache, as the pinned llama.cpp allocates it.

For ``deepseek4`` ``llama_model::create_memory`` builds a ``llama_kv_cache_dsv4``
(src/llama-kv-cache-dsv4.cpp 1213-1337), not the generic KV cache.  Every layer attends over a
sliding window of raw tokens; a layer whose ``attention.compress_ratios`` entry is 4 (CSA) or 128
(HCA) also attends over compressed rows, one per ``ratio`` tokens, and a CSA layer ranks them with a
lightning indexer that keeps a compressed key cache of its own.  What it allocates:

* raw cache: a ``llama_kv_cache_iswa`` over every block (``n_layer_all``; ``load_arch_hparams`` marks
  all of them SWA, so its non-SWA half holds no layer), K only (``dsv4_make_k_only``: the MLA path,
  no V tensor), ``n_embd_head_k * n_head_kv`` wide, ``GGML_PAD(min(kv_size, n_swa + n_ubatch), 256)``
  cells (``-swa-full``: ``kv_size``) by ``n_seq_max`` streams (``unified_raw = false``: ``-kvu`` is
  ignored);
* CSA cache: the ratio-4 blocks, K only, ``GGML_PAD(max(1, ceil(kv_size / 4)), 256)`` cells;
* HCA cache: the ratio-128 blocks, K only, ``GGML_PAD(max(1, ceil(kv_size / 128)), 256)`` cells;
* lightning-indexer cache: the ratio-4 blocks, one head of ``attention.indexer.key_length``, the
  CSA's cells.  All four in ``-ctk``'s type, each tensor ``[width, cells, n_seq_max]``;
* compressor states (``llama_dsv4_comp_state``, 896-1003): per compressed trunk block (``n_layer()``:
  not the NextN blocks) two f32 tensors (kv, score) of ``n_embd_state x state_size x n_seq_max *
  (1 + n_rs_seq)``: CSA ``2*head_k x 8``, HCA ``head_k x 128``, indexer ``2*indexer_head x 8``.

``kv_size`` is ``n_ctx_seq``.  Every tensor sits on its layer's device when the KV is offloaded
(``model.dev_layer(il)``), else in the CPU buffer type; each cache and each state makes one buffer
per buffer type, logged ``<buft> KV buffer size`` (the caches) and ``<buft> DSV4 <csa|hca|lid> state
buffer size`` (the states, here of kind ``rs``).  The per-architecture figures are one
:class:`CompressedKvArch` in :data:`COMPRESSED_KV_ARCHS`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from offload_planner.core.buffer import Buffer
from offload_planner.core.ggml_types import type_by_name
from offload_planner.core.placement import CPU, Placement
from offload_planner.core.units import pad

if TYPE_CHECKING:
    from offload_planner.core.devices import Device, DeviceSet
    from offload_planner.core.dialects.base import Dialect
    from offload_planner.core.memory import ContextParams, ResolvedContext
    from offload_planner.core.model import Model

F32_BYTES = 4
STATE_KIND = "rs"  # the compressor states: per-sequence rows like a recurrent state


@dataclass(frozen=True)
class CompressedKvArch:
    """One architecture's compressed cache in the pinned build (``llama_kv_cache_dsv4``)."""

    csa_ratio: int  # DSV4_CSA_RATIO: compressed sparse attention, with the lightning indexer
    hca_ratio: int  # DSV4_HCA_RATIO: heavily compressed attention
    ratios_key: str  # per block: 0 (window only), csa_ratio or hca_ratio
    indexer_key: str  # the indexer's head size
    rollback: bool  # llm_arch_supports_rs_rollback: the states keep n_rs_seq snapshots


#: The architectures whose memory is a compressed KV cache, by ``general.architecture``.
COMPRESSED_KV_ARCHS: dict[str, CompressedKvArch] = {
    "deepseek4": CompressedKvArch(4, 128, "attention.compress_ratios", "attention.indexer.key_length",
                                  rollback=True),
}


def compressed_arch(model: Model, p: ContextParams) -> CompressedKvArch | None:
    """The layout when the pinned mainline build runs ``model`` (another build: not modelled,
    ``Dialect.compressed_kv_cache``)."""
    if not p.dialect.compressed_kv_cache:
        return None
    return COMPRESSED_KV_ARCHS.get(model.arch)


def memory_notes(model: Model, dialect: Dialect) -> list[str]:
    """What the plan must say when another build runs a compressed-KV model (no silent wrong figure)."""
    if model.arch in COMPRESSED_KV_ARCHS and not dialect.compressed_kv_cache:
        return [f"{model.arch}: the compressed KV cache this build gives it is not modelled (the KV shown is "
                "a plain cache of every layer; the pinned llama.cpp's compressed caches and compressor "
                "states are modelled)"]
    return []


def layer_note(model: Model, il: int) -> str:
    """What a block of a compressed-KV model keeps per sequence, for the per-layer map."""
    arch = COMPRESSED_KV_ARCHS.get(model.arch)
    if arch is None or il >= model.summary.n_layer:
        return ""
    ratio = layer_ratios(model, arch)[il]
    window = f"its last {model.summary.n_swa} tokens' keys (the raw window cache)"
    if ratio == arch.csa_ratio:
        return (f"CSA block: {window}, one compressed key per {ratio} tokens and the lightning indexer's "
                "key per compressed row (K only), and its compressor states (f32, rs)")
    if ratio == arch.hca_ratio:
        return (f"HCA block: {window}, one compressed key per {ratio} tokens (K only) and its compressor "
                "state (f32, rs)")
    return f"window-only block: {window} (K only)"


def layer_ratios(model: Model, arch: CompressedKvArch) -> tuple[int, ...]:
    raw = model.metadata.get(f"{model.arch}.{arch.ratios_key}")
    n = model.summary.n_layer
    vals = [int(x) for x in raw] if isinstance(raw, Sequence) and not isinstance(raw, str) else []
    return tuple(vals[:n] + [0] * (n - len(vals[:n])))


def _n_trunk(model: Model) -> int:
    """``n_layer()``: the NextN blocks count only when the file has their ``eh_proj`` (load_arch_hparams)."""
    s = model.summary
    if s.n_nextn and model.get(f"blk.{s.n_layer - s.n_nextn}.nextn.eh_proj.weight") is not None:
        return s.n_layer - s.n_nextn
    return s.n_layer


@dataclass(frozen=True)
class _Cache:
    name: str  # what the buffer explanation says
    layers: tuple[int, ...]
    width: int  # elements per cell (K only)
    cells: int


def _caches(model: Model, arch: CompressedKvArch, ctx: ResolvedContext, p: ContextParams) -> list[_Cache]:
    s = model.summary
    kv_size = ctx.n_ctx_seq
    ratios = layer_ratios(model, arch)
    head_k = s.head_dim_k
    idx_k = model.arch_int(arch.indexer_key, 0)
    swa_cells = kv_size if p.swa_full else pad(min(kv_size, s.n_swa + ctx.n_ubatch), 256)
    csa = tuple(il for il in range(s.n_layer) if ratios[il] == arch.csa_ratio)
    hca = tuple(il for il in range(s.n_layer) if ratios[il] == arch.hca_ratio)
    csa_cells = pad(max(1, -(-kv_size // arch.csa_ratio)), 256)
    hca_cells = pad(max(1, -(-kv_size // arch.hca_ratio)), 256)
    return [
        _Cache("raw window", tuple(range(s.n_layer)), -1, swa_cells),  # width per layer (head_kv)
        _Cache(f"CSA 1/{arch.csa_ratio}", csa, head_k, csa_cells),
        _Cache(f"HCA 1/{arch.hca_ratio}", hca, head_k, hca_cells),
        _Cache("indexer", csa, idx_k, csa_cells),
    ]


def kv_buffers(model: Model, arch: CompressedKvArch, placement: Placement, ctx: ResolvedContext,
               p: ContextParams, devices: DeviceSet, only: range | None = None) -> list[Buffer]:
    """The caches' ``KV buffer size`` (one buffer per device, summed over the four caches) and the
    compressor states' buffers (kind ``rs``); ``only``: those of these blocks alone (the speed model's
    per-layer figures), None: all."""
    s = model.summary
    tk = type_by_name(p.type_k)
    n_stream = max(1, p.n_seq_max)
    devs: dict[str, Device] = {}

    def dev_of(il: int) -> tuple[str, Device]:
        name = placement.layer_device(il) if p.offload_kqv else CPU
        return name, devs.get(name) or devs.setdefault(name, devices.by_name(name) or devices.cpu)

    kv: dict[str, int] = defaultdict(int)
    why: dict[str, list[str]] = defaultdict(list)
    for c in _caches(model, arch, ctx, p):
        per: dict[str, int] = defaultdict(int)
        for il in c.layers:
            if only is not None and il not in only:
                continue
            name, dev = dev_of(il)
            width = s.head_dim_k * s.head_kv(il) if c.width < 0 else c.width
            kv[name] += pad(tk.row_bytes(width) * c.cells * n_stream, dev.alignment)
            per[name] += 1
        for name, n in per.items():
            why[name].append(f"{c.name} {n} layers x {c.cells} cells")
    out = [Buffer(d, d, "kv", kv[d], f"DeepSeek V4 compressed KV, K {p.type_k} only, {n_stream} streams: "
                  + "; ".join(why[d])) for d in kv]
    return out + _state_buffers(model, arch, p, dev_of, only)


def _state_buffers(model: Model, arch: CompressedKvArch, p: ContextParams,
                   where: Callable[[int], tuple[str, Device]], only: range | None) -> list[Buffer]:
    ratios = layer_ratios(model, arch)
    head_k = model.summary.head_dim_k
    idx_k = model.arch_int(arch.indexer_key, 0)
    planes = max(1, p.n_seq_max) * (1 + (p.n_rs_seq if arch.rollback else 0))
    states = [  # name, ratio of its layers, n_embd_state, state_size
        ("csa", arch.csa_ratio, 2 * head_k, 2 * arch.csa_ratio),
        ("hca", arch.hca_ratio, head_k, arch.hca_ratio),
        ("lid", arch.csa_ratio, 2 * idx_k, 2 * arch.csa_ratio),
    ]
    per: dict[str, int] = defaultdict(int)
    for _name, ratio, width, rows in states:
        for il in range(_n_trunk(model)):
            if ratios[il] != ratio or (only is not None and il not in only):
                continue
            name, dev = where(il)
            per[name] += 2 * pad(width * rows * planes * F32_BYTES, dev.alignment)
    return [Buffer(d, d, STATE_KIND, n, f"DeepSeek V4 compressor states (CSA, HCA, indexer): f32 kv + score, "
                   f"{planes} planes") for d, n in per.items()]
