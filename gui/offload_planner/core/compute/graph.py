"""The llm graph context (``src/llama-graph.cpp``): the reserve's shape and the builder every
architecture's graph is written with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from offload_planner.core.compute.deltanet_shape import DeltaNet, delta_net_shape
from offload_planner.core.compute.ggml import (
    CPU,
    F16,
    F32,
    I32,
    I64,
    OUTPUT,
    Graph,
    T,
    argsort_top_k,
    cont,
    dup_op,
    flash_attn_ext,
    get_rows,
    glu,
    input_tensor,
    is_contiguous,
    mul_mat,
    mul_mat_id,
    nelements,
    new,
    permute,
    reshape,
    row_size,
    set_rows,
    soft_max_ext,
    sum_rows,
    transpose,
    view,
    view_tensor,
)
from offload_planner.core.compute.glm5_shape import Glm5, glm5_shape
from offload_planner.core.compute.qsa_shape import Qsa, qsa_shape
from offload_planner.core.dsa import dsa_shape
from offload_planner.core.ggml_types import GGMLType, type_by_name

if TYPE_CHECKING:
    from offload_planner.core.memory import ContextParams, ResolvedContext
    from offload_planner.core.model import Model


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
    # builds before set_rows (llama.cpp-2025-early): K/V copied with ggml_cpy into views of the cache, no
    # K/V index inputs
    kv_cpy_views: bool = False
    # DeepSeek Sparse Attention (deepseek32, glm-dsa; core.dsa): the indexer's top-k and which trunk layers
    # run their own indexer (the others reuse the previous full layer's top-k)
    indexer_top_k: int = 0
    indexer_full: tuple[bool, ...] = ()
    # the gated-delta-net hybrids (qwen3next, qwen35, qwen35moe): the delta net and its recurrent layers
    delta: DeltaNet | None = None
    # qwen4exp: the hyper-connection streams and the QSA k-pool sizes (.qsa_shape)
    qsa: Qsa | None = None
    # glm5-next: its KDA layers, mHC streams and k-pool DSA indexer (.glm5_shape)
    glm5: Glm5 | None = None

    def __hash__(self) -> int:
        """The dataclass's hash of every field, kept with the shape (~35 fields: every projection
        looks its reserves' shapes up several times, as parts of memo and reference keys)."""
        h: int | None = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict[str, object]:
        """Pickled without the kept hash (another process hashes strings with another seed)."""
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


def _cpy(src: T, dst: T) -> T:
    """``ggml_cpy(src, dst)``: a view of ``dst``."""
    return view_tensor(dst, "CPY", src, dst)


#: ``GGML_KQ_MASK_PAD`` of 2025 builds: the mask's token rows are padded to a multiple of it.
LEGACY_KQ_MASK_PAD = 64


def _md_float(model: Model, key: str, default: float) -> float:
    return model.arch_float(key, default)


def per_layer(v: int | list[int], n: int) -> tuple[int, ...]:
    return tuple(v) if isinstance(v, list) else (v,) * n


#: Architectures whose graph normalizes the selected experts' weights regardless of the metadata.
NORM_W_ALWAYS = frozenset({"llama", "qwen3moe", "qwen3next", "qwen35moe", "qwen4exp"})
#: Architectures whose graph fixes the gating (softmax) and reads no expert-weight scale
#: (``build_moe_ffn(..., hparams.expert_weights_scale, SOFTMAX)`` with the scale never loaded).
SOFTMAX_UNSCALED = frozenset({"qwen3next", "qwen35moe"})


def gating_func(model: Model) -> int:
    """``expert_gating_func``: 1 softmax, 2 sigmoid, 3 softmax over the selected (gpt-oss)."""
    if model.arch == "gpt-oss":
        return 3
    if model.arch in SOFTMAX_UNSCALED:
        return 1
    return model.arch_int("expert_gating_func", 1)


