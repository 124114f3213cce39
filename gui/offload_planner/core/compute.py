"""Compute buffers as llama.cpp reserves them: the model's graph, scheduled and allocated in miniature.

llama.cpp sizes each backend's compute buffer by building the worst-case graph (``sched_reserve``:
a prompt ubatch of ``min(n_ctx, n_ubatch)`` tokens over the full KV cache, then the one-token-per-
sequence graph; each buffer keeps the larger), splitting it over the backends
(``ggml_backend_sched_split_graph``) and running the graph allocator over it (``ggml_gallocr``: tensors
are freed after their last use, a node may reuse its parent's memory in place, free blocks are taken
best-fit).  There is no closed form: the peak is wherever the live set of one layer, the inputs and the
copies between backends is largest.  So this module does the same thing on shapes only:

* a mini ggml (:class:`T` and the op constructors) with ggml's shapes, strides, views and in-place
  rules, and ``ggml_build_forward_expand``'s depth-first node order;
* the graph of each supported architecture (``src/models/*.cpp`` + ``src/llama-graph.cpp``):
  token-embedding ``GET_ROWS`` (plus the unused mixed-batch branch), the KQ mask(s) (f16 with flash
  attention, f32 without; a second mask for SWA layers), KV stores as ``SET_ROWS`` views, flash
  attention or ``KQ``/``softmax``/``KQV``, dense and MoE FFNs with every router/top-k/weighting
  tensor, the ``out_ids`` row selection of the last layer, the logits of ``n_outputs`` rows;
* the scheduler's backend assignment (weights pin ops, GPU backends expand up and down, inputs live
  on the CPU, ``norm`` tensors forced to their layer's device), its splits and the copies of split
  inputs, op offload of host weights to the first GPU that offloads the op (CUDA-like devices, batch
  >= 32), and pipeline parallelism (4 copies of every graph input and split input, never freed);
* ``ggml_gallocr`` / ``ggml_dyn_tallocr`` exactly: leafs first, child and view counts, in-place reuse,
  best-fit free blocks with merging, per-buffer-type alignment.

Supported architectures: llama, qwen2, qwen3, qwen3moe, deepseek2 (MLA), glm4moe, gpt-oss, gemma3,
gptneox.
Others (and files whose tensors do not fit their architecture's graph) get :func:`term_estimate`:
a KQ mask (+ KQ scores without flash attention) and the largest layer's activations per device,
the logits on the output device; flagged as an estimate in ``why``.

Calibration notes (no bench: measured against the pinned llama.cpp, ``llama-server -lv 4`` and
``llama-fit-params -lv 5``; ``tests/integration/test_compute_vs_llama.py`` repeats it):

* Small models, CPU only and with one or two ggml-rpc-server devices: equal to the 0.01 MiB llama.cpp
  prints on every buffer of ~75 command lines (six architectures, plus qwen2/qwen3 dense written with
  a patched synth), over -ngl, -ts, -ot (to CPU and to RPC), -c, -b, -ub (16..1024), -fa on/off/auto,
  -ctk/-ctv f16/q8_0/q4_0, -np/-kvu, -nkvo, --swa-full, pipeline parallelism; graph node and split
  counts equal llama.cpp's.  Real-size CPU-only server runs (Qwen3-30B-A3B, gpt-oss-120b,
  GLM-4.5-Air as sparse files, ``-nr``): equal too.
* Real-size dry runs (DeepSeek-V3, Qwen3-30B-A3B, gpt-oss-120b, GLM-4.5-Air; CPU only and with
  1-2 RPC devices; -c up to 131072, -ub up to 2048): equal to ``llama-fit-params`` with
  ``simulate(no_alloc=True)``.  The dry run is not what the server allocates: its
  ``ggml_backend_sched_reserve_size`` resets the scheduler and drops the ``norm`` tensors forced
  onto their layer's device (and -nkvo's CPU attention output), so on a layer-split it may copy one
  more activation per boundary (GLM-4.5-Air, 2 RPC, -c 16384: 448.05 MiB against the server's
  416.05 on RPC1).  ``compute_buffers`` projects the server.
* Not verifiable without the hardware, modelled from the source: CUDA op offload of host weights
  (:data:`OP_OFFLOAD_MIN_BATCH`: each offloaded op with a host weight starts a split whose copy is
  freed after use, so the peak holds one weight copy, rows padded to 512 elements), and the f16
  copies of non-f16 K/V that CUDA's tile/MMA flash attention adds to the FA node
  (``ggml_cuda_flash_attn_ext_get_alloc_size``).  Vulkan and Metal reorder split graphs
  (``graph_optimize``), which is not modelled.
"""

from __future__ import annotations

import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Generic, TypeVar, cast

from offload_planner.core.devices import DeviceKind
from offload_planner.core.ggml_types import GGMLType, type_by_name

if TYPE_CHECKING:
    from offload_planner.core.devices import Device, DeviceSet
    from offload_planner.core.memory import Buffer, ContextParams, ResolvedContext
    from offload_planner.core.model import Model
    from offload_planner.core.placement import Placement

CPU = "CPU"
MiB = 1024 * 1024

#: Minimum batch at which a backend takes an op whose weight is in host memory (``offload_op``,
#: ``GGML_OP_OFFLOAD_MIN_BATCH`` default 32); absent: the backend never offloads (RPC has no
#: ``offload_op``).  Batch is ``get_op_batch_size``: rows of the output, n_tokens for MUL_MAT_ID/ROPE.
OP_OFFLOAD_MIN_BATCH: dict[DeviceKind, int] = {
    DeviceKind.CUDA: 32, DeviceKind.ROCM: 32, DeviceKind.SYCL: 32, DeviceKind.VULKAN: 32,
    DeviceKind.METAL: 32,
}
#: Backends that offload only some ops (Metal: matrix multiplications).
OP_OFFLOAD_ONLY: dict[DeviceKind, frozenset[str]] = {
    DeviceKind.METAL: frozenset({"MUL_MAT", "MUL_MAT_ID"}),
}
#: Devices whose graph allocator pads quantized rows to 512 elements (MATRIX_ROW_PADDING) and
#: whose flash attention allocates f16 copies of quantized K/V.
CUDA_LIKE = frozenset({DeviceKind.CUDA, DeviceKind.ROCM})
#: Devices that support async compute and events (needed for pipeline parallelism).
ASYNC_EVENTS = frozenset({DeviceKind.CUDA, DeviceKind.ROCM, DeviceKind.RPC, DeviceKind.SYCL,
                          DeviceKind.VULKAN, DeviceKind.METAL})
N_COPIES_PIPELINE = 4  # GGML_SCHED_MAX_COPIES

F32 = type_by_name("f32")
F16 = type_by_name("f16")
I32 = type_by_name("i32")
I64 = type_by_name("i64")

INPUT = 1
OUTPUT = 2

VIEW_OPS = frozenset({"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"})
INPLACE_OPS = frozenset({
    "FILL", "SCALE", "DIAG_MASK_ZERO", "DIAG_MASK_INF", "ADD", "ADD_ID", "ADD1", "SUB", "MUL", "DIV",
    "SQR", "SQRT", "LOG", "UNARY", "ROPE", "ROPE_BACK", "SILU_BACK", "RMS_NORM", "RMS_NORM_BACK",
    "CLAMP", "SOFT_MAX", "SOFT_MAX_BACK",
})
_LAYER = re.compile(r"-(\d+)$")


# --- mini ggml: tensors ------------------------------------------------------------------------


class T:
    """A ggml tensor as far as scheduling and allocation care: shape, strides, type, op, sources."""

    __slots__ = ("alloc", "bid", "dev", "flags", "n_children", "n_views", "name", "nb", "ne", "op",
                 "src", "type", "view_offs", "view_src", "weights")
    view_src: T | None
    view_offs: int

    def __init__(self, type_: GGMLType, ne: Sequence[int], *, op: str = "NONE",
                 src: Sequence[T | None] = (), view_src: T | None = None, view_offs: int = 0,
                 name: str = "") -> None:
        if view_src is not None and view_src.view_src is not None:
            base: T = view_src.view_src
            view_offs += view_src.view_offs
            view_src = base
        self.type = type_
        self.ne = [*ne, 1, 1, 1, 1][:4]
        self.nb = _contiguous_nb(type_, self.ne)
        self.op = op
        self.src: list[T | None] = list(src)
        self.view_src = view_src
        self.view_offs = view_offs
        self.flags = 0
        self.name = name
        self.dev: str | None = None  # device holding pre-allocated data (weights, KV cache)
        self.weights = False  # in a weights buffer (GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        self.bid = -1  # scheduler backend id
        self.n_children = 0
        self.n_views = 0
        self.alloc: tuple[int, int] | None = None  # (buffer id, offset) while allocated by galloc

    def __repr__(self) -> str:
        return f"T({self.name or self.op} {self.type.name} {self.ne})"

    @property
    def location(self) -> str | None:
        """The device of the pre-allocated data this tensor or its view source lives in."""
        return self.view_src.dev if self.view_src is not None else self.dev


