"""Per-device, per-buffer memory as llama.cpp allocates it: weights, KV cache, output, compute.

Weights: one buffer per buffer type, sized Σ pad(alloc_size(t), alignment) (``ggml_backend_buft_
alloc_buffer_n_plan``); with mmap, CPU weights are a ``CPU_Mapped`` buffer (a Metal GPU's ``MTL0_Mapped``)
whose reported size is the file span from the first to the last byte of its tensors, per shard
(``get_mapping_range``).
KV: per layer on the layer's device (CPU with -nkvo), ``[n_embd_k_gqa, cells, n_stream]`` K and
V tensors (no V for MLA; V padded to the widest layer without flash attention); SWA layers hold
``pad(min(cells, n_swa·(unified ? n_seq : 1) + n_ubatch), 256)`` cells unless --swa-full.
Output: ``4·n_vocab·n_seq_max`` bytes in the output device's host buffer (``output_reserve``).
Compute: llama.cpp's graph reservation simulated on shapes (see :mod:`compute`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import Protocol

from offload_planner.core.buffer import IK_CPU_BUFFER_EXTRA as IK_CPU_BUFFER_EXTRA  # kept importable here
from offload_planner.core.buffer import Buffer
from offload_planner.core.compressed_kv import compressed_arch
from offload_planner.core.compressed_kv import kv_buffers as compressed_kv_buffers
from offload_planner.core.devices import Device, DeviceSet
from offload_planner.core.dialects.base import Dialect
from offload_planner.core.dialects.mainline import LLAMA_CPP
from offload_planner.core.dsa import indexer_kv_buffers
from offload_planner.core.extra_context import ExtraContext
from offload_planner.core.ggml_types import GGMLType, type_by_name
from offload_planner.core.item_changes import changed_items, kept_copy
from offload_planner.core.model import Model, Tensor
from offload_planner.core.placement import CPU, Placed, Placement
from offload_planner.core.recurrent_state import KIND as RS_KIND
from offload_planner.core.recurrent_state import kv_layers, with_recurrent_state
from offload_planner.core.units import MiB, pad

#: llama-server's -b and -ub when the command line leaves them unset (common/common.h).
DEFAULT_N_BATCH = 2048
DEFAULT_N_UBATCH = 512


@dataclass(frozen=True)
class ContextParams:
    """The context llama.cpp builds: resolved from -c, -b, -ub, -np, -kvu, -fa, -ctk/-ctv, ..."""

    n_ctx: int  # as requested (0 = trained length)
    n_batch: int = DEFAULT_N_BATCH
    n_ubatch: int = DEFAULT_N_UBATCH
    n_seq_max: int = 1
    kv_unified: bool = False
    flash_attn: bool = True
    type_k: str = "f16"
    type_v: str = "f16"
    offload_kqv: bool = True
    swa_full: bool = False
    n_outputs_max: int | None = None  # server: min(n_batch, n_seq_max); CLI: n_batch
    op_offload: bool = True  # --no-op-offload turns it off
    dialect: Dialect = LLAMA_CPP  # the server build: asked for its context, KV and buffer rules
    mla: int = 0  # ik_llama.cpp's -mla mode (deepseek2 models only; see core.ik)
    amb: int = 0  # ik_llama.cpp's -amb: MiB cap on the attention scratch (0: no cap)
    repack: bool = False  # ik_llama.cpp's -rtr: host weights repacked at load (core.ik_repack)
    n_rs_seq: int = 0  # recurrent-state rollback snapshots per sequence (core.recurrent_state)

    def __post_init__(self) -> None:
        if type(self.dialect) is str:  # a name (a caller without the object): the registered one
            object.__setattr__(self, "dialect", Dialect(self.dialect))


@dataclass(frozen=True)
class ResolvedContext:
    n_ctx: int  # after padding (total cells over all streams)
    n_ctx_seq: int
    n_stream: int
    n_batch: int
    n_ubatch: int
    swa_cells: int


def resolve_context(p: ContextParams, n_ctx_train: int, n_swa: int) -> ResolvedContext:
    """``llama_context`` constructor: n_ctx padded to 256; non-unified splits it per sequence.

    ik_llama.cpp (from its source, not measured here: no ik server binary is available): n_ctx
    padded to 256 with flash attention, else 32; one stream of n_ctx cells shared by the slots; SWA
    layers keep full-size caches (no --swa-compress)."""
    n_ctx = p.n_ctx or n_ctx_train
    n_batch = min(n_ctx, p.n_batch)
    n_ubatch = min(n_batch, p.n_ubatch or n_batch)
    if p.dialect.single_kv_stream:
        n_ctx = pad(n_ctx, 256 if p.flash_attn else 32)
        return ResolvedContext(n_ctx, n_ctx, 1, n_batch, n_ubatch, n_ctx)
    n_ctx = pad(n_ctx, 256)
    if p.kv_unified:
        n_ctx_seq, n_stream = n_ctx, 1
    else:
        n_ctx_seq = pad(n_ctx // p.n_seq_max, 256)
        n_ctx = n_ctx_seq * p.n_seq_max
        n_stream = p.n_seq_max
    swa = n_ctx_seq if p.swa_full else pad(
        min(n_ctx_seq, n_swa * (p.n_seq_max if p.kv_unified else 1) + n_ubatch), 256
    )
    return ResolvedContext(n_ctx, n_ctx_seq, n_stream, n_batch, n_ubatch, swa)


@dataclass
class DeviceMemory:
    device: Device
    buffers: list[Buffer] = field(default_factory=list)

    def total(self, kind: str | None = None) -> int:
        """Bytes as llama.cpp reports them (an mmap buffer counts its whole file span)."""
        return sum(b.bytes for b in self.buffers if kind is None or b.kind == kind)

    def resident(self, kind: str | None = None) -> int:
        """Bytes that take memory: an mmap buffer counts the tensors read from it, not the gaps."""
        return sum(b.bytes if b.resident is None else b.resident for b in self.buffers
                   if kind is None or b.kind == kind)

    @property
    def weights(self) -> int:
        return self.total("model")

    @property
    def kv(self) -> int:
        return self.total("kv")

    @property
    def rs(self) -> int:
        """The recurrent state of a hybrid model (core.recurrent_state)."""
        return self.total(RS_KIND)

    @property
    def compute(self) -> int:
        return self.total("compute")

    @property
    def output(self) -> int:
        return self.total("output")


@dataclass
class Projection:
    devices: list[DeviceMemory]  # llama.cpp device order, CPU last
    context: ResolvedContext
    placement: Placement
    extras: list[ExtraContext] = field(default_factory=list)  # draft/MTP/mmproj, counted in devices

    def device(self, name: str) -> DeviceMemory:
        return next(d for d in self.devices if d.device.name == name)

    def buffers(self) -> list[Buffer]:
        return [b for d in self.devices for b in d.buffers]


class _Sized(Protocol):
    @property
    def nbytes(self) -> int: ...
    @property
    def type(self) -> GGMLType: ...
    @property
    def shape(self) -> tuple[int, ...]: ...


def alloc_size(t: Tensor | _Sized, dev: Device) -> int:
    """``ggml_backend_buft_get_alloc_size``: CUDA pads quantized rows to a multiple of 512."""
    size = t.nbytes
    if dev.row_padding and t.type.quantized and t.shape[0] % dev.row_padding:
        size += t.type.row_bytes(dev.row_padding - t.shape[0] % dev.row_padding)
    return size


def weight_buffers(model: Model, placement: Placement, devices: DeviceSet) -> list[Buffer]:
    """One buffer per (device, buffer type) in order of first use, then the mmap spans per shard.

    Computed from a recorded reference placement (the nearest of the last few computed in full for
    this model and device set: the --fit search alternates between placements far apart) when few
    items differ from it by identity (``Placed`` is frozen, and the reference keeps its items alive):
    the reference's per-buffer totals, corrected for the changed items.  The result is the same as
    :func:`weight_buffers_full`'s (``tests/core/test_compute_incremental.py``)."""
    items = placement.items
    key = (model, devices)
    with _WEIGHT_LOCK:  # the window projects on its GUI thread and a worker
        refs = _WEIGHT_REFS.get(key)
        best: tuple[list[int], _WeightRef] | None = None
        for ref in refs or ():
            if len(ref.items) == len(items):
                changed = changed_items(items, ref.items)
                if best is None or len(changed) < len(best[0]):
                    best = changed, ref
        if refs is not None and best is not None and len(best[0]) <= max(_WEIGHT_DELTA_MIN, len(items) // 8):
            _WEIGHT_REFS.move_to_end(key)
            weight_stats["delta"] += 1
            return best[1].buffers(items, best[0])
        ref = _WeightRef(items, devices)
        refs = _WEIGHT_REFS.setdefault(key, [])
        _WEIGHT_REFS.move_to_end(key)
        refs.append(ref)
        del refs[:-_WEIGHT_REFS_PER_KEY]
        if len(_WEIGHT_REFS) > _WEIGHT_REFS_SIZE:
            _WEIGHT_REFS.popitem(last=False)
        weight_stats["full"] += 1
        return ref.buffers(items, [])


def weight_buffers_full(model: Model, placement: Placement, devices: DeviceSet) -> list[Buffer]:
    """:func:`weight_buffers` computed from scratch (nothing recorded)."""
    return _WeightRef(placement.items, devices).buffers(placement.items, [])


_WEIGHT_REFS: OrderedDict[tuple[Model, DeviceSet], list[_WeightRef]] = OrderedDict()
_WEIGHT_REFS_SIZE = 4
_WEIGHT_REFS_PER_KEY = 3  # the latest placements computed in full (a --fit search's far ones and near ones)
_WEIGHT_LOCK = threading.Lock()
_WEIGHT_DELTA_MIN = 64  # changed items below which the reference is corrected rather than replaced
weight_stats = {"delta": 0, "full": 0}


class _WeightRef:
    """The weight buffers of one placement, kept so that a placement differing in a few items is
    computed from them: per (device, buffer type) the padded total, the count and the item indices
    in order; per mapped buffer (``CPU_Mapped``, Metal's ``MTL0_Mapped``) and shard the items by offset and
    by end, and the bytes read."""

    def __init__(self, items: list[Placed], devices: DeviceSet) -> None:
        self.items = kept_copy(items)
        self.devices = devices
        self._dev: dict[str, Device] = {}
        self.padded: dict[tuple[str, str], int] = {}  # insertion order: order of first use
        self.index: dict[tuple[str, str], list[int]] = {}
        # per mapped buffer: per shard (offset, end, index) of its items, and the bytes read
        by_shard: dict[str, tuple[defaultdict[int, list[tuple[int, int, int]]], defaultdict[int, int]]] = {}
        padded, index = self.padded, self.index
        #: the buffers wrapping mapped weights (is_mapped_buffer) and their devices: ~1,000 items are tested
        mapped = self.mapped = {n: d.name for d in devices if (n := d.mapped_buffer_name) is not None}
        cur: str | None = None
        lists: defaultdict[int, list[tuple[int, int, int]]] = defaultdict(list)
        read: defaultdict[int, int] = defaultdict(int)
        rules: dict[str, tuple[int, int]] = {}  # device -> (row padding, alignment)
        for i, p in enumerate(self.items):
            if p.device is None or p.buft is None:
                continue
            t = p.tensor
            if p.buft in mapped:  # CPU_Mapped, MTL0_Mapped
                if p.buft is not cur:  # the same buffer as the item before, mostly
                    cur = p.buft
                    per = by_shard.get(cur)
                    if per is None:
                        per = by_shard[cur] = (defaultdict(list), defaultdict(int))
                    lists, read = per
                lists[t.shard].append((t.offset, t.offset + t.nbytes, i))
                read[t.shard] += t.nbytes
                continue
            k = (p.device, p.buft)
            rule = rules.get(p.device)
            if rule is None:
                dev = self._device(p.device)
                rule = rules[p.device] = (dev.row_padding, dev.alignment)
            size, (row_padding, align) = t.nbytes, rule  # self._size(p), inlined: ~1,000 items
            if row_padding and t.type.quantized and t.shape[0] % row_padding:
                size += t.type.row_bytes(row_padding - t.shape[0] % row_padding)  # alloc_size
            padded[k] = padded.get(k, 0) + -(-size // align) * align  # pad
            ix = index.get(k)
            if ix is None:
                index[k] = [i]
            else:
                ix.append(i)
        spans = {(b, s, mapped[b]): v for b, per in by_shard.items() for s, v in per[0].items()}
        self.read: dict[_SpanKey, int] = {(b, s, mapped[b]): n for b, per in by_shard.items()
                                          for s, n in per[1].items()}
        self.by_lo = {k: sorted(v) for k, v in spans.items()}
        self.by_hi = {k: sorted(v, key=lambda e: e[1], reverse=True) for k, v in spans.items()}

    def _device(self, name: str) -> Device:
        d = self._dev.get(name)
        if d is None:
            d = self._dev[name] = self.devices.by_name(name) or self.devices.cpu
        return d

    def _size(self, p: Placed) -> int:
        assert p.device is not None
        dev = self._device(p.device)
        return pad(alloc_size(p.tensor, dev), dev.alignment)

    def buffers(self, items: list[Placed], changed: list[int]) -> list[Buffer]:
        """The buffers of ``items``, which equal the reference's items except at ``changed``."""
        padded = dict(self.padded)
        counts = {k: len(ix) for k, ix in self.index.items()}
        gone: set[int] = set()  # changed indices (their reference items no longer count)
        new_first: dict[tuple[str, str], int] = {}
        read = dict(self.read)
        add_lo: dict[_SpanKey, int] = {}
        add_hi: dict[_SpanKey, int] = {}
        for i in changed:
            gone.add(i)
            for p, sign in ((self.items[i], -1), (items[i], 1)):
                if p.device is None or p.buft is None:
                    continue
                if p.buft in self.mapped:
                    t = p.tensor
                    sk = (p.buft, t.shard, p.device)
                    read[sk] = read.get(sk, 0) + sign * t.nbytes
                    if sign > 0:
                        add_lo[sk] = min(add_lo.get(sk, t.offset), t.offset)
                        add_hi[sk] = max(add_hi.get(sk, 0), t.offset + t.nbytes)
                    continue
                k = (p.device, p.buft)
                padded[k] = padded.get(k, 0) + sign * self._size(p)
                counts[k] = counts.get(k, 0) + sign
                if sign > 0 and i < new_first.get(k, len(items)):
                    new_first[k] = i
        firsts: list[tuple[int, tuple[str, str]]] = []
        for k, n in counts.items():
            if not n:
                continue
            first = new_first.get(k, len(items))
            for i in self.index.get(k, ()):
                if i not in gone:
                    first = min(first, i)
                    break
            firsts.append((first, k))
        firsts.sort()
        out = []
        for _, k in firsts:
            d, b = k
            align = self._device(d).alignment
            out.append(Buffer(d, b, "model", padded[k], f"{counts[k]} tensors, each padded to {align} B"))
        for sk in sorted(set(self.by_lo) | set(add_lo)):  # llama.cpp's order: by buffer type name, then file
            lo = next((e[0] for e in self.by_lo.get(sk, ()) if e[2] not in gone), None)
            hi = next((e[1] for e in self.by_hi.get(sk, ()) if e[2] not in gone), None)
            if sk in add_lo:
                lo = add_lo[sk] if lo is None else min(lo, add_lo[sk])
                hi = add_hi[sk] if hi is None else max(hi, add_hi[sk])
            if lo is not None and hi is not None:
                out.append(_span_buffer(sk, lo, hi, read[sk]))
        return out


#: a mapped buffer of the weights: (its name, the shard, its device)
_SpanKey = tuple[str, int, str]


def _span_buffer(sk: _SpanKey, lo: int, hi: int, read: int) -> Buffer:
    """The buffer llama.cpp wraps a shard's mapped bytes ``lo..hi`` in (``get_mapping_range``: from the
    first to the last byte of the buffer type's tensors in that file; the size logged is ``hi - lo``,
    unaligned: ggml-metal.cpp:750 ``ggml_backend_buffer_init(..., size)``, Metal page-aligns only the
    MTLBuffer it makes). The CPU's counts the bytes read (page cache); a Metal device's counts the whole
    span, which Metal maps into the GPU's working set: llama.cpp issue 24510 (``-ngl 2`` of a 30 GB file
    whose output.weight lies at its start: ``MTL0_Mapped model buffer size = 30973 MiB``, over
    recommendedMaxWorkingSetSize, out of memory at decode)."""
    name, shard, device = sk
    if device == CPU:
        return Buffer(CPU, name, "model", hi - lo,
                      f"mmap span of shard {shard + 1}: bytes {lo}..{hi} of the file, as llama.cpp "
                      f"reports it; {read / MiB:.2f} MiB of it are tensors read from it "
                      "(page cache, not private RAM)", resident=read, tensor_bytes=read)
    return Buffer(device, name, "model", hi - lo,
                  f"mmap span of shard {shard + 1}: bytes {lo}..{hi} of the file, as llama.cpp reports it, "
                  f"all of it in the GPU's working set (the backend wraps the mapped file); "
                  f"{read / MiB:.2f} MiB of it are this device's tensors", tensor_bytes=read)


def kv_buffers(model: Model, placement: Placement, ctx: ResolvedContext, p: ContextParams,
               devices: DeviceSet, cached: range | None = None) -> list[Buffer]:
    """``cached``: the layers this context caches (default the trunk; an MTP context: the NextN).

    Remembered for the last few layer splits (a move of experts leaves them as they are); handed out
    as copies."""
    key = (model, ctx, p, devices, cached, tuple(placement.unit_devices))
    with _KV_LOCK:
        bufs = _KV_MEMO.get(key)
        if bufs is None:
            bufs = _KV_MEMO[key] = _kv_buffers(model, placement, ctx, p, devices, cached)
            if p.dialect.dsa_indexer_cache:  # DeepSeek V3.2 / GLM-5: the indexer's key cache (core.dsa)
                bufs += indexer_kv_buffers(model, placement, ctx, p, devices, cached)
            if len(_KV_MEMO) > _KV_MEMO_SIZE:
                _KV_MEMO.popitem(last=False)
        else:
            _KV_MEMO.move_to_end(key)
        return [b.copy() for b in bufs]


_KV_MEMO: OrderedDict[tuple[object, ...], list[Buffer]] = OrderedDict()
_KV_MEMO_SIZE = 16
_KV_LOCK = threading.Lock()


def _kv_buffers(model: Model, placement: Placement, ctx: ResolvedContext, p: ContextParams,
                devices: DeviceSet, cached: range | None) -> list[Buffer]:
    compressed = compressed_arch(model, p)
    # DeepSeek V4: its own cache (core.compressed_kv) of the trunk, or of some trunk blocks (the speed
    # model's per-layer figures); an MTP context's NextN blocks keep a plain cache (create_memory)
    if compressed is not None and (cached is None or max(cached, default=0) < model.summary.n_layer_trunk):
        return compressed_kv_buffers(model, compressed, placement, ctx, p, devices, cached)
    s = model.summary
    tk, tv = type_by_name(p.type_k), type_by_name(p.type_v)
    v_trans = not p.flash_attn
    n_trunk = s.n_layer_trunk
    head_k_swa = model.arch_int("attention.key_length_swa", s.head_dim_k)
    head_v_swa = model.arch_int("attention.value_length_swa", s.head_dim_v)
    d = p.dialect
    own_rows = d.own_kv_rows(model)

    def dims_of(il: int) -> tuple[int, int]:
        hk, hv = (head_k_swa, head_v_swa) if s.swa_layers[il] else (s.head_dim_k, s.head_dim_v)
        n_kv = s.head_kv(il)
        return hk * n_kv, hv * n_kv

    all_dims = [dims_of(il) for il in range(max(s.n_layer, n_trunk))]
    dims = all_dims.__getitem__

    def row_bytes(il: int) -> tuple[int, int]:
        """Bytes per cell of K and V; mainline pads a transposed V to the widest layer."""
        if own_rows:
            k_row, v_row, _ = d.kv_rows(model, il, p, tk, tv)
            return k_row, v_row
        k_gqa, v_gqa = dims(il)
        if s.is_mla and d.mla_k_only_cache:
            return tk.row_bytes(k_gqa), 0
        return tk.row_bytes(k_gqa), tv.row_bytes(v_max if v_trans and d.pads_transposed_v else v_gqa)

    v_max = max((d[1] for d in all_dims[:s.n_layer]), default=0)
    per_dev: dict[str, int] = defaultdict(int)
    layers: dict[str, int] = defaultdict(int)
    by_name: dict[str, Device] = {}
    for il in kv_layers(model, range(n_trunk) if cached is None else cached, d):  # a hybrid: its attention
        dev_name = placement.layer_device(il) if p.offload_kqv else CPU
        cells = ctx.swa_cells if s.swa_layers[il] else ctx.n_ctx_seq
        dev = by_name.get(dev_name)
        if dev is None:
            dev = by_name[dev_name] = devices.by_name(dev_name) or devices.cpu
        k_row, v_row = row_bytes(il)
        per_dev[dev_name] += pad(k_row * cells * ctx.n_stream, dev.alignment)
        if v_row:
            per_dev[dev_name] += pad(v_row * cells * ctx.n_stream, dev.alignment)
        layers[dev_name] += 1
    if own_rows:
        kinds = d.kv_rows(model, 0, p, tk, tv)[2]
        why = f"{ctx.n_ctx_seq} cells, {d.value} {kinds}, K {p.type_k}" + (
            f", V {p.type_v}" if row_bytes(0)[1] else "")
    else:
        mla_k_only = s.is_mla and d.mla_k_only_cache
        why = (f"{ctx.n_ctx_seq} cells x {ctx.n_stream} streams, K {p.type_k}"
               + ("" if mla_k_only else f", V {p.type_v}") + (", MLA: K only" if mla_k_only else "")
               + (f", SWA layers {ctx.swa_cells} cells" if s.has_swa else ""))
    return [Buffer(d, d, "kv", n, f"{layers[d]} layers; {why}") for d, n in per_dev.items()]


def host_buffer_name(devices: DeviceSet, device: str) -> str:
    """The host buffer type of ``device`` (``CUDA_Host`` for a CUDA GPU), ``CPU`` when it has none:
    the CPU device has no host buffer type (ggml-cpu.cpp: ``get_host_buffer_type = NULL``)."""
    dev = devices.by_name(device)
    return dev.host_buffer_name if dev is not None and dev.host_buffer_name else CPU


def output_buffer(model: Model, placement: Placement, p: ContextParams, devices: DeviceSet) -> Buffer:
    """Logits: in the host buffer type of the output layer's device, plain ``CPU`` when the output
    layer is not offloaded (llama-context.cpp ``output_reserve``: ``ggml_backend_dev_host_buffer_type(
    model.dev_output())``, NULL for the CPU device)."""
    n_vocab = model.summary.n_vocab
    name = host_buffer_name(devices, placement.output_device)
    return Buffer(CPU, name, "output", 4 * n_vocab * p.n_seq_max,
                  f"logits for {p.n_seq_max} sequences x {n_vocab} tokens x 4 B")


def project(model: Model, devices: DeviceSet, placement: Placement, p: ContextParams, *,
            compute: list[Buffer] | None = None) -> Projection:
    """Every device's buffers. ``compute`` reuses compute buffers already simulated (an editor's
    instant update while the ~100 ms simulation of the new plan runs); None simulates them."""
    s = model.summary
    ctx = resolve_context(p, s.n_ctx_train, s.n_swa)
    bufs = weight_buffers(model, placement, devices)
    kv = kv_buffers(model, placement, ctx, p, devices, p.dialect.main_kv_layers(model, placement))
    bufs += with_recurrent_state(model, placement, p, ctx, devices, kv)
    bufs.append(output_buffer(model, placement, p, devices))
    bufs = p.dialect.extra_buffers(model, devices, placement, p, bufs)
    if compute is None:  # the dialect's own simulator, else mainline's graph
        compute = p.dialect.compute_buffers(model, devices, placement, ctx, p)
    if compute is None:
        from offload_planner.core.compute import compute_buffers

        compute = compute_buffers(model, devices, placement, ctx, p)
    bufs += compute
    bufs = p.dialect.annotate_compute(model, ctx, p, bufs)
    mems = {d.name: DeviceMemory(d) for d in devices}
    for b in bufs:
        mems[b.device if b.device in mems else CPU].buffers.append(b)
    return Projection([mems[n] for n in devices.names], ctx, placement)