def make_shape(model: Model, ctx: ResolvedContext, p: ContextParams, n_tokens: int, n_seqs: int,
               n_outputs: int, full_offload: bool) -> Shape:
    s = model.summary
    n_trunk = s.n_layer_trunk
    top_k, full = dsa_shape(model)
    return Shape(
        arch=model.arch, n_layer=n_trunk, n_embd=s.n_embd,
        n_head=per_layer(s.n_head, s.n_layer), n_head_kv=per_layer(s.n_head_kv, s.n_layer),
        head_k=s.head_dim_k, head_v=s.head_dim_v,
        n_rot=model.arch_int("rope.dimension_count", s.head_dim_k), n_vocab=s.n_vocab,
        swa=s.swa_layers, n_expert=s.n_expert, n_expert_used=s.n_expert_used,
        n_dense_lead=s.n_layer_dense_lead, expert_groups=model.arch_int("expert_group_count", 0),
        group_used=model.arch_int("expert_group_used_count", 0), gating=gating_func(model),
        norm_w=model.arch in NORM_W_ALWAYS or bool(model.metadata.get(f"{model.arch}.expert_weights_norm")),
        w_scale=0.0 if model.arch in SOFTMAX_UNSCALED else _md_float(model, "expert_weights_scale", 0.0),
        head_k_mla=s.key_length_mla, head_v_mla=s.value_length_mla, kv_lora_rank=s.kv_lora_rank,
        softcap_final=_md_float(model, "final_logit_softcapping", 0.0),
        n_tokens=n_tokens, n_seqs=n_seqs, n_outputs=n_outputs, n_kv=ctx.n_ctx_seq,
        n_kv_swa=ctx.swa_cells, n_stream=ctx.n_stream, kv_unified=p.kv_unified,
        flash_attn=p.flash_attn, type_k=type_by_name(p.type_k), type_v=type_by_name(p.type_v),
        offload_kqv=p.offload_kqv, full_offload=full_offload,
        legacy_inputs=p.dialect.legacy_graph_inputs, kv_cpy_views=p.dialect.copies_kv_into_views,
        indexer_top_k=top_k, indexer_full=full,
        delta=delta_net_shape(model, p), qsa=qsa_shape(model, ctx, p),
        glm5=glm5_shape(model, ctx, p),
    )


# --- the llm graph context (src/llama-graph.cpp) ---------------------------------------------------


#: shape, type and device of every loaded weight by the name the graph asks for
WeightWhere = dict[str, tuple[tuple[int, ...], GGMLType, str]]


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
        self.k_idxs: dict[bool, T] = {}  # empty for builds that copy K/V into cache views
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
            if not sh.kv_cpy_views:
                self.k_idxs[swa], self.v_idxs[swa] = self._idxs(not sh.flash_attn, v_max)
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

    def cpy_k(self, k: T, k_cur: T, idxs: T | None) -> T:
        n_gqa = k_cur.ne[0] * k_cur.ne[1]
        if idxs is None:  # ggml_cpy into a view of the cache (its result is that view: no allocation)
            return _cpy(k_cur, view(k, [n_gqa * k_cur.ne[2]], [], 0))
        kc = view(k_cur, [n_gqa, k_cur.ne[2]], [k_cur.nb[2]], 0)
        dst = reshape(k, n_gqa, k.ne[1] * k.ne[2]) if k.ne[2] > 1 else k
        return set_rows(dst, kc, idxs)

    def cpy_v(self, v: T, v_cur: T, idxs: T | None) -> T:
        n_gqa = v_cur.ne[0] * v_cur.ne[1]
        if idxs is None:
            return self._cpy_v_view(v, v_cur, n_gqa)
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

    def _cpy_v_view(self, v: T, v_cur: T, n_gqa: int) -> T:
        """Builds before set_rows: V copied into a view of the cache, transposed without flash attention."""
        n_tok = v_cur.ne[2]
        vc = reshape(v_cur, n_gqa, n_tok) if is_contiguous(v_cur) else cont(v_cur, n_gqa, n_tok)
        if self.sh.flash_attn:
            return _cpy(vc, view(v, [n_gqa * n_tok], [], 0))
        dst = view(v, [n_tok, n_gqa], [row_size(v.type, v.ne[1])], 0)
        return _cpy(transpose(vc), dst)

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
        self.g.expand(self.cpy_k(ck, k, self.k_idxs.get(swa)))
        self.g.expand(self.cpy_v(cv, v, self.v_idxs.get(swa)))
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
        self.g.expand(self.cpy_k(ck, k, self.k_idxs.get(False)))
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


