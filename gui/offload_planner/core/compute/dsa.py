"""The graphs of DeepSeek Sparse Attention models (``src/models/deepseek32.cpp``, ``glm-dsa.cpp``):
deepseek2's MLA layer plus the lightning indexer and the top-k sparse mask.

Per layer with its own indexer (every trunk layer of deepseek32, ``is_indexer_full`` of glm-dsa): the
indexer's queries (``indexer.attn_q_b`` on the normed q LoRA, roped) and its one key head
(``indexer.attn_k``, LayerNorm with bias, roped), both through the Hadamard matrix (``attn_inp_k_rot``),
the key stored in the indexer cache (``llama_kv_cache_dsa``'s second cache, :mod:`core.dsa`), the head
weights (``indexer.proj``, scaled), ``ggml_lightning_indexer`` over the cached keys (``fused_lid``: always
on in the pinned build, with its own f16 mask) and ``ggml_top_k`` of its scores; glm-dsa's shared layers
reuse the last full layer's top-k.  The attention (``build_attn`` for ``llm_graph_input_attn_k_dsa``)
unmasks the top-k cells: a -inf copy of the MLA mask, ``ggml_set_rows`` of zeros at the top-k indices,
added to the mask, then deepseek2's MLA attention over the K-only cache.
"""

from __future__ import annotations

from offload_planner.core.compute.blocks import dense_lead_or_shared_moe
from offload_planner.core.compute.ggml import (
    F16,
    F32,
    I64,
    T,
    concat,
    cont,
    dup_op,
    input_tensor,
    lightning_indexer,
    mul_mat,
    new,
    permute,
    reshape,
    row_size,
    set_rows,
    top_k,
    view,
)
from offload_planner.core.compute.graph import Builder


