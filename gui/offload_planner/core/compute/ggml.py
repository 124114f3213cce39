"""A mini ggml on shapes: tensors with ggml's shapes, strides and views, the op constructors, and
``ggml_build_forward_expand``'s depth-first node order."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from offload_planner.core.ggml_types import GGMLType, type_by_name

CPU = "CPU"

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
LAYER_SUFFIX = re.compile(r"-(\d+)$")
#: Names of the per-layer memory tensors that carry their layer's device (``kv_dev``), each followed
#: by the layer number: the KV cache and the recurrent states (conv ``r``, delta-net ``s``, qwen4exp's
#: PLE conv history ``p``: llama.cpp's ``cache_ple_r_l``).  Every prefix is 9 characters long.
CACHE_PREFIXES = ("cache_k_l", "cache_v_l", "cache_r_l", "cache_s_l", "cache_p_l")


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
    n0, n1, n2, n3 = t.ne
    if n0 <= 0 or n1 <= 0 or n2 <= 0 or n3 <= 0:
        return 0
    nb = t.nb
    bs = t.type.block_size
    size = t.type.type_size + (n0 - 1) * nb[0] if bs == 1 else n0 * nb[0] // bs
    return size + (n1 - 1) * nb[1] + (n2 - 1) * nb[2] + (n3 - 1) * nb[3]


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


def top_k(a: T, k: int) -> T:
    """``ggml_top_k`` (GGML_OP_TOP_K): the indices of the k largest of each row, i32."""
    return new(I32, [k, a.ne[1], a.ne[2], a.ne[3]], "TOP_K", a)


def lightning_indexer(q: T, k: T, weights: T, mask: T) -> T:
    """``ggml_lightning_indexer``: DSA's fused indexer scores, f32 ``[n_kv, n_tokens, 1, n_stream]``."""
    return new(F32, [k.ne[2], q.ne[2], 1, q.ne[3]], "LIGHTNING_INDEXER", q, k, weights, mask)


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


def cpy(src: T, dst: T) -> T:
    """``ggml_cpy(src, dst)``: a view of ``dst`` (the copy writes into it: no allocation)."""
    return view_tensor(dst, "CPY", src, dst)


def repeat_4d(a: T, *ne: int) -> T:
    """``ggml_repeat_4d``: a new tensor of ``a``'s type and shape ``ne``."""
    return new(a.type, ne, "REPEAT", a)


def ssm_conv(sx: T, c: T) -> T:
    """``ggml_ssm_conv``: sx ``[d_conv - 1 + n_t, d_inner, n_s]``, kernel c ``[d_conv, d_inner]`` ->
    f32 ``[d_inner, n_t, n_s]``."""
    return new(F32, [c.ne[1], sx.ne[0] - c.ne[0] + 1, sx.ne[2]], "SSM_CONV", sx, c)


def gated_delta_net(q: T, k: T, v: T, g: T, beta: T, state: T, n_snap: int = 1) -> T:
    """``ggml_gated_delta_net``: f32 ``[S_v * H, n_tokens * n_seqs + n_snap * S_v * n_seqs]`` (the
    output rows, then ``n_snap`` copies of the final state), H and S_v from v ``[S_v, H, n_tokens,
    n_seqs]``."""
    s_v, h, n_tok, n_seqs = v.ne
    return new(F32, [s_v * h, n_tok * n_seqs + n_snap * s_v * n_seqs], "GATED_DELTA_NET",
               q, k, v, g, beta, state)


def dsv4_hc_pre_gated(x: T, gate: T) -> T:
    """``ggml_dsv4_hc_pre_gated``: ``x`` and its gate ``[n_embd, hc, n_tokens]`` to ``[n_embd, n_tokens]``."""
    return new(F32, [x.ne[0], x.ne[2]], "DSV4_HC_PRE", x, gate)


def dsv4_hc_post(x: T, residual: T, post: T, comb: T | None = None) -> T:
    """``ggml_dsv4_hc_post``: ``[n_embd, hc, n_tokens]``."""
    return new(F32, [x.ne[0], residual.ne[1], x.ne[1]], "DSV4_HC_POST", x, residual, post, comb)


def dsv4_hc_pre(x: T, weights: T) -> T:
    """``ggml_dsv4_hc_pre`` (ungated): ``x [n_embd, hc, n_tokens]`` weighted by ``[hc, n_tokens]``."""
    return new(F32, [x.ne[0], x.ne[2]], "DSV4_HC_PRE", x, weights)


def dsv4_hc_comb(mixes: T, scale: T, base: T) -> T:
    """``ggml_dsv4_hc_comb``: the Sinkhorn-normalised ``[hc, hc, n_tokens]`` mixing matrices."""
    hc = math.isqrt(mixes.ne[0] + 1) - 1  # mixes: (2 + hc) * hc rows
    return new(F32, [hc, hc, mixes.ne[1]], "DSV4_HC_COMB", mixes, scale, base)


def cast(a: T, type_: GGMLType) -> T:
    """``ggml_cast``: a new tensor of ``a``'s shape (its self-reference as second source left out, as
    the f16 mask cast of :mod:`.graph`)."""
    return new(type_, a.ne, "CPY", a)


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