def _contiguous_nb(type_: GGMLType, ne: Sequence[int]) -> list[int]:
    nb = [type_.type_size, type_.type_size * (ne[0] // type_.block_size), 0, 0]
    nb[2] = nb[1] * ne[1]
    nb[3] = nb[2] * ne[2]
    return nb


def nbytes(t: T) -> int:
    """``ggml_nbytes``."""
    if any(n <= 0 for n in t.ne):
        return 0
    if t.type.block_size == 1:
        size = t.type.type_size
        for i in range(4):
            size += (t.ne[i] - 1) * t.nb[i]
        return size
    size = t.ne[0] * t.nb[0] // t.type.block_size
    for i in range(1, 4):
        size += (t.ne[i] - 1) * t.nb[i]
    return size


def nelements(t: T) -> int:
    return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]


def row_size(type_: GGMLType, n: int) -> int:
    return type_.type_size * n // type_.block_size


def is_contiguous(t: T) -> bool:
    return t.nb == _contiguous_nb(t.type, t.ne)


def same_layout(a: T, b: T) -> bool:
    return a.type is b.type and a.ne == b.ne and a.nb == b.nb


# --- mini ggml: op constructors -------------------------------------------------------------------


def new(type_: GGMLType, ne: Sequence[int], op: str = "NONE", *src: T | None) -> T:
    return T(type_, ne, op=op, src=src)


def dup_op(a: T, op: str, *src: T | None) -> T:
    """``ggml_dup_tensor(a)`` with ``op`` and sources (add, mul, norm, rope, softmax, ...)."""
    return T(a.type, a.ne, op=op, src=src or (a,))


def view_tensor(a: T, op: str = "VIEW", *src: T | None) -> T:
    t = T(a.type, a.ne, op=op, src=src or (a,), view_src=a)
    t.nb = list(a.nb)
    return t


def view(a: T, ne: Sequence[int], nb: Sequence[int], offset: int) -> T:
    """``ggml_view_{1,2,3,4}d``: explicit strides nb[1..len(ne)-1]; higher strides follow."""
    t = T(a.type, ne, op="VIEW", src=(a,), view_src=a, view_offs=offset)
    for i, s in enumerate(nb, start=1):
        t.nb[i] = s
    for i in range(len(nb) + 1, 4):
        t.nb[i] = t.nb[i - 1] * t.ne[i - 1]
    return t


def reshape(a: T, *ne: int) -> T:
    return T(a.type, ne, op="RESHAPE", src=(a,), view_src=a)


def permute(a: T, *axes: int) -> T:
    t = view_tensor(a, "PERMUTE")
    for i, ax in enumerate(axes):
        t.ne[ax] = a.ne[i]
        t.nb[ax] = a.nb[i]
    return t


def transpose(a: T) -> T:
    t = view_tensor(a, "TRANSPOSE")
    t.ne[0], t.ne[1] = a.ne[1], a.ne[0]
    t.nb[0], t.nb[1] = a.nb[1], a.nb[0]
    return t


def cont(a: T, *ne: int) -> T:
    return T(a.type, ne or a.ne, op="CONT", src=(a,))


def mul_mat(a: T, b: T) -> T:
    return new(F32, [a.ne[1], b.ne[1], b.ne[2], b.ne[3]], "MUL_MAT", a, b)


def mul_mat_id(w: T, b: T, ids: T) -> T:
    return new(F32, [w.ne[1], ids.ne[0], b.ne[2], 1], "MUL_MAT_ID", w, b, ids)


def get_rows(a: T, b: T) -> T:
    type_ = I32 if a.type is I32 else F32
    return new(type_, [a.ne[0], b.ne[0], b.ne[1], b.ne[2]], "GET_ROWS", a, b)


def set_rows(a: T, b: T, c: T) -> T:
    return view_tensor(a, "SET_ROWS", b, c, a)


def glu(a: T, b: T) -> T:
    return new(a.type, a.ne, "GLU", a, b)


def argsort_top_k(a: T, k: int) -> T:
    s = new(I32, a.ne, "ARGSORT", a)
    return view(s, [k, s.ne[1], s.ne[2], s.ne[3]], s.nb[1:4], 0)


def sum_rows(a: T) -> T:
    return new(a.type, [1, a.ne[1], a.ne[2], a.ne[3]], "SUM_ROWS", a)


def concat(a: T, b: T, dim: int) -> T:
    ne = list(a.ne)
    ne[dim] += b.ne[dim]
    return new(a.type, ne, "CONCAT", a, b)


def flash_attn_ext(q: T, k: T, v: T, mask: T | None, sinks: T | None) -> T:
    return new(F32, [v.ne[0], q.ne[2], q.ne[1], q.ne[3]], "FLASH_ATTN_EXT", q, k, v, mask, sinks)


def soft_max_ext(a: T, mask: T | None, sinks: T | None) -> T:
    return dup_op(a, "SOFT_MAX", a, mask, sinks)


def input_tensor(type_: GGMLType, ne: Sequence[int], name: str) -> T:
    t = T(type_, ne, name=name)
    t.flags |= INPUT
    return t


# --- graph -----------------------------------------------------------------------------------------


@dataclass
class Graph:
    """``ggml_cgraph``: nodes and leafs in ``ggml_visit_parents`` depth-first order."""

    nodes: list[T] = field(default_factory=list)
    leafs: list[T] = field(default_factory=list)
    visited: set[int] = field(default_factory=set)
    forced: dict[int, str] = field(default_factory=dict)  # id(tensor) -> device (set_tensor_backend)

    def expand(self, root: T) -> None:
        if id(root) in self.visited:
            return
        self.visited.add(id(root))
        stack = [(root, iter(root.src))]
        while stack:
            t, srcs = stack[-1]
            for s in srcs:
                if s is not None and id(s) not in self.visited:
                    self.visited.add(id(s))
                    stack.append((s, iter(s.src)))
                    break
            else:
                stack.pop()
                (self.leafs if t.op == "NONE" else self.nodes).append(t)


# --- the model's hyper-parameters and the context -------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """What the graph builders need of the model, context and placement for one reserve."""

    arch: str
    n_layer: int  # trunk layers (NextN excluded)
    n_embd: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    head_k: int
    head_v: int
    n_rot: int
    n_vocab: int
    swa: tuple[bool, ...]
    n_expert: int
    n_expert_used: int
    n_dense_lead: int
    expert_groups: int
    group_used: int
    gating: int  # 1 softmax, 2 sigmoid, 3 softmax-weight
    norm_w: bool
    w_scale: float
    head_k_mla: int
    head_v_mla: int
    kv_lora_rank: int
    softcap_final: float
    # context
    n_tokens: int
    n_seqs: int
    n_outputs: int
    n_kv: int
    n_kv_swa: int
    n_stream: int
    kv_unified: bool
    flash_attn: bool
    type_k: GGMLType
    type_v: GGMLType
    offload_kqv: bool
    full_offload: bool
    # 2025 builds (llama.cpp-2025): token rows only (no embedding / mixed-batch inputs) and an f32 KQ
    # mask padded to GGML_KQ_MASK_PAD rows, cast to f16 for flash attention
    legacy_inputs: bool = False


#: ``GGML_KQ_MASK_PAD`` of 2025 builds: the mask's token rows are padded to a multiple of it.
LEGACY_KQ_MASK_PAD = 64


def _md_float(model: Model, key: str, default: float) -> float:
    return model.arch_float(key, default)


def _per_layer(v: int | list[int], n: int) -> tuple[int, ...]:
    return tuple(v) if isinstance(v, list) else (v,) * n


#: Architectures whose graph normalizes the selected experts' weights regardless of the metadata.
NORM_W_ALWAYS = frozenset({"llama", "qwen3moe"})


def gating_func(model: Model) -> int:
    """``expert_gating_func``: 1 softmax, 2 sigmoid, 3 softmax over the selected (gpt-oss)."""
    if model.arch == "gpt-oss":
        return 3
    return model.arch_int("expert_gating_func", 1)


def make_shape(model: Model, ctx: ResolvedContext, p: ContextParams, n_tokens: int, n_seqs: int,
               n_outputs: int, full_offload: bool) -> Shape:
    s = model.summary
    n_trunk = s.n_layer_trunk
    return Shape(
        arch=model.arch, n_layer=n_trunk, n_embd=s.n_embd,
        n_head=_per_layer(s.n_head, s.n_layer), n_head_kv=_per_layer(s.n_head_kv, s.n_layer),
        head_k=s.head_dim_k, head_v=s.head_dim_v,
        n_rot=model.arch_int("rope.dimension_count", s.head_dim_k), n_vocab=s.n_vocab,
        swa=s.swa_layers, n_expert=s.n_expert, n_expert_used=s.n_expert_used,
        n_dense_lead=s.n_layer_dense_lead, expert_groups=model.arch_int("expert_group_count", 0),
        group_used=model.arch_int("expert_group_used_count", 0), gating=gating_func(model),
        norm_w=model.arch in NORM_W_ALWAYS or bool(model.metadata.get(f"{model.arch}.expert_weights_norm")),
        w_scale=_md_float(model, "expert_weights_scale", 0.0),
        head_k_mla=s.key_length_mla, head_v_mla=s.value_length_mla, kv_lora_rank=s.kv_lora_rank,
        softcap_final=_md_float(model, "final_logit_softcapping", 0.0),
        n_tokens=n_tokens, n_seqs=n_seqs, n_outputs=n_outputs, n_kv=ctx.n_ctx_seq,
        n_kv_swa=ctx.swa_cells, n_stream=ctx.n_stream, kv_unified=p.kv_unified,
        flash_attn=p.flash_attn, type_k=type_by_name(p.type_k), type_v=type_by_name(p.type_v),
        offload_kqv=p.offload_kqv, full_offload=full_offload,
        legacy_inputs=getattr(p, "dialect", "") == "llama.cpp-2025",
    )


# --- the llm graph context (src/llama-graph.cpp) ---------------------------------------------------


class WeightAccess:
    """The model's weights by name for a graph builder (None: the file lacks the tensor)."""

    _w: Callable[[str], T | None]

    def w(self, name: str) -> T | None:
        return self._w(name)

    def lw(self, il: int, name: str) -> T | None:
        return self._w(f"blk.{il}.{name}")

    def req(self, name: str) -> T:
        t = self._w(name)
        if t is None:
            raise KeyError(name)
        return t


class Builder(WeightAccess):
    """``llm_graph_context``: inputs, norms, attention with the KV cache, FFN and MoE blocks."""

    def __init__(self, sh: Shape, weights: Callable[[str], T | None], layer_dev: Callable[[int], str],
                 kv_dev: Callable[[int], str]) -> None:
        self.sh = sh
        self.g = Graph()
        self._w = weights
        self.layer_dev = layer_dev
        self.kv_dev = kv_dev
        self.n_tokens = sh.n_tokens
        self.kq_mask: T | None = None
        self.kq_mask_swa: T | None = None
        self.k_idxs: dict[bool, T] = {}
        self.v_idxs: dict[bool, T] = {}
        self.k_rot: dict[bool, T | None] = {}
        self.v_rot: dict[bool, T | None] = {}
        self.inp_pos: T | None = None
        self.out_ids: T | None = None
        self.cache_k: dict[int, T] = {}
        self.cache_v: dict[int, T] = {}

    # names

    def cb(self, t: T, name: str, il: int) -> T:
        t.name = f"{name}-{il}" if il >= 0 else name
        if il >= 0 and name in ("norm", "l_last") and (self.n_tokens < 32 or self.sh.full_offload):
            self.g.forced[id(t)] = self.layer_dev(il)
        return t

    # inputs

    def inp_embd(self, tok_scale: float = 1.0) -> T:
        sh, n = self.sh, self.n_tokens
        tok_embd = self.req("token_embd.weight")
        tokens = input_tensor(I32, [n], "inp_tokens")
        first = get_rows(tok_embd, tokens)
        if sh.legacy_inputs:  # 2025 builds: the ubatch's tokens only
            return self._scaled_embd(first, tok_scale)
        embd = input_tensor(F32, [sh.n_embd, n], "inp_embd")
        mixed_tokens = input_tensor(I32, [n], "inp_mixed_tokens")
        mixed_slots = input_tensor(I64, [n], "inp_mixed_slots")
        mixed_embd = input_tensor(F32, [sh.n_embd, n], "inp_mixed_embd")
        mixed = set_rows(dup_op(mixed_embd, "DUP"), get_rows(tok_embd, mixed_tokens), mixed_slots)
        for t in (first, embd, mixed):
            self.g.expand(t)
        return self._scaled_embd(first, tok_scale)

    def _scaled_embd(self, cur: T, tok_scale: float) -> T:
        if tok_scale != 1.0:
            cur = dup_op(cur, "MUL", cur, input_tensor(F32, [1, self.n_tokens], "inp_scale_rows"))
        self.cb(cur, "embd", -1)
        self.g.expand(cur)
        return cur

    def build_inp_pos(self) -> T:
        self.inp_pos = input_tensor(I32, [self.n_tokens], "inp_pos")
        return self.inp_pos

    def build_out_ids(self) -> T:
        self.out_ids = input_tensor(I32, [self.sh.n_outputs], "out_ids")
        return self.out_ids

    def _mask(self, n_kv: int) -> T:
        sh = self.sh
        n_stream = 1 if sh.kv_unified else sh.n_seqs
        if sh.legacy_inputs:
            rows = -(-(self.n_tokens // n_stream) // LEGACY_KQ_MASK_PAD) * LEGACY_KQ_MASK_PAD
            mask = input_tensor(F32, [n_kv, rows, 1, n_stream], "attn_inp_kq_mask")
            return new(F16, mask.ne, "CPY", mask) if sh.flash_attn else mask  # ggml_cast
        type_ = F16 if sh.flash_attn else F32
        return input_tensor(type_, [n_kv, self.n_tokens // n_stream, 1, n_stream], "attn_inp_kq_mask")

    def _idxs(self, v_trans: bool, n_embd_v_max: int) -> tuple[T, T]:
        k = input_tensor(I64, [self.n_tokens], "attn_inp_k_idxs")
        v = input_tensor(I64, [self.n_tokens * (n_embd_v_max if v_trans else 1)], "attn_inp_v_idxs")
        return k, v

    def _rot(self, head: int, quantized: bool, grow: bool) -> T | None:
        if not quantized or head % 64:
            return None
        n = 64
        while grow and head % (2 * n) == 0:
            n *= 2
        return input_tensor(F32, [n, n], "attn_inp_rot")

    def build_inp_attn(self, *, k_only: bool = False) -> None:
        sh = self.sh
        self.kq_mask = self._mask(sh.n_kv)
        v_max = max(self._n_embd_v(il) for il in range(sh.n_layer))
        for swa in sorted({sh.swa[il] for il in range(sh.n_layer)}):
            k, v = self._idxs(not sh.flash_attn, v_max)
            self.k_idxs[swa], self.v_idxs[swa] = k, v
            if swa:
                self.kq_mask_swa = self._mask(sh.n_kv_swa)
            if k_only:
                self.k_rot[swa] = self.v_rot[swa] = None
                continue
            self.k_rot[swa] = self._rot(sh.head_k, sh.type_k.quantized, grow=True)
            self.v_rot[swa] = self._rot(sh.head_v, sh.type_v.quantized, grow=False)

    # KV cache (src/llama-kv-cache.cpp)

    def _n_embd_k(self, il: int) -> int:
        return self.sh.head_k * self.sh.n_head_kv[il]

    def _n_embd_v(self, il: int) -> int:
        return self.sh.head_v * self.sh.n_head_kv[il]

    def _cells(self, il: int) -> int:
        return self.sh.n_kv_swa if self.sh.swa[il] else self.sh.n_kv

    def cache(self, il: int, k_only: bool) -> tuple[T, T | None]:
        if il not in self.cache_k:
            sh = self.sh
            k = T(sh.type_k, [self._n_embd_k(il), self._cells(il), sh.n_stream], name=f"cache_k_l{il}")
            k.dev = self.kv_dev(il)
            self.cache_k[il] = k
            if not k_only:
                width = self._n_embd_v(il) if sh.flash_attn else max(
                    self._n_embd_v(j) for j in range(sh.n_layer))
                v = T(sh.type_v, [width, self._cells(il), sh.n_stream], name=f"cache_v_l{il}")
                v.dev = k.dev
                self.cache_v[il] = v
        return self.cache_k[il], self.cache_v.get(il)

    def get_k(self, il: int, k: T) -> T:
        sh = self.sh
        n_kv, hk, nh = k.ne[1], sh.head_k, sh.n_head_kv[il]
        return view(k, [hk, nh, n_kv, sh.n_stream],
                    [row_size(k.type, hk), row_size(k.type, hk * nh), row_size(k.type, k.ne[0] * n_kv)], 0)

    def get_v(self, il: int, v: T) -> T:
        sh = self.sh
        n_kv, hv, nh = v.ne[1], sh.head_v, sh.n_head_kv[il]
        if sh.flash_attn:
            nb = [row_size(v.type, hv), row_size(v.type, v.ne[0]), row_size(v.type, v.ne[0] * n_kv)]
            return view(v, [hv, nh, n_kv, sh.n_stream], nb, 0)
        nb = [row_size(v.type, n_kv * hv), row_size(v.type, n_kv), row_size(v.type, n_kv * v.ne[0])]
        return view(v, [n_kv, nh, hv, sh.n_stream], nb, 0)  # transposed V (no flash attention)

    def cpy_k(self, k: T, k_cur: T, idxs: T) -> T:
        n_gqa = k_cur.ne[0] * k_cur.ne[1]
        kc = view(k_cur, [n_gqa, k_cur.ne[2]], [k_cur.nb[2]], 0)
        dst = reshape(k, n_gqa, k.ne[1] * k.ne[2]) if k.ne[2] > 1 else k
        return set_rows(dst, kc, idxs)

    def cpy_v(self, v: T, v_cur: T, idxs: T) -> T:
        n_gqa = v_cur.ne[0] * v_cur.ne[1]
        if self.sh.flash_attn:
            vc = view(v_cur, [n_gqa, v_cur.ne[2]], [v_cur.nb[2]], 0)
            dst = reshape(v, n_gqa, v.ne[1] * v.ne[2]) if v.ne[2] > 1 else v
            return set_rows(dst, vc, idxs)
        if row_size(v_cur.type, n_gqa) == v_cur.nb[2]:
            vc = reshape(v_cur, n_gqa, v_cur.ne[2])
        else:
            vc = cont(v_cur, n_gqa, v_cur.ne[2])
        if n_gqa < v.ne[0]:
            vc = new(vc.type, [v.ne[0], vc.ne[1]], "PAD", vc)
        return set_rows(reshape(v, 1, nelements(v)), reshape(vc, 1, nelements(vc)), idxs)

    # blocks

    def norm(self, cur: T, w: T | None, il: int, b: T | None = None, op: str = "RMS_NORM") -> T:
        cur = dup_op(cur, op, cur)
        if w is not None or b is not None:
            self.cb(cur, "norm", il)
        if w is not None:
            cur = dup_op(cur, "MUL", cur, w)
        if b is not None:
            cur = dup_op(cur, "ADD", cur, b)
        return cur

    def mm(self, w: T, cur: T, b: T | None = None) -> T:
        out = mul_mat(w, cur)
        return dup_op(out, "ADD", out, b) if b is not None else out

    def qkv(self, il: int, cur: T, head: int) -> tuple[T, T, T]:
        n_tok = self.n_tokens
        q = self.mm(self.req(f"blk.{il}.attn_q.weight"), cur, self.lw(il, "attn_q.bias"))
        k = self.mm(self.req(f"blk.{il}.attn_k.weight"), cur, self.lw(il, "attn_k.bias"))
        v = self.mm(self.req(f"blk.{il}.attn_v.weight"), cur, self.lw(il, "attn_v.bias"))
        return (reshape(q, head, q.ne[0] // head, n_tok), reshape(k, head, k.ne[0] // head, n_tok),
                reshape(v, head, v.ne[0] // head, n_tok))

    def rope_factors(self, il: int) -> T | None:
        """``rope_freqs`` is loaded once per layer (TENSOR_DUPLICATED), on the layer's device."""
        base = self.w("rope_freqs.weight")
        if base is None:
            return None
        t = T(base.type, base.ne, name=f"rope_freqs-{il}")
        t.dev, t.weights = self.layer_dev(il), True
        return t

    def rope(self, x: T, factors: T | None = None) -> T:
        assert self.inp_pos is not None
        return dup_op(x, "ROPE", x, self.inp_pos, factors)

    def hadamard(self, cur: T, rot: T) -> T:
        n = rot.ne[0]
        rows = nelements(cur) // n
        res = reshape(cur, n, rows) if is_contiguous(cur) else cont(cur, n, rows)
        res = mul_mat(rot, res)
        return reshape(res, *cur.ne)

    def attn_mha(self, q: T, k: T, v: T, mask: T, sinks: T | None, v_mla: T | None) -> T:
        sh = self.sh
        v_trans = v.nb[1] > v.nb[2]
        ns = k.ne[3]
        q = view(q, [q.ne[0], q.ne[1], q.ne[2] // ns, ns], [q.nb[1], q.nb[2], q.nb[2] * (q.ne[2] // ns)], 0)
        q, k, v = permute(q, 0, 2, 1, 3), permute(k, 0, 2, 1, 3), permute(v, 0, 2, 1, 3)
        if sh.flash_attn:
            if v_trans:
                v = transpose(v)
            cur = flash_attn_ext(q, k, v, mask, sinks)
            if v_mla is not None:
                cur = permute(cur, 0, 2, 1, 3)
                cur = mul_mat(v_mla, cur)
                cur = cont(permute(cur, 0, 2, 1, 3))
            cur = reshape(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        else:
            kq = mul_mat(k, q)
            kq = soft_max_ext(kq, mask, sinks)
            if not v_trans:
                v = cont(transpose(v))
            kqv = mul_mat(v, kq)
            if v_mla is not None:
                kqv = mul_mat(v_mla, kqv)
            cur = permute(kqv, 0, 2, 1, 3)
            cur = cont(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
            if not sh.offload_kqv:
                self.g.forced[id(cur)] = CPU
        self.g.expand(cur)
        return cur

    def attn(self, il: int, wo: T | None, wo_b: T | None, q: T, k: T, v: T, *, sinks: T | None = None,
             iswa: bool = False) -> T:
        swa = self.sh.swa[il]
        k_rot, v_rot = self.k_rot.get(swa), self.v_rot.get(swa)
        if k_rot is not None:
            q, k = self.hadamard(q, k_rot), self.hadamard(k, k_rot)
        if v_rot is not None:
            v = self.hadamard(v, v_rot)
        for t in ((q, k, v) if iswa else (q, v, k)):
            self.g.expand(t)
        ck, cv = self.cache(il, k_only=False)
        assert cv is not None
        self.g.expand(self.cpy_k(ck, k, self.k_idxs[swa]))
        self.g.expand(self.cpy_v(cv, v, self.v_idxs[swa]))
        mask = self.kq_mask_swa if swa else self.kq_mask
        assert mask is not None
        cur = self.attn_mha(q, self.get_k(il, ck), self.get_v(il, cv), mask, sinks, None)
        self.cb(cur, "kqv_out", il)
        if v_rot is not None:
            cur = self.hadamard(cur, v_rot)
        if wo is not None:
            cur = mul_mat(wo, cur)
        if wo_b is not None:
            cur = dup_op(cur, "ADD", cur, wo_b)
        return cur

    def attn_k(self, il: int, wo: T, q: T, k: T, v: T, v_mla: T) -> T:
        """MLA: only K is cached; V is a view of its first kv_lora_rank columns."""
        for t in (q, v, k):
            self.g.expand(t)
        ck, _ = self.cache(il, k_only=True)
        self.g.expand(self.cpy_k(ck, k, self.k_idxs[False]))
        kk = self.get_k(il, ck)
        vv = view(kk, [v.ne[0], kk.ne[1], kk.ne[2], kk.ne[3]], kk.nb[1:4], 0)
        assert self.kq_mask is not None
        cur = self.attn_mha(q, kk, vv, self.kq_mask, None, v_mla)
        self.cb(cur, "kqv_out", il)
        return mul_mat(wo, cur)

    def ffn(self, cur: T, up: T, gate: T | None, down: T,
            up_b: T | None = None, gate_b: T | None = None, down_b: T | None = None) -> T:
        """Dense FFN with a parallel gate (``swiglu``/``geglu`` split) or a plain activation."""
        tmp = self.mm(up, cur, up_b)
        if gate is not None:
            g = self.mm(gate, cur, gate_b)
            cur = glu(g, tmp)
        else:
            cur = dup_op(tmp, "UNARY", tmp)
        cur = mul_mat(down, cur)
        return dup_op(cur, "ADD", cur, down_b) if down_b is not None else cur

    def moe(self, cur: T, il: int, *, probs_b: T | None = None) -> T:
        """``build_moe_ffn``: router, (grouped) top-k, weights, gate/up/down per expert, weighted sum."""
        sh = self.sh
        n_embd, n_tok = cur.ne[0], cur.ne[1]
        n_exp, n_used = sh.n_expert, sh.n_expert_used
        lw = self.lw
        logits = mul_mat(self.req(f"blk.{il}.ffn_gate_inp.weight"), cur)
        if (b := lw(il, "ffn_gate_inp.bias")) is not None:
            logits = dup_op(logits, "ADD", logits, b)
        if sh.gating == 1:
            probs = dup_op(logits, "SOFT_MAX", logits, None, None)
        elif sh.gating == 2:
            probs = dup_op(logits, "UNARY", logits)
        else:
            probs = logits
        sel = dup_op(probs, "ADD", probs, probs_b) if probs_b is not None else probs
        if sh.expert_groups > 1 and n_tok > 0:
            sel = self._group_select(sel, n_exp, n_tok)
        selected = argsort_top_k(sel, n_used)
        weights = get_rows(reshape(probs, 1, n_exp, n_tok), selected)
        if sh.gating == 3:
            weights = reshape(weights, n_used, n_tok)
            weights = dup_op(weights, "SOFT_MAX", weights, None, None)
            weights = reshape(weights, 1, n_used, n_tok)
        if sh.norm_w:
            weights = reshape(weights, n_used, n_tok)
            wsum = dup_op(sum_rows(weights), "CLAMP")
            weights = reshape(dup_op(weights, "DIV", weights, wsum), 1, n_used, n_tok)
        if sh.w_scale not in (0.0, 1.0):
            weights = dup_op(weights, "SCALE", weights)
        self.g.expand(weights)
        cur = reshape(cur, n_embd, 1, n_tok)
        up = mul_mat_id(self.req(f"blk.{il}.ffn_up_exps.weight"), cur, selected)
        if (b := lw(il, "ffn_up_exps.bias")) is not None:
            up = dup_op(up, "ADD_ID", up, b, selected)
        gate = mul_mat_id(self.req(f"blk.{il}.ffn_gate_exps.weight"), cur, selected)
        if (b := lw(il, "ffn_gate_exps.bias")) is not None:
            gate = dup_op(gate, "ADD_ID", gate, b, selected)
        cur = glu(gate, up)
        experts = mul_mat_id(self.req(f"blk.{il}.ffn_down_exps.weight"), cur, selected)
        if (b := lw(il, "ffn_down_exps.bias")) is not None:
            experts = dup_op(experts, "ADD_ID", experts, b, selected)
        experts = dup_op(experts, "MUL", experts, weights)
        self.g.expand(experts)
        views = [view(experts, [n_embd, n_tok], [experts.nb[2]], i * experts.nb[1]) for i in range(n_used)]
        for v in views:
            self.g.expand(v)
        out = views[0]
        for v in views[1:]:
            out = dup_op(out, "ADD", out, v)
            self.g.expand(out)
        return cont(out) if n_used == 1 else out

    def _group_select(self, sel: T, n_exp: int, n_tok: int) -> T:
        sh = self.sh
        per_group = n_exp // sh.expert_groups
        groups = reshape(sel, per_group, sh.expert_groups, n_tok)
        scores = argsort_top_k(groups, 2)
        scores = get_rows(reshape(groups, 1, *groups.ne[:3]), scores)
        scores = sum_rows(reshape(scores, scores.ne[1], scores.ne[2], scores.ne[3]))
        scores = reshape(scores, scores.ne[1], scores.ne[2])
        expert_groups = argsort_top_k(scores, sh.group_used)
        picked = get_rows(groups, expert_groups)
        filled = dup_op(groups, "FILL", groups)
        return reshape(set_rows(filled, picked, expert_groups), n_exp, n_tok)

    def out_rows(self, *ts: T) -> list[T]:
        assert self.out_ids is not None
        return [get_rows(t, self.out_ids) for t in ts]

    def head(self, cur: T) -> T:
        """Final norm (``t_embd``, kept) and the output projection (``t_logits``, kept)."""
        cur = self.norm(cur, self.w("output_norm.weight"), -1, self.w("output_norm.bias"))
        self.cb(cur, "result_norm", -1)
        cur.flags |= OUTPUT
        cur = mul_mat(self.req("output.weight"), cur)
        if (ob := self.w("output.bias")) is not None:
            cur = dup_op(cur, "ADD", cur, ob)
        if self.sh.softcap_final:
            cur = dup_op(dup_op(dup_op(cur, "SCALE"), "UNARY"), "SCALE")
        cur.flags |= OUTPUT
        self.cb(cur, "result_output", -1)
        self.g.expand(cur)
        return cur


# --- architectures (src/models/*.cpp) -------------------------------------------------------------


def _llama_like(b: Builder, *, qk_norm: bool) -> None:
    """llama, qwen2, qwen3, qwen3moe: pre-norm attention (+q/k norms), dense FFN or MoE without
    shared experts."""
    sh = b.sh
    inp = b.inp_embd()
    b.build_inp_pos()
    b.build_inp_attn()
    b.build_out_ids()
    head = sh.head_v
    for il in range(sh.n_layer):
        inp_sa = inp
        cur = b.norm(inp, b.lw(il, "attn_norm.weight"), il)
        q, k, v = b.qkv(il, cur, head)
        factors = b.rope_factors(il)
        if qk_norm:
            q = b.rope(b.norm(q, b.lw(il, "attn_q_norm.weight"), il))
            k = b.rope(b.norm(k, b.lw(il, "attn_k_norm.weight"), il))
        else:
            q, k = b.rope(q, factors), b.rope(k, factors)
        cur = b.attn(il, b.lw(il, "attn_output.weight"), b.lw(il, "attn_output.bias"), q, k, v)
        if il == sh.n_layer - 1:
            cur, inp_sa = b.out_rows(cur, inp_sa)
        ffn_inp = dup_op(cur, "ADD", cur, inp_sa)
        cur = b.norm(ffn_inp, b.lw(il, "ffn_norm.weight"), il)
        if b.lw(il, "ffn_gate_inp.weight") is None:
            cur = b.ffn(cur, b.req(f"blk.{il}.ffn_up.weight"), b.lw(il, "ffn_gate.weight"),
                        b.req(f"blk.{il}.ffn_down.weight"))
        else:
            cur = b.moe(cur, il)
        inp = b.cb(dup_op(cur, "ADD", cur, ffn_inp), "l_out", il)
    b.head(inp)


def _glm4moe(b: Builder) -> None:
    sh = b.sh
    inp = b.inp_embd()
    b.build_inp_pos()
    b.build_inp_attn()
    b.build_out_ids()
    for il in range(sh.n_layer):
        inp_sa = inp
        cur = b.norm(inp, b.lw(il, "attn_norm.weight"), il)
        q, k, v = b.qkv(il, cur, sh.head_v)
        if (qn := b.lw(il, "attn_q_norm.weight")) is not None:
            q = b.norm(q, qn, il)
        if (kn := b.lw(il, "attn_k_norm.weight")) is not None:
            k = b.norm(k, kn, il)
        q, k = b.rope(q), b.rope(k)
        cur = b.attn(il, b.lw(il, "attn_output.weight"), None, q, k, v)
        if il == sh.n_layer - 1:
            cur, inp_sa = b.out_rows(cur, inp_sa)
        ffn_inp = dup_op(cur, "ADD", cur, inp_sa)
        cur = b.norm(ffn_inp, b.lw(il, "post_attention_norm.weight"), il)
        cur = _dense_lead_or_shared_moe(b, il, cur)
        inp = b.cb(dup_op(cur, "ADD", cur, ffn_inp), "l_out", il)
    b.head(inp)


def _dense_lead_or_shared_moe(b: Builder, il: int, cur: T) -> T:
    """The FFN of DeepSeek-V3 / GLM-4.x layers: dense for the leading layers, else the routed
    experts (with the expert-bias router) plus the shared expert."""
    if il < b.sh.n_dense_lead:
        return b.ffn(cur, b.req(f"blk.{il}.ffn_up.weight"), b.lw(il, "ffn_gate.weight"),
                     b.req(f"blk.{il}.ffn_down.weight"))
    routed = b.moe(cur, il, probs_b=b.lw(il, "exp_probs_b.bias"))
    shared = b.ffn(cur, b.req(f"blk.{il}.ffn_up_shexp.weight"), b.lw(il, "ffn_gate_shexp.weight"),
                   b.req(f"blk.{il}.ffn_down_shexp.weight"))
    return dup_op(routed, "ADD", routed, shared)


def _deepseek2(b: Builder) -> None:
    sh = b.sh
    n_tok = b.n_tokens
    hk, rope_d = sh.head_k_mla, sh.n_rot
    nope, kvr = hk - rope_d, sh.kv_lora_rank
    inp = b.inp_embd()
    b.build_inp_pos()
    b.build_inp_attn(k_only=True)
    b.build_out_ids()
    for il in range(sh.n_layer):
        nh = sh.n_head[il]
        inp_sa = inp
        cur = b.norm(inp, b.lw(il, "attn_norm.weight"), il)
        if (wq := b.lw(il, "attn_q.weight")) is not None:
            q = mul_mat(wq, cur)
        else:
            q = mul_mat(b.req(f"blk.{il}.attn_q_a.weight"), cur)
            q = b.norm(q, b.lw(il, "attn_q_a_norm.weight"), il)
            q = mul_mat(b.req(f"blk.{il}.attn_q_b.weight"), q)
        q = reshape(q, hk, nh, n_tok)
        kv_pe = mul_mat(b.req(f"blk.{il}.attn_kv_a_mqa.weight"), cur)
        rs = row_size(kv_pe.type, kvr + rope_d)
        kv_cmpr = view(kv_pe, [kvr, n_tok], [rs], 0)
        k_pe = b.rope(view(kv_pe, [rope_d, 1, n_tok], [rs, rs], row_size(kv_pe.type, kvr)))
        kv_cmpr = b.norm(kv_cmpr, b.lw(il, "attn_kv_a_norm.weight"), il)
        q_nope = view(q, [nope, nh, n_tok], [q.nb[1], q.nb[2]], 0)
        q_pe = b.rope(view(q, [rope_d, nh, n_tok], [q.nb[1], q.nb[2]], row_size(q.type, nope)))
        q_abs = mul_mat(b.req(f"blk.{il}.attn_k_b.weight"), permute(q_nope, 0, 2, 1, 3))
        qcur = concat(permute(q_abs, 0, 2, 1, 3), q_pe, 0)
        kv_cmpr = reshape(kv_cmpr, kvr, 1, n_tok)
        kcur = concat(kv_cmpr, k_pe, 0)
        cur = b.attn_k(il, b.req(f"blk.{il}.attn_output.weight"), qcur, kcur, kv_cmpr,
                       b.req(f"blk.{il}.attn_v_b.weight"))
        if il == sh.n_layer - 1:
            cur, inp_sa = b.out_rows(cur, inp_sa)
        ffn_inp = dup_op(cur, "ADD", cur, inp_sa)
        cur = b.norm(ffn_inp, b.lw(il, "ffn_norm.weight"), il)
        cur = _dense_lead_or_shared_moe(b, il, cur)
        inp = b.cb(dup_op(cur, "ADD", cur, ffn_inp), "l_out", il)
    b.head(inp)


def _gpt_oss(b: Builder) -> None:
    sh = b.sh
    inp = b.inp_embd()
    b.build_inp_pos()
    b.build_inp_attn()
    b.build_out_ids()
    for il in range(sh.n_layer):
        inp_sa = inp
        cur = b.norm(inp, b.lw(il, "attn_norm.weight"), il)
        q, k, v = b.qkv(il, cur, sh.n_rot)
        q, k = b.rope(q), b.rope(k)
        cur = b.attn(il, b.lw(il, "attn_output.weight"), b.lw(il, "attn_output.bias"), q, k, v,
                     sinks=b.lw(il, "attn_sinks.weight"), iswa=True)
        ffn_inp = dup_op(cur, "ADD", cur, inp_sa)
        cur = b.norm(ffn_inp, b.lw(il, "post_attention_norm.weight"), il)
        cur = b.moe(cur, il)
        inp = b.cb(dup_op(cur, "ADD", cur, ffn_inp), "l_out", il)
    inp.flags |= OUTPUT  # t_h_nextn
    (inp,) = b.out_rows(inp)
    b.head(inp)


def _gemma3(b: Builder) -> None:
    sh = b.sh
    inp = b.inp_embd(tok_scale=math.sqrt(sh.n_embd))
    b.build_inp_pos()
    b.build_inp_attn()
    b.build_out_ids()
    iswa = any(sh.swa)
    for il in range(sh.n_layer):
        cur = b.norm(inp, b.lw(il, "attn_norm.weight"), il)
        q, k, v = b.qkv(il, cur, sh.head_k)
        q = b.rope(b.norm(q, b.lw(il, "attn_q_norm.weight"), il))
        k = b.rope(b.norm(k, b.lw(il, "attn_k_norm.weight"), il))
        q = dup_op(q, "SCALE")
        cur = b.attn(il, b.lw(il, "attn_output.weight"), None, q, k, v, iswa=iswa)
        if il == sh.n_layer - 1:
            cur, inp = b.out_rows(cur, inp)
        cur = b.norm(cur, b.lw(il, "post_attention_norm.weight"), il)
        sa_out = dup_op(cur, "ADD", cur, inp)
        cur = b.norm(sa_out, b.lw(il, "ffn_norm.weight"), il)
        cur = b.ffn(cur, b.req(f"blk.{il}.ffn_up.weight"), b.lw(il, "ffn_gate.weight"),
                    b.req(f"blk.{il}.ffn_down.weight"))
        cur = b.norm(cur, b.lw(il, "post_ffw_norm.weight"), -1)
        inp = b.cb(dup_op(cur, "ADD", cur, sa_out), "l_out", il)
    b.head(inp)


def _gptneox(b: Builder) -> None:
    """gptneox (Pythia): LayerNorm with biases, fused QKV (+bias) split into Q/K/V views, partial
    rope, biased attention output, GELU FFN, parallel residual (``use_parallel_residual``, which
    every Pythia sets: x + attn(ln1(x)) + ffn(ln2(x)))."""
    sh = b.sh
    inp = b.inp_embd()
    b.build_inp_pos()
    b.build_inp_attn()
    b.build_out_ids()
    head, n_tok = sh.head_k, b.n_tokens
    for il in range(sh.n_layer):
        cur = b.norm(inp, b.lw(il, "attn_norm.weight"), il, b.lw(il, "attn_norm.bias"), op="NORM")
        qkv = b.mm(b.req(f"blk.{il}.attn_qkv.weight"), cur, b.lw(il, "attn_qkv.bias"))
        n_q, n_k = head * sh.n_head[il], head * sh.n_head_kv[il]
        nb = [row_size(qkv.type, head), qkv.nb[1]]
        q = view(qkv, [head, sh.n_head[il], n_tok], nb, 0)
        k = view(qkv, [head, sh.n_head_kv[il], n_tok], nb, row_size(qkv.type, n_q))
        v = view(qkv, [head, sh.n_head_kv[il], n_tok], nb, row_size(qkv.type, n_q + n_k))
        q, k = b.rope(q), b.rope(k)
        cur = b.attn(il, b.lw(il, "attn_output.weight"), b.lw(il, "attn_output.bias"), q, k, v)
        if il == sh.n_layer - 1:
            cur, inp = b.out_rows(cur, inp)
        attn_out = cur
        cur = b.norm(inp, b.lw(il, "ffn_norm.weight"), il, b.lw(il, "ffn_norm.bias"), op="NORM")
        cur = b.ffn(cur, b.req(f"blk.{il}.ffn_up.weight"), None, b.req(f"blk.{il}.ffn_down.weight"),
                    up_b=b.lw(il, "ffn_up.bias"), down_b=b.lw(il, "ffn_down.bias"))
        cur = dup_op(cur, "ADD", cur, inp)
        inp = b.cb(dup_op(cur, "ADD", cur, attn_out), "l_out", il)
    b.head(inp)


ARCH_GRAPHS: dict[str, Callable[[Builder], None]] = {
    "llama": lambda b: _llama_like(b, qk_norm=False),
    "qwen2": lambda b: _llama_like(b, qk_norm=False),
    "qwen3": lambda b: _llama_like(b, qk_norm=True),
    "qwen3moe": lambda b: _llama_like(b, qk_norm=True),
    "glm4moe": _glm4moe,
    "deepseek2": _deepseek2,
    "gpt-oss": _gpt_oss,
    "gemma3": _gemma3,
    "gptneox": _gptneox,
}


# --- the scheduler (ggml_backend_sched_split_graph) -------------------------------------------------


@dataclass(frozen=True)
class Backend:
    name: str  # device name (CPU last)
    buft: str  # buffer type name as logged (CPU backend: the first GPU's host buffer, or CPU)
    alignment: int
    cuda_like: bool = False
    offload_min_batch: int | None = None
    offload_only: frozenset[str] | None = None

    def offloads(self, op: T) -> bool:
        """``ggml_backend_offload_op``: take an op whose weight sits in host memory."""
        if self.offload_min_batch is None:
            return False
        if self.offload_only is not None and op.op not in self.offload_only:
            return False
        return _batch_size(op) >= self.offload_min_batch


@dataclass
class Split:
    backend: int
    i_start: int
    i_end: int = 0
    inputs: list[T] = field(default_factory=list)


def _batch_size(t: T) -> int:
    """``get_op_batch_size`` of the CUDA backend."""
    if t.op == "GET_ROWS":
        return 0
    if t.op == "MUL_MAT":
        return t.ne[1]
    if t.op in ("MUL_MAT_ID", "ROPE"):
        return t.ne[2]
    return t.ne[1] * t.ne[2] * t.ne[3]


class Scheduler:
    def __init__(self, backends: list[Backend], n_copies: int, op_offload: bool = True) -> None:
        self.backends = backends
        self.ids = {b.name: i for i, b in enumerate(backends)}
        self.cpu = len(backends) - 1
        self.n_copies = n_copies
        self.op_offload = op_offload
        self.splits: list[Split] = []
        self.copies: dict[tuple[int, int], list[T]] = {}  # (id(tensor), backend) -> copies
        self.nodes: list[T] = []
        self.node_ids: list[int] = []
        self.leafs: list[T] = []
        self.leaf_ids: list[int] = []

    # buffer helpers

    def _from_buffer(self, t: T) -> int:
        loc = t.location
        return -1 if loc is None else self.ids.get(loc, self.cpu)

    def _supported(self, t: T, b: int) -> bool:
        """``ggml_backend_sched_buffer_supported``: the tensor's data is in backend b's memory."""
        loc = t.location
        if loc is not None:
            return self.ids.get(loc, self.cpu) == b
        bid = t.bid if t.bid != -1 or t.view_src is None else t.view_src.bid
        return bid == b

    def _from_cur(self, t: T) -> int:
        bid = self._from_buffer(t)
        if bid != -1:
            return bid
        if t.flags & INPUT:
            return self.cpu
        if t.op in ("ROPE", "FLASH_ATTN_EXT"):
            return -1
        for s in t.src:
            if s is not None and s.weights:
                sb = self._from_buffer(s)
                if self.op_offload and sb == self.cpu:
                    for b in range(self.cpu):
                        if self.backends[b].offloads(t):
                            return b
                return sb
        return -1

    # passes

    def split_graph(self, g: Graph, *, keep_forced: bool = True) -> None:
        """``keep_forced=False``: ``ggml_backend_sched_reserve_size`` (the no-alloc dry run of
        llama-fit-params and --fit) resets the scheduler first, dropping set_tensor_backend calls."""
        forced = g.forced if keep_forced else {}
        for t in g.leafs + g.nodes:
            t.bid = self.ids[forced[id(t)]] if id(t) in forced else -1
        for t in g.leafs + g.nodes:
            if t.bid == -1:
                t.bid = self._from_cur(t)
        self._expand(g.nodes)
        self._pass3(g.nodes)
        self._pass4(g.nodes)
        self._pass5(g.nodes)
        self._build_copy(g)

    def _expand(self, nodes: list[T]) -> None:
        real = [n for n in nodes if n.op not in VIEW_OPS]
        for order, skip_cpu in ((real, True), (real[::-1], True), (real, False), (real[::-1], False)):
            cur = -1
            for n in order:
                if n.bid != -1:
                    cur = -1 if (skip_cpu and n.bid == self.cpu) else n.bid
                elif cur != -1:
                    n.bid = cur

    def _pass3(self, nodes: list[T]) -> None:
        for n in nodes:
            if n.op in VIEW_OPS or n.bid != -1:
                continue
            best = -1
            for b in range(len(self.backends)):
                cnt = sum(1 for s in n.src if s is not None
                          and (s.bid != -1 or (s.view_src is not None and s.view_src.bid != -1))
                          and self._supported(s, b))
                if cnt > best:
                    best, n.bid = cnt, b

    def _pass4(self, nodes: list[T]) -> None:
        for n in nodes:
            if n.view_src is not None and n.bid == -1:
                n.bid = n.view_src.bid
            for s in n.src:
                if s is not None and s.bid == -1:
                    s.bid = s.view_src.bid if s.view_src is not None else n.bid
            if n.bid == -1:
                n.bid = 0

    def _pass5(self, nodes: list[T]) -> None:
        first = next((k for k, n in enumerate(nodes) if n.op not in VIEW_OPS), len(nodes))
        split = Split(nodes[first].bid if first < len(nodes) else self.cpu, 0)
        self.splits = [split]
        cur = split.backend
        for i in range(first, len(nodes)):
            n = nodes[i]
            if n.op in VIEW_OPS:
                continue
            need_new = n.bid == cur and bool(split.inputs) and any(
                s is not None and s.weights and s.bid != cur and not self._supported(s, cur) for s in n.src)
            if n.bid != cur or need_new:
                split.i_end = i
                split = Split(n.bid, i)
                self.splits.append(split)
                cur = n.bid
            for j, s in enumerate(n.src):
                if s is None or s.bid == cur or self._supported(s, cur):
                    continue
                key = (id(s), cur)
                if key not in self.copies:
                    self.copies[key] = [self._copy(s, c) for c in range(self.n_copies)]
                    split.inputs.append(s)
                n.src[j] = self.copies[key][0]
        split.i_end = len(nodes)

    def _copy(self, s: T, c: int) -> T:
        t = T(s.type, s.ne, name=f"{s.name}#{c}")
        t.nb = list(s.nb)
        if self.n_copies > 1:
            t.flags |= INPUT | OUTPUT
        return t

    def _build_copy(self, g: Graph) -> None:
        graph_inputs: list[T] = []
        if self.n_copies > 1:
            for leaf in g.leafs:
                if leaf.flags & INPUT:
                    leaf.flags |= OUTPUT
                    copies = [leaf] + [self._copy(leaf, c) for c in range(1, self.n_copies)]
                    self.copies[(id(leaf), leaf.bid)] = copies
                    graph_inputs.append(leaf)
        for sp in self.splits:
            for inp in sp.inputs:
                dep = view_tensor(inp, "NONE", inp)
                self.nodes.append(dep)
                self.node_ids.append(inp.bid)
                self.nodes.append(self.copies[(id(inp), sp.backend)][0])
                self.node_ids.append(sp.backend)
            for n in g.nodes[sp.i_start:sp.i_end]:
                self.nodes.append(n)
                self.node_ids.append(n.bid)
        if self.n_copies > 1:
            for inp in graph_inputs:
                for c in self.copies[(id(inp), inp.bid)]:
                    self.leafs.append(c)
                    self.leaf_ids.append(inp.bid)
            for sp in self.splits:
                for inp in sp.inputs:
                    for c in self.copies[(id(inp), sp.backend)]:
                        self.leafs.append(c)
                        self.leaf_ids.append(sp.backend)
        for leaf in g.leafs:
            self.leafs.append(leaf)
            self.leaf_ids.append(leaf.bid)


# --- the graph allocator (ggml-alloc.c) -----------------------------------------------------------


class DynAllocator:
    """``ggml_dyn_tallocr`` with one chunk (no backend here has a maximum buffer size)."""

    def __init__(self, alignment: int) -> None:
        self.alignment = alignment
        self.blocks: list[list[int]] = [[0, 1 << 62]]  # [offset, size], sorted by offset
        self.max_size = 0

    def _align(self, size: int) -> int:
        return -(-size // self.alignment) * self.alignment

    def alloc(self, size: int) -> int:
        size = self._align(size)
        best, best_size = -1, None
        for i, (_, bsize) in enumerate(self.blocks[:-1]):
            if bsize >= size and (best_size is None or bsize <= best_size):
                best, best_size = i, bsize
        if best == -1:
            best = len(self.blocks) - 1  # the last block always fits
        block = self.blocks[best]
        offset = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del self.blocks[best]
        self.max_size = max(self.max_size, offset + size)
        return offset

    def free(self, offset: int, size: int) -> None:
        size = self._align(size)
        blocks = self.blocks
        for i, block in enumerate(blocks):
            if block[0] + block[1] == offset:
                block[1] += size
                if i + 1 < len(blocks) and block[0] + block[1] == blocks[i + 1][0]:
                    block[1] += blocks[i + 1][1]
                    del blocks[i + 1]
                return
            if offset + size == block[0]:
                block[0] = offset
                block[1] += size
                if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == block[0]:
                    blocks[i - 1][1] += block[1]
                    del blocks[i]
                return
        pos = 0
        while pos < len(blocks) and blocks[pos][0] < offset:
            pos += 1
        blocks.insert(pos, [offset, size])


class GraphAllocator:
    """``ggml_gallocr_alloc_graph_impl`` over the scheduler's graph copy.

    ``inplace_ops``: the ops that may take over a dying parent's memory; ``frees_tail``: a parent
    larger than its in-place child gives the rest back (newer ggml-alloc)."""

    inplace_ops: frozenset[str] = INPLACE_OPS
    frees_tail = True

    def __init__(self, backends: list[Backend]) -> None:
        self.backends = backends
        self.allocs = [DynAllocator(b.alignment) for b in backends]
        self.own: set[int] = set()
        self.peaks = [""] * len(backends)
        self._where = ""  # the node being processed, for the peaks
        self._layer = ""  # " (layer N)" of the last node named for a layer

    def size(self, t: T, bid: int) -> int:
        size = nbytes(t)
        be = self.backends[bid]
        if be.cuda_like:
            if t.op == "FLASH_ATTN_EXT":
                size = _cuda_fa_alloc_size(t)
            if t.type.quantized and t.ne[0] % 512:
                size += row_size(t.type, 512 - t.ne[0] % 512)
        return size

    def _allocated(self, t: T) -> bool:
        return t.location is not None or id(t) in self.own

    def allocate(self, t: T, bid: int) -> None:
        if self._allocated(t) or t.view_src is not None:
            return
        if t.op in self.inplace_ops:
            for p in t.src:
                if p is None or id(p) not in self.own or p.flags & OUTPUT:
                    continue
                if p.view_src is not None and p.view_src.flags & OUTPUT:
                    continue
                if not same_layout(t, p) or p.n_children != 1 or p.n_views != 0:
                    continue
                if p.view_src is not None:
                    continue  # a view parent is never galloc-owned (dead branch in ggml-alloc.c)
                assert p.alloc is not None
                t.alloc = p.alloc
                self.own.discard(id(p))
                self.own.add(id(t))
                if not self.frees_tail:
                    return
                pb, poff = p.alloc
                psize, nsize = self.size(p, pb), self.size(t, bid)
                al = self.allocs[pb]
                psize, nsize = al._align(psize), al._align(nsize)
                if psize > nsize:
                    al.free(poff + nsize, psize - nsize)
                return
        al = self.allocs[bid]
        before = al.max_size
        t.alloc = (bid, al.alloc(self.size(t, bid)))
        self.own.add(id(t))
        if al.max_size > before:
            self.peaks[bid] = self._where

    def free(self, t: T) -> None:
        if t.flags & OUTPUT or t.alloc is None:
            return
        bid, off = t.alloc
        self.allocs[bid].free(off, self.size(t, bid))
        self.own.discard(id(t))

    def count(self, nodes: list[T], node_ids: list[int], leafs: list[T], leaf_ids: list[int]) -> int:
        """Reset the child/view counts, allocate the leafs, then the counting pass (which allocates
        graph inputs as it meets them); returns how many tensors the counting pass allocated."""
        for t in nodes + leafs:
            t.n_children = t.n_views = 0
        for leaf, bid in zip(leafs, leaf_ids, strict=True):
            self.allocate(leaf, bid)
        n_own = len(self.own)
        for n, bid in zip(nodes, node_ids, strict=True):
            if n.view_src is not None and n.op != "NONE":
                n.view_src.n_views += 1
            if n.flags & INPUT:
                self.allocate(n, bid)
            for s in n.src:
                if s is None:
                    continue
                s.n_children += 1
                if s.flags & INPUT:
                    self.allocate(s, bid)
        return len(self.own) - n_own

    def step(self, n: T, bid: int) -> None:
        """One node of the allocation walk: its sources and itself allocated, then every parent
        whose last child or view this was freed."""
        if (m := _LAYER.search(n.name)) is not None:
            self._layer = f" (layer {m.group(1)})"
        self._where = peak_label(n, self._layer)
        for s in n.src:
            if s is not None:
                self.allocate(s, bid)
        self.allocate(n, bid)
        for p in n.src:
            if p is None:
                continue
            p.n_children -= 1
            if p.n_children or p.n_views:
                continue
            if p.view_src is not None:
                vs = p.view_src
                vs.n_views -= 1
                if vs.n_views == 0 and vs.n_children == 0 and id(vs) in self.own:
                    self.free(vs)
            elif id(p) in self.own:
                self.free(p)

    def run(self, nodes: list[T], node_ids: list[int], leafs: list[T], leaf_ids: list[int]) -> list[int]:
        self.count(nodes, node_ids, leafs, leaf_ids)
        for n, bid in zip(nodes, node_ids, strict=True):
            self.step(n, bid)
        return [a.max_size for a in self.allocs]


def peak_label(n: T, layer: str) -> str:
    """What a backend's peak is reported at: the op (or the copy) and its layer."""
    return f"{n.op if n.op != 'NONE' else 'copy of ' + (n.name or 'an input')}{layer}"


def _cuda_fa_alloc_size(t: T) -> int:
    """``ggml_cuda_flash_attn_ext_get_alloc_size``: tile/MMA kernels (batches > 1) convert quantized
    K and V to f16 right after the output."""
    q, k, v = t.src[0], t.src[1], t.src[2]
    assert q is not None and k is not None and v is not None
    end = nbytes(t)
    if q.ne[1] <= 1:
        return end
    if k.type is not F16:
        end = -(-end // 128) * 128 + nelements(k) * 2
    v_is_k = v.view_src is not None and (v.view_src is k or (v.view_src is k.view_src
                                                            and v.view_offs == k.view_offs))
    if v.type is not F16 and not v_is_k:
        end = -(-end // 128) * 128 + nelements(v) * 2
    return end


# --- reserve ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reserve:
    """One reserved graph: bytes per backend and what was going on at each backend's peak."""

    n_tokens: int
    sizes: list[int]
    peaks: list[str]  # per backend: the op (and layer) whose allocation set the maximum
    copies_bytes: list[int]  # bytes of split-input copies per backend (all copies)
    weight_copies_bytes: list[int]  # of which copies of host weights (op offload)
    n_nodes: int
    n_splits: int


def reserve(sh: Shape, arch_fn: Callable[[Builder], None], backends: list[Backend], n_copies: int,
            weights: Callable[[str], T | None], layer_dev: Callable[[int], str],
            kv_dev: Callable[[int], str], *, no_alloc: bool = False, op_offload: bool = True) -> Reserve:
    b = Builder(sh, weights, layer_dev, kv_dev)
    arch_fn(b)
    sched = Scheduler(backends, n_copies, op_offload)
    sched.split_graph(b.g, keep_forced=not no_alloc)
    galloc = GraphAllocator(backends)
    sizes = galloc.run(sched.nodes, sched.node_ids, sched.leafs, sched.leaf_ids)
    copies = [0] * len(backends)
    weight_copies = [0] * len(backends)
    for sp in sched.splits:
        for inp in sp.inputs:
            copies[sp.backend] += nbytes(inp) * n_copies
            if inp.weights:
                weight_copies[sp.backend] += nbytes(inp) * n_copies
    return Reserve(sh.n_tokens, sizes, galloc.peaks, copies, weight_copies, len(b.g.nodes), len(sched.splits))


# --- from the planner's model to the simulation ------------------------------------------------------


def model_gpus(devices: DeviceSet, placement: Placement) -> list[Device]:
    """llama.cpp's device list for the model: every GPU, or only the main GPU with ``-sm none``.

    ``Placement`` may name them (``model_devices``); otherwise all of ``devices.gpus`` are used."""
    names = getattr(placement, "model_devices", None)
    if names is None:
        return list(devices.gpus)
    return [g for g in devices.gpus if g.name in names]


def _backends(devices: DeviceSet, placement: Placement) -> list[Backend]:
    gpus = model_gpus(devices, placement)
    out = [Backend(g.name, g.name, g.alignment, g.kind in CUDA_LIKE, OP_OFFLOAD_MIN_BATCH.get(g.kind),
                   OP_OFFLOAD_ONLY.get(g.kind)) for g in gpus]
    # the CPU backend allocates from the host buffer type of the model's first device
    host = gpus[0].host_buffer_name if gpus else None
    out.append(Backend(CPU, host or CPU, devices.cpu.alignment))
    return out


WeightWhere = dict[str, tuple[tuple[int, ...], GGMLType, str]]


def _weight_where(placement: Placement) -> WeightWhere:
    """Shape, type and device of every loaded weight by the name the graph asks for."""
    where: WeightWhere = {}
    for p in placement.items:
        if p.device is None:
            continue
        key = "output.weight" if p.copy else p.tensor.name
        where[key] = (p.tensor.shape, p.tensor.type, p.device)
    if "output.weight" not in where and "token_embd.weight" in where:
        where["output.weight"] = where["token_embd.weight"]
    return where


def _weight_factory(model: Model, placement: Placement, where: WeightWhere | None = None
                    ) -> Callable[[str], T | None]:
    if where is None:
        where = _weight_where(placement)
    cache: dict[str, T] = {}

    def get(name: str) -> T | None:
        if name not in cache:
            if name not in where:
                return None
            shape, type_, dev = where[name]
            t = T(type_, shape, name=name)
            t.dev, t.weights = dev, True
            cache[name] = t
        return cache[name]

    return get


def _full_offload(placement: Placement) -> bool:
    return all(d != CPU for d in placement.unit_devices)


def _has_overrides(placement: Placement) -> bool:
    return bool(getattr(placement, "has_overrides", False) or placement.override_hits)


def _pipeline(devices: DeviceSet, placement: Placement, p: ContextParams) -> bool:
    """Pipeline parallelism (4 copies of inputs): several devices, every layer and the output on
    them, layer split, KV offloaded, no tensor overrides, all devices async with events."""
    gpus = model_gpus(devices, placement)
    return (len(gpus) > 1 and _full_offload(placement) and p.offload_kqv
            and not _has_overrides(placement) and all(g.kind in ASYNC_EVENTS for g in gpus))


def _reserve_shapes(model: Model, ctx: ResolvedContext, p: ContextParams, full: bool) -> list[Shape]:
    """The prompt graph (``min(n_ctx, n_ubatch)`` tokens, a multiple of n_seq_max) and the
    one-token-per-sequence graph that ``sched_reserve`` reserves."""
    n_seqs = p.n_seq_max
    n_tokens = min(ctx.n_ctx, ctx.n_ubatch)
    n_tokens = -(-n_tokens // n_seqs) * n_seqs
    n_out_max = p.n_outputs_max or ctx.n_batch
    pp = make_shape(model, ctx, p, n_tokens, n_seqs, min(n_tokens, n_out_max), full)
    tg = make_shape(model, ctx, p, n_seqs, n_seqs, n_seqs, full)
    return [pp, tg]


@dataclass(frozen=True)
class Simulation:
    backends: list[Backend]
    sizes: list[int]  # bytes per backend: what llama.cpp allocates
    reserves: list[Reserve]  # pp first
    n_copies: int


def graph_builder(model: Model) -> Callable[[Builder], None] | None:
    """The graph of the model's architecture, if this module has it (legacy non-MLA DeepSeek files
    build another attention graph and are left to the estimate)."""
    if model.arch == "deepseek2" and not model.summary.is_mla:
        return None
    return ARCH_GRAPHS.get(model.arch)


def simulate(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
             p: ContextParams, *, no_alloc: bool = False, incremental: bool = False) -> Simulation | None:
    """Per-backend compute bytes, or None for an architecture without a graph here.

    The server (``ggml_backend_sched_reserve``) keeps the larger of the prompt (pp) and one-token (tg)
    reserves.  ``no_alloc`` gives what ``llama-fit-params`` / ``--fit`` estimate instead: the first pp
    reserve only, through ``ggml_backend_sched_reserve_size``, which drops user-forced backends.
    ``incremental``: replay the reserves against a recorded run of the same graph
    (:mod:`offload_planner.core.compute_incremental`; the same result, in a fraction of the time)."""
    arch_fn = graph_builder(model)
    if arch_fn is None:
        return None
    backends = _backends(devices, placement)
    n_copies = N_COPIES_PIPELINE if _pipeline(devices, placement, p) else 1
    op_offload = bool(getattr(p, "op_offload", True))

    def kv_dev(il: int) -> str:
        return placement.layer_device(il) if p.offload_kqv else CPU

    shapes = _reserve_shapes(model, ctx, p, _full_offload(placement))
    if incremental and not no_alloc and n_copies == 1:
        from offload_planner.core.compute_incremental import incremental_reserve

        where_memo: list[WeightWhere] = []

        def where() -> WeightWhere:  # only when a reference is recorded or the items do not line up
            if not where_memo:
                where_memo.append(_weight_where(placement))
            return where_memo[0]

        def weights() -> Callable[[str], T | None]:
            return _weight_factory(model, placement, where())

        units = list(placement.unit_devices)
        reserves = [incremental_reserve((model, arch_fn, sh, tuple(backends), op_offload), sh, arch_fn,
                                        backends, op_offload, placement.items, where, weights,
                                        placement.layer_device, kv_dev, units, p.offload_kqv)
                    for sh in shapes]
    else:
        reserves = [reserve(sh, arch_fn, backends, n_copies, _weight_factory(model, placement),
                            placement.layer_device, kv_dev, no_alloc=no_alloc, op_offload=op_offload)
                    for sh in (shapes[:1] if no_alloc else shapes)]
    sizes = [max(r.sizes[i] for r in reserves) for i in range(len(backends))]
    return Simulation(backends, sizes, reserves, n_copies)


# --- the fallback formula -------------------------------------------------------------------------------


def term_estimate(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
                  p: ContextParams) -> dict[str, int]:
    """Per-device bytes for architectures without a graph here, from the terms the simulation shows
    matter: KQ mask(s) wherever attention runs (f16 with flash attention, f32 plus the KQ scores
    without), the largest layer's activations, the activation copied in at a device boundary, the
    logits on the output device, and on the host the inputs (mask, token rows, the unused embedding
    and mixed-batch rows); with pipeline parallelism the inputs and copies are held 4 times."""
    s = model.summary
    n_tok = min(ctx.n_ctx, ctx.n_ubatch)
    n_out = min(n_tok, p.n_outputs_max or ctx.n_batch)
    n_head = max(_per_layer(s.n_head, s.n_layer) or (1,))
    per = 2 if p.flash_attn else 4
    masks = ctx.n_ctx_seq * n_tok * per + (ctx.swa_cells * n_tok * per if s.has_swa else 0)
    kq = 0 if p.flash_attn else 4 * ctx.n_ctx_seq * n_tok * n_head
    ff = max(_per_layer(s.n_ff, s.n_layer) or (0,))
    rows = 4 * s.n_embd * n_tok
    head_v = s.kv_lora_rank if s.is_mla else s.head_dim_v  # MLA attends in the compressed space
    attn = 4 * n_tok * n_head * (s.head_dim_k + head_v)
    ffn = 4 * n_tok * max(2 * ff, 3 * s.n_ff_exp * max(s.n_expert_used, 1), 3 * s.n_embd)
    act = max(attn, ffn) + 2 * rows + kq
    copies = N_COPIES_PIPELINE if _pipeline(devices, placement, p) else 1
    layer_devs = list(dict.fromkeys(placement.unit_devices[: s.n_layer_trunk]))
    out: dict[str, int] = {}
    for i, dev in enumerate(layer_devs):
        if dev == CPU:
            out[dev] = act
            continue
        # a GPU receives the activation at its first layer; the first one the token rows from the host
        boundary = (3 if i == 0 else 1) * rows * copies
        out[dev] = act + masks * copies + boundary
    out_dev = placement.output_device
    out[out_dev] = out.get(out_dev, 0) + 4 * n_out * (s.n_vocab + s.n_embd)
    out[CPU] = out.get(CPU, 0) + (masks + 4 * rows) * copies
    host_layer_weights = any(it.device == CPU and it.tensor.layer is not None for it in placement.items)
    if CPU not in layer_devs and host_layer_weights:
        out[CPU] += act  # layer weights overridden to the host (-ot ...=CPU): their ops run there
    return out


# --- the planner's entry point ----------------------------------------------------------------------------


def _mib(n: int) -> str:
    return f"{n / MiB:.2f} MiB"


def _why(sim: Simulation, i: int, sh: Shape, output_device: str) -> str:
    be, pp = sim.backends[i], sim.reserves[0]
    which = max(range(len(sim.reserves)), key=lambda k: sim.reserves[k].sizes[i])
    r = sim.reserves[which]
    parts = [f"peak of the {r.n_tokens}-token graph at {r.peaks[i] or 'its inputs'}"]
    if pp.copies_bytes[i]:
        parts.append(f"{_mib(pp.copies_bytes[i])} of inputs copied from other backends"
                     + (f" (x{sim.n_copies}, pipeline parallelism)" if sim.n_copies > 1 else ""))
    if pp.weight_copies_bytes[i]:
        parts.append(f"op offload: {_mib(pp.weight_copies_bytes[i])} of host weights pass through it, "
                     "one split at a time")
    if sh.legacy_inputs:
        mask = sh.n_kv * -(-sh.n_tokens // LEGACY_KQ_MASK_PAD) * LEGACY_KQ_MASK_PAD * 4
        cast = ", cast to f16 where attention runs" if sh.flash_attn else ""
        parts.append(f"KQ mask {_mib(mask)} f32{cast}" + (" + SWA mask" if any(sh.swa) else ""))
    else:
        mask = sh.n_kv * sh.n_tokens * (2 if sh.flash_attn else 4)
        parts.append(f"KQ mask {_mib(mask)} {'f16' if sh.flash_attn else 'f32'}"
                     + (" + SWA mask" if any(sh.swa) else ""))
    if not sh.flash_attn:
        parts.append("no flash attention: KQ scores n_kv x n_tokens x n_head x 4 B per layer")
    if be.name == CPU:
        parts.append("host side: graph inputs, token-embedding rows, ops on CPU weights")
        if sh.legacy_inputs and not sh.flash_attn:
            v_idx = sh.n_tokens * max(sh.n_head_kv) * sh.head_v * 8
            parts.append(f"two rules fit 2025 logs: builds from July 2025 (set_rows KV store, assumed here) "
                         f"hold the {_mib(v_idx)} V-index input; earlier builds copy K/V into cache views "
                         "and have no index inputs")
    if be.name == output_device and sh.legacy_inputs:
        parts.append("2025 builds reserve the logits of every ubatch token")
    if be.name == output_device:
        parts.append(f"logits {sh.n_outputs} x {sh.n_vocab} x 4 B ({_mib(4 * sh.n_outputs * sh.n_vocab)})")
    return "; ".join(parts)


SIMULATION_LOCK = threading.RLock()
B = TypeVar("B", bound="list[Buffer] | None")


class BufferMemo(Generic[B]):
    """The buffers of the last ``size`` simulations by everything they read (an editor's undo/redo
    or A/B toggling revisits them); handed out as copies. Simulations run one at a time: the memo
    and the incremental replay's references are shared by the window's GUI thread and its worker."""

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._d: OrderedDict[tuple[object, ...], B] = OrderedDict()

    @staticmethod
    def _copy(v: B) -> B:
        return cast(B, None if v is None else [replace(b) for b in v])

    def clear(self) -> None:
        self._d.clear()

    def get(self, key: tuple[object, ...], simulate: Callable[[], B]) -> B:
        with SIMULATION_LOCK:
            if key in self._d:
                self._d.move_to_end(key)
                return self._copy(self._d[key])
            out = simulate()
            self._d[key] = self._copy(out)
            if len(self._d) > self.size:
                self._d.popitem(last=False)
            return out


_MEMO: BufferMemo[list[Buffer]] = BufferMemo()


def placement_key(placement: Placement) -> tuple[object, ...]:
    """What a compute simulation reads of a placement."""
    return (tuple(placement.unit_devices), placement.has_overrides, tuple(placement.model_devices),
            tuple((p.name, p.device, p.buft) for p in placement.items))


def compute_buffers(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
                    params: ContextParams) -> list[Buffer]:
    """One compute buffer per backend that llama.cpp reserves (> 1 byte), CPU side last, named by the
    buffer type it logs (the CPU side uses the first device's host buffer, e.g. ``CUDA_Host``).

    Remembered for the last few placements (:class:`BufferMemo`)."""
    key = (model, graph_builder(model), devices, ctx, params, *placement_key(placement))
    return _MEMO.get(key, lambda: _compute_buffers(model, devices, placement, ctx, params))


def _compute_buffers(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
                     params: ContextParams) -> list[Buffer]:
    from offload_planner.core.memory import Buffer

    reason = f"no graph model for {model.arch}"
    try:
        sim = simulate(model, devices, placement, ctx, params, incremental=True)
    except (KeyError, IndexError, ValueError, ZeroDivisionError, AssertionError) as e:
        # a file whose tensors do not fit the architecture's graph: estimate rather than fail
        sim, reason = None, f"{model.arch} graph not built: {type(e).__name__} {e}"
    if sim is None:
        est = term_estimate(model, devices, placement, ctx, params)
        return [Buffer(be.name, be.buft, "compute", est[be.name],
                       f"estimate ({reason}): KQ mask, largest layer's activations, logits")
                for be in _backends(devices, placement) if est.get(be.name, 0) > 1]
    sh = _reserve_shapes(model, ctx, params, _full_offload(placement))[0]
    out_dev = placement.output_device
    return [Buffer(be.name, be.buft, "compute", size, _why(sim, i, sh, out_dev))
            for i, (be, size) in enumerate(zip(sim.backends, sim.sizes, strict=True)) if size > 1]