class _Indexer:
    """``llm_graph_input_attn_k_dsa``'s indexer half: its cache tensors, K indices, f16 mask and the
    Hadamard matrix (``n_rot_k`` of the indexer cache: 64, doubled while it divides the head)."""

    def __init__(self, b: Builder) -> None:
        sh = b.sh
        self.b = b
        self.head = b.req(f"blk.{_first_full(sh.indexer_full)}.indexer.attn_k.weight").ne[1]
        n_stream = 1 if sh.kv_unified else sh.n_seqs
        self.k_idxs = input_tensor(I64, [b.n_tokens], "attn_inp_k_idxs")
        self.mask = input_tensor(F16, [sh.n_kv, b.n_tokens // n_stream, 1, n_stream], "attn_inp_kq_mask")
        n = 64
        while self.head % (2 * n) == 0:
            n *= 2
        self.rot = input_tensor(F32, [n, n], "attn_inp_k_rot")
        self.cache: dict[int, T] = {}

    def cache_k(self, il: int) -> T:
        if il not in self.cache:
            sh = self.b.sh
            # named as llama.cpp names it (the two caches have no name tag)
            k = T(sh.type_k, [self.head, sh.n_kv, sh.n_stream], name=f"cache_k_l{il}")
            k.dev = self.b.kv_dev(il)
            self.cache[il] = k
        return self.cache[il]

    def get_k(self, il: int) -> T:
        k = self.cache_k(il)
        hk, n_kv = self.head, k.ne[1]
        return view(k, [hk, 1, n_kv, self.b.sh.n_stream],
                    [row_size(k.type, hk), row_size(k.type, hk), row_size(k.type, hk * n_kv)], 0)


def _first_full(full: tuple[bool, ...]) -> int:
    return next(il for il, f in enumerate(full) if f)


def _indexer_top_k(b: Builder, ix: _Indexer, il: int, cur: T, qr: T) -> T:
    """The lightning indexer of layer ``il``: the top-k cell indices per token, i32."""
    sh, n_tok = b.sh, b.n_tokens
    wq = b.req(f"blk.{il}.indexer.attn_q_b.weight")
    n_head = wq.ne[1] // ix.head
    q = b.rope(reshape(mul_mat(wq, qr), ix.head, n_head, n_tok))
    k = mul_mat(b.req(f"blk.{il}.indexer.attn_k.weight"), cur)
    k = b.norm(k, b.lw(il, "indexer.k_norm.weight"), il, b.lw(il, "indexer.k_norm.bias"), op="NORM")
    k = b.rope(reshape(k, ix.head, 1, n_tok))
    q, k = mul_mat(ix.rot, q), mul_mat(ix.rot, k)
    b.g.expand(b.cpy_k(ix.cache_k(il), k, ix.k_idxs))
    w = mul_mat(b.req(f"blk.{il}.indexer.proj.weight"), cur)
    kk = ix.get_k(il)
    ns = kk.ne[3]
    q = view(q, [q.ne[0], q.ne[1], q.ne[2] // ns, ns], [q.nb[1], q.nb[2], q.nb[3] // ns], 0)
    w = view(w, [w.ne[0], w.ne[1] // ns, w.ne[2], ns], [w.nb[1], w.nb[2] // ns, w.nb[3] // ns], 0)
    w = dup_op(w, "SCALE", w)
    score = lightning_indexer(q, kk, w, ix.mask)
    return cont(top_k(score, min(score.ne[0], sh.indexer_top_k)))


def _sparse_attn(b: Builder, il: int, q: T, k: T, v: T, top: T) -> T:
    """``build_attn`` for ``llm_graph_input_attn_k_dsa``: the MLA mask with only the top-k cells open."""
    wo = b.req(f"blk.{il}.attn_output.weight")
    v_mla = b.req(f"blk.{il}.attn_v_b.weight")
    for t in (q, v, k):
        b.g.expand(t)
    ck, _ = b.cache(il, k_only=True)
    b.g.expand(b.cpy_k(ck, k, b.k_idxs.get(False)))
    mask = b.kq_mask
    assert mask is not None
    full = dup_op(mask, "FILL", mask)
    full = view(full, [1, full.ne[0], full.ne[1], full.ne[3]], [full.nb[0], full.nb[1], full.nb[2]], 0)
    top3 = view(top, [top.ne[0], top.ne[1], top.ne[3], 1], [top.nb[1], top.nb[2], top.ne[3] * top.nb[3]], 0)
    zeros = new(F32, [1, top3.ne[0], top3.ne[1], top3.ne[2]])
    zeros = dup_op(zeros, "FILL", zeros)
    opened = set_rows(full, zeros, top3)
    opened = view(opened, [opened.ne[1], opened.ne[2], 1, opened.ne[3]],
                  [opened.nb[2], opened.nb[3], opened.nb[3]], 0)
    opened = dup_op(opened, "ADD", opened, mask)
    kk = b.get_k(il, ck)
    vv = view(kk, [v.ne[0], kk.ne[1], kk.ne[2], kk.ne[3]], kk.nb[1:4], 0)
    cur = b.attn_mha(q, kk, vv, opened, None, v_mla)
    b.cb(cur, "kqv_out", il)
    return mul_mat(wo, cur)


def _attention(b: Builder, ix: _Indexer, il: int, cur: T, prev_top: T | None) -> tuple[T, T]:
    """The self-attention of layer ``il`` on the normed input, and the top-k it used."""
    sh, n_tok = b.sh, b.n_tokens
    hk, rope_d = sh.head_k_mla, sh.n_rot
    nope, kvr, nh = hk - rope_d, sh.kv_lora_rank, sh.n_head[il]
    qr = b.norm(mul_mat(b.req(f"blk.{il}.attn_q_a.weight"), cur), b.lw(il, "attn_q_a_norm.weight"), il)
    if sh.indexer_full[il]:
        top = _indexer_top_k(b, ix, il, cur, qr)
    else:
        assert prev_top is not None, "a shared indexer layer follows a full one"
        top = prev_top
    q = mul_mat(b.req(f"blk.{il}.attn_q_b.weight"), qr)
    rs_q = row_size(q.type, hk)
    q_nope = view(q, [nope, nh, n_tok], [rs_q, rs_q * nh], 0)
    q_pe = view(q, [rope_d, nh, n_tok], [rs_q, rs_q * nh], row_size(q.type, nope))
    kv_pe = mul_mat(b.req(f"blk.{il}.attn_kv_a_mqa.weight"), cur)
    rs = row_size(kv_pe.type, kvr + rope_d)
    kv_cmpr = view(kv_pe, [kvr, n_tok], [rs], 0)
    k_pe = view(kv_pe, [rope_d, 1, n_tok], [rs, rs], row_size(kv_pe.type, kvr))
    q_pe, k_pe = b.rope(q_pe), b.rope(k_pe)
    kv_cmpr = b.norm(kv_cmpr, b.lw(il, "attn_kv_a_norm.weight"), il)
    q_abs = mul_mat(b.req(f"blk.{il}.attn_k_b.weight"), permute(q_nope, 0, 2, 1, 3))
    qcur = concat(permute(q_abs, 0, 2, 1, 3), q_pe, 0)
    kv_cmpr = reshape(kv_cmpr, kvr, 1, n_tok)
    kcur = concat(kv_cmpr, k_pe, 0)
    return _sparse_attn(b, il, qcur, kcur, kv_cmpr, top), top


def dsa_graph(b: Builder) -> None:
    """``llama_model_deepseek32::graph`` / ``llama_model_glm_dsa::graph``."""
    sh = b.sh
    inp = b.inp_embd()
    b.build_inp_pos()
    b.build_inp_attn(k_only=True)
    ix = _Indexer(b)
    b.build_out_ids()
    top: T | None = None
    for il in range(sh.n_layer):
        inp_sa = inp
        cur = b.norm(inp, b.lw(il, "attn_norm.weight"), il)
        cur, top = _attention(b, ix, il, cur, top)
        if il == sh.n_layer - 1:
            cur, inp_sa = b.out_rows(cur, inp_sa)
        ffn_inp = dup_op(cur, "ADD", cur, inp_sa)
        cur = b.norm(ffn_inp, b.lw(il, "ffn_norm.weight"), il)
        cur = dense_lead_or_shared_moe(b, il, cur)
        inp = b.cb(dup_op(cur, "ADD", cur, ffn_inp), "l_out", il)
    b.head(inp)

