"""qwen4exp's graph (Qwen3.8-Flash-Next, ``src/models/qwen4exp.cpp`` with ``delta-net-base.cpp``).

Qwen3.5 MoE's layers without layer norms, on a residual of ``hc`` streams (hyper-connections): before
each block ``build_hc_mix`` (grouped RMS norm, a low-rank gate, ``ggml_dsv4_hc_pre_gated``: the fused
op the pinned build resolves as supported on every backend, so both reserves use it, and the
injection projection), after it ``build_hc_combine`` (``ggml_dsv4_hc_post``); the head's mixer
(``il`` = -1) is the unfused one (sigmoid gate, the streams' mean by views) and is the output norm.
The gated-delta-net layers are Qwen3.5's (:mod:`.archs_deltanet`'s pieces) with the conv state
copied back through a ``ggml_cont`` (``build_conv_state_at``) and a sigmoid output gate.  The
attention layers with a compress ratio run QSA (``build_qsa_sel``): raw indexer keys stored in the
indexer cache of ``llama_memory_hybrid_idx``, the pools re-pooled (every one at reserve:
:mod:`.qsa_shape`), scattered and gathered, scored by ``ggml_lightning_indexer``, the top pools plus
the tail turned into an f16 selection mask ``[1, n_kv + n_sel, n_tokens]`` added to the KQ mask.
PLE layers (``ple.layers``) first add the n-gram embedding to the residual (``build_inp_ple``,
``build_ple``): hashed rows of ``per_layer_token_embd``, a gate from the grouped-normed key and
residual, and a causal conv dilated by the n-gram size over the layer's own recurrent row
(``cache_ple_r_l``, here ``cache_p_l``).

Measured (``tests/integration/test_deltanet_compute_vs_llama.py``, ``test_hybrid_memory_vs_llama.py``):
the synth qwen4exp, qwen4exp-mtp (trunk) and qwen4exp-ple on llama-server with RPC devices, every
compute buffer and the node and split counts equal.  Not built: the MTP context's graph
(``graph_mtp``: no MTP compute buffer is projected for it).
"""

from __future__ import annotations

from dataclasses import dataclass

from offload_planner.core.compute.archs_deltanet import (
    _beta_gate,
    _build_rs,
    _l2_norm,
    _qkvz,
    _recurrent_attn,
    _Rs,
    _state_cache,
    _unary,
    hybrid_ffn,
)
from offload_planner.core.compute.deltanet_shape import DeltaNet
from offload_planner.core.compute.ggml import (
    F16,
    F32,
    I32,
    I64,
    OUTPUT,
    T,
    cast,
    concat,
    cont,
    cpy,
    dsv4_hc_post,
    dsv4_hc_pre_gated,
    dup_op,
    get_rows,
    input_tensor,
    lightning_indexer,
    mul_mat,
    new,
    repeat_4d,
    reshape,
    row_size,
    set_rows,
    ssm_conv,
    top_k,
    transpose,
    view,
)
from offload_planner.core.compute.graph import Builder
from offload_planner.core.compute.qsa_shape import Qsa
from offload_planner.core.ggml_types import GGMLType


def _row(n: int) -> int:
    return row_size(F32, n)


def _scale(a: T) -> T:
    return dup_op(a, "SCALE", a)


# --- hyper-connections ----------------------------------------------------------------------------


def _hc_mix(b: Builder, x: T, prefix: str, il: int, *, inject: bool) -> tuple[T, T | None]:
    """``build_hc_mix``: the block input ``[n_embd, n_tokens]`` and the injection ``[hc, n_tokens]``."""
    hc, n_embd, nt = x.ne[1], x.ne[0], x.ne[2]
    xn = dup_op(x, "RMS_NORM", x)
    xn = reshape(dup_op(xn, "MUL", xn, b.req(f"{prefix}norm.weight")), hc * n_embd, nt)
    lo = _unary(_scale(mul_mat(b.req(f"{prefix}down.weight"), xn)))
    gate = mul_mat(b.req(f"{prefix}up.weight"), lo)
    if il >= 0:
        mixed = dsv4_hc_pre_gated(reshape(xn, n_embd, hc, nt), reshape(gate, n_embd, hc, nt))
    else:
        gated = dup_op(xn, "MUL", xn, _unary(gate))
        gated = reshape(gated, n_embd, hc, nt)
        nb1 = _row(n_embd) * hc
        mixed = cont(view(gated, [n_embd, nt], [nb1], 0))
        for c in range(1, hc):
            mixed = dup_op(mixed, "ADD", mixed, view(gated, [n_embd, nt], [nb1], _row(n_embd) * c))
        mixed = _scale(mixed)
    inj = mul_mat(b.req(f"{prefix}inject.weight"), xn) if inject else None
    return mixed, inj


def _hc_combine(residual: T, block_out: T, inject: T) -> T:
    """``build_hc_combine`` (fused): ``2 * sigmoid(inject / hc)`` scatters the block output."""
    w = _scale(_unary(_scale(inject)))
    return dsv4_hc_post(block_out, residual, w)


def _stream_rows(b: Builder, res_hc: T) -> T:
    """The hc-wide residual's output rows."""
    n_embd, hc = res_hc.ne[0], res_hc.ne[1]
    assert b.out_ids is not None
    r = get_rows(reshape(res_hc, n_embd * hc, res_hc.ne[2]), b.out_ids)
    return reshape(r, n_embd, hc, r.ne[1])


# --- the gated delta net --------------------------------------------------------------------------


def _conv_state_at(b: Builder, rs: _Rs, cache: T, x: T, cols: int, channels: int) -> T:
    """``build_conv_state_at``: the gathered rows then the ubatch's, the last ``cols`` columns copied
    back (contiguous) once per rollback slot."""
    ns = rs.n_seqs
    state = reshape(_build_rs(b, rs, cache, cols * channels), cols, channels, ns)
    conv_input = concat(state, transpose(x), 0)
    row = _row(cols * channels)
    for slot in range(rs.n_snap):
        s_idx = max(0, conv_input.ne[0] - cols - slot)
        tail = view(conv_input, [cols, channels, ns], [conv_input.nb[1], conv_input.nb[2]], _row(s_idx))
        dst = view(cache, [cols * channels, ns], [cache.nb[1]], slot * rs.n_rs * row)
        b.g.expand(cpy(cont(tail), dst))
    return conv_input


def _linear_attn(b: Builder, dn: DeltaNet, rs: _Rs, cur: T, il: int) -> T:
    """``build_layer_attn_linear``: Qwen3.5's, with a sigmoid output gate."""
    ns, nst = rs.n_seqs, rs.n_seq_tokens
    hk, n_kh, n_vh = dn.d_state, dn.n_group, dn.dt_rank
    hv = dn.d_inner // n_vh
    qkv_mixed, z = _qkvz(b, dn, rs, cur, il)
    beta, gate = _beta_gate(b, dn, rs, cur, il)
    dev = b.kv_dev(il)
    r_cache = _state_cache(f"cache_r_l{il}", dn.n_embd_r, rs.n_rs * rs.n_snap, dev)
    s_cache = _state_cache(f"cache_s_l{il}", dn.n_embd_s, rs.n_rs * rs.n_snap, dev)
    kernel = b.req(f"blk.{il}.ssm_conv1d.weight")
    conv_input = _conv_state_at(b, rs, r_cache, qkv_mixed, kernel.ne[0] - 1, dn.conv_channels)
    state = reshape(_build_rs(b, rs, s_cache, dn.n_embd_s), hv, hv, n_vh, ns)
    conv = _unary(ssm_conv(conv_input, kernel))
    nb1 = _row(2 * hk * n_kh + hv * n_vh)
    q = view(conv, [hk, n_kh, nst, ns], [_row(hk), nb1, nb1 * nst], 0)
    k = view(conv, [hk, n_kh, nst, ns], [_row(hk), nb1, nb1 * nst], _row(hk * n_kh))
    v = view(conv, [hv, n_vh, nst, ns], [_row(hv), nb1, nb1 * nst], _row(2 * hk * n_kh))
    out = _recurrent_attn(b, dn, rs, s_cache, _l2_norm(q), _l2_norm(k), v, gate, beta, state)
    z = reshape(z, hv, n_vh, nst, ns)
    normed = b.norm(out, b.lw(il, "ssm_norm.weight"), il)
    cur = dup_op(normed, "MUL", normed, _unary(z))
    cur = mul_mat(b.req(f"blk.{il}.ssm_out.weight"), reshape(cur, hv * n_vh, nst, ns))
    return reshape(cur, b.sh.n_embd, nst * ns)


# --- PLE n-gram embeddings -------------------------------------------------------------------------


def _inp_ple(b: Builder, q: Qsa) -> T:
    """``build_inp_ple``: the hashed rows of ``per_layer_token_embd``, ``[head_dim * n_heads, n_tokens]``."""
    rows = input_tensor(I32, [q.ple_n_heads * b.n_tokens], "ple_rows")
    emb = get_rows(b.req("per_layer_token_embd.weight"), rows)
    return reshape(emb, q.ple_head_dim * q.ple_n_heads, b.n_tokens)


def _grouped_norm(b: Builder, x: T, w: T) -> T:
    """RMS norm over one stream, scaled by the ``[n_embd, hc]`` weight."""
    t = reshape(x, b.sh.n_embd, w.ne[1], b.n_tokens)
    t = dup_op(t, "RMS_NORM", t)
    return dup_op(t, "MUL", t, w)


def _ple_gate(b: Builder, key: T, query: T) -> T:
    """The per-stream dot product's signed square root, sigmoid: ``[1, hc, n_tokens]``."""
    kq = dup_op(key, "MUL", key, query)
    s = _scale(new(kq.type, [1, kq.ne[1], kq.ne[2], kq.ne[3]], "SUM_ROWS", kq))
    mag = _unary(s)  # ggml_abs
    mag = dup_op(mag, "CLAMP", mag)
    mag = dup_op(mag, "SQRT", mag)
    sgn = _unary(s)
    return _unary(dup_op(sgn, "MUL", sgn, mag))


def _ple_conv(b: Builder, q: Qsa, rs: _Rs, normalized: T, il: int) -> T:
    """The depthwise causal conv dilated by the n-gram size over the history and the ubatch."""
    hc_dim, ns, nst = normalized.ne[0], rs.n_seqs, rs.n_seq_tokens
    hist = (q.ple_kernel - 1) * q.ple_ngram
    cache = _state_cache(f"cache_p_l{il}", hist * hc_dim, rs.n_rs * rs.n_snap, b.kv_dev(il))
    padded = _conv_state_at(b, rs, cache, reshape(normalized, hc_dim, nst, ns), hist, hc_dim)
    w = b.req(f"blk.{il}.ple_conv1d.weight")
    conv: T | None = None
    for k in range(q.ple_kernel):
        start = hist - (q.ple_kernel - 1 - k) * q.ple_ngram
        shifted = cont(transpose(view(padded, [nst, hc_dim, ns], [padded.nb[1], padded.nb[2]], _row(start))))
        wk = reshape(cont(view(w, [1, hc_dim], [w.nb[1]], k * w.nb[0])), hc_dim)
        if wk.type is not F32:
            wk = cast(wk, F32)
        term = dup_op(shifted, "MUL", shifted, wk)
        conv = term if conv is None else dup_op(conv, "ADD", conv, term)
    assert conv is not None
    return reshape(cont(_unary(conv)), b.sh.n_embd, q.hc, b.n_tokens)


def _ple(b: Builder, q: Qsa, rs: _Rs, emb: T, hidden: T, il: int) -> T:
    """``build_ple``: the gated n-gram value and its conv added to every stream of the residual."""
    n_embd, hc, n_tok = b.sh.n_embd, q.hc, b.n_tokens
    key = mul_mat(b.req(f"blk.{il}.ple_key.weight"), emb)
    value = mul_mat(b.req(f"blk.{il}.ple_value.weight"), emb)
    key = _grouped_norm(b, key, b.req(f"blk.{il}.ple_norm_key.weight"))
    query = _grouped_norm(b, hidden, b.req(f"blk.{il}.ple_norm_query.weight"))
    gate = _ple_gate(b, key, query)
    v3 = repeat_4d(reshape(value, n_embd, 1, n_tok), n_embd, hc, n_tok, 1)
    gated = dup_op(v3, "MUL", v3, gate)
    normalized = _grouped_norm(b, reshape(gated, hc * n_embd, n_tok), b.req(f"blk.{il}.ple_norm_conv.weight"))
    conv = _ple_conv(b, q, rs, reshape(normalized, hc * n_embd, n_tok), il)
    both = dup_op(gated, "ADD", gated, conv)
    return dup_op(hidden, "ADD", hidden, both)


# --- QSA --------------------------------------------------------------------------------------------


@dataclass
class _KPool:
    """``llm_graph_input_kpool`` and the indexer cache tensors (``cache_k_l*`` of the idx cache)."""

    k_idxs: T
    pool_cells: T
    pool_idxs: T
    pool_mask: T
    tail_idxs: T
    new_pool_idxs: T
    new_pool_rep: T
    new_pool_pos: T


def _inp_kpool(b: Builder, q: Qsa) -> _KPool:
    n_tok = b.n_tokens
    kp = _KPool(
        input_tensor(I64, [n_tok], "idx_inp_k_idxs"), input_tensor(I32, [q.n_pool], "pool_cells"),
        input_tensor(I32, [q.kpool, q.n_pool], "pool_idxs"),
        input_tensor(F16, [q.n_pool, n_tok], "pool_mask"),
        input_tensor(I32, [q.kpool - 1, n_tok], "tail_idxs"),
        input_tensor(I32, [q.kpool, q.n_new], "new_pool_idxs"), input_tensor(I64, [q.n_new], "new_pool_rep"),
        input_tensor(I32, [4 * q.n_new], "new_pool_pos"))
    for t in (kp.pool_cells, kp.pool_idxs, kp.pool_mask, kp.tail_idxs):
        b.g.expand(t)
    return kp


def _idx_cache(b: Builder, q: Qsa, il: int) -> T:
    sh = b.sh
    k = T(sh.type_k, [2 * q.idx_dim, sh.n_kv, sh.n_stream], name=f"cache_k_l{il}")
    k.dev = b.kv_dev(il)
    return k


def _pooled_keys(b: Builder, q: Qsa, kp: _KPool, cache: T, il: int) -> T:
    """The fresh pools' mean keys normed and rotated, scattered into the cache; all pools gathered."""
    d, n_new, n_cells = q.idx_dim, q.n_new, cache.ne[1] * cache.ne[2]
    key_gate = view(cache, [d, n_cells], [cache.nb[1]], 0)
    pooled_slot = view(cache, [d, n_cells], [cache.nb[1]], row_size(cache.type, d))
    rows = get_rows(key_gate, reshape(kp.new_pool_idxs, q.kpool * n_new))
    rows = reshape(rows, d, q.kpool, n_new)
    pooled: T | None = None
    for i in range(q.kpool):
        sl = view(rows, [d, n_new], [rows.nb[2]], i * rows.nb[1])
        pooled = cont(sl) if pooled is None else dup_op(pooled, "ADD", pooled, sl)
    assert pooled is not None
    pooled = b.norm(_scale(pooled), b.lw(il, "indexer.k_norm.weight"), il)
    pooled = reshape(pooled, d, 1, n_new)
    pooled = dup_op(pooled, "ROPE", pooled, kp.new_pool_pos, None)
    pooled = reshape(pooled, d, n_new)
    b.g.expand(set_rows(pooled_slot, pooled, kp.new_pool_rep))
    return reshape(get_rows(pooled_slot, kp.pool_cells), d, 1, q.n_pool)


def _qsa_scores(b: Builder, q: Qsa, kp: _KPool, cur: T, il: int) -> T:
    """``build_qsa_sel`` up to the scores ``[n_pool, n_tokens]``."""
    n_tok, d = b.n_tokens, q.idx_dim
    k_raw = mul_mat(b.req(f"blk.{il}.indexer.k_proj.weight"), cur)
    pzero = new(F32, [d, n_tok])
    pzero = dup_op(pzero, "FILL", pzero)
    packed = reshape(concat(k_raw, pzero, 0), 2 * d, 1, n_tok)
    cache = _idx_cache(b, q, il)
    b.g.expand(b.cpy_k(cache, packed, kp.k_idxs))
    pooled = _pooled_keys(b, q, kp, cache, il)
    qq = reshape(mul_mat(b.req(f"blk.{il}.indexer.q_proj.weight"), cur), d, q.n_idx_head, n_tok)
    qq = b.rope(b.norm(qq, b.lw(il, "indexer.q_norm.weight"), il))
    w = new(F32, [q.n_idx_head, n_tok])
    w = dup_op(w, "FILL", w)
    return lightning_indexer(qq, pooled, w, kp.pool_mask)


def _fill_rows(type_: GGMLType, n: int, n_tok: int) -> T:
    """A ``[n]`` row filled (-inf or 0), repeated for every token, as ``[1, n, n_tokens]``."""
    t = new(type_, [n, 1, 1, 1])
    t = dup_op(t, "FILL", t)
    return reshape(repeat_4d(t, n, n_tok, 1, 1), 1, n, n_tok)


def _qsa_sel(b: Builder, q: Qsa, kp: _KPool, cur: T, il: int) -> T:
    """``build_qsa_sel``: the KQ mask with only the selected cells open."""
    n_tok, kpool, n_top, n_sel = b.n_tokens, q.kpool, q.n_top_pool, q.n_sel
    kq_mask = b.kq_mask
    assert kq_mask is not None
    n_kv = kq_mask.ne[0]
    score = _qsa_scores(b, q, kp, cur, il)
    top = top_k(score, n_top)
    sel_idx = get_rows(kp.pool_idxs, reshape(top, n_top * n_tok))
    sel_idx = concat(reshape(sel_idx, kpool * n_top, n_tok), kp.tail_idxs, 0)
    b.g.expand(sel_idx)
    mask_all = _fill_rows(kq_mask.type, n_kv + n_sel, n_tok)
    zeros = _fill_rows(kq_mask.type, n_sel, n_tok)
    top_score = get_rows(reshape(score, 1, q.n_pool, n_tok), top)
    live_pool = _scale(top_score)
    live_pool = dup_op(live_pool, "CLAMP", live_pool)
    live_pool = reshape(repeat_4d(live_pool, kpool, n_top, n_tok, 1), kpool * n_top, n_tok)
    live_tail = _scale(cast(kp.tail_idxs, F32))
    live_tail = dup_op(live_tail, "CLAMP", live_tail)
    live = concat(live_pool, live_tail, 0)
    ones = dup_op(live, "FILL", live)
    dump = _scale(dup_op(ones, "CUMSUM", ones))
    idx_f = cast(sel_idx, F32)
    diff = dup_op(idx_f, "SUB", idx_f, dump)
    prod = dup_op(diff, "MUL", diff, live)
    idx_f = dup_op(prod, "ADD", prod, dump)
    sel = set_rows(mask_all, zeros, reshape(cast(idx_f, I32), n_sel, n_tok, 1))
    row = sel.nb[2]
    m = kq_mask.ne
    sel = view(sel, [n_kv, m[1], m[2], m[3]], [row, row * m[1], row * m[1] * m[2]], 0)
    return dup_op(sel, "ADD", sel, kq_mask)


def _attn_layer(b: Builder, q: Qsa, kp: _KPool | None, cur: T, il: int) -> T:
    """``build_layer_attn``: QSA's selection mask first (a layer with a compress ratio), then Qwen3.5's
    gated attention over the KV cache (``build_attn_qsa`` with that mask)."""
    sh, n_tok = b.sh, b.n_tokens
    hd, nh, nkv = sh.head_k, sh.n_head[il], sh.n_head_kv[il]
    sel = _qsa_sel(b, q, kp, cur, il) if kp is not None and q.ratios[il] > 0 else None
    q_full = mul_mat(b.req(f"blk.{il}.attn_q.weight"), cur)
    nb = [_row(hd * 2), _row(hd * 2 * nh)]
    qc = b.norm(view(q_full, [hd, nh, n_tok], nb, 0), b.lw(il, "attn_q_norm.weight"), il)
    k = mul_mat(b.req(f"blk.{il}.attn_k.weight"), cur)
    v = mul_mat(b.req(f"blk.{il}.attn_v.weight"), cur)
    k = b.norm(reshape(k, hd, nkv, n_tok), b.lw(il, "attn_k_norm.weight"), il)
    gate = cont(view(q_full, [hd, nh, n_tok], nb, _row(hd)), hd * nh, n_tok)
    v = reshape(v, sh.head_v, nkv, n_tok)
    qc, k = b.rope(qc), b.rope(k)
    cur = b.attn(il, None, None, qc, k, v) if sel is None else _attn_qsa(b, il, qc, k, v, sel)
    cur = dup_op(cur, "MUL", cur, _unary(gate))
    return mul_mat(b.req(f"blk.{il}.attn_output.weight"), cur)


def _attn_qsa(b: Builder, il: int, q: T, k: T, v: T, sel: T) -> T:
    """``build_attn_qsa``: the dense attention with the selection mask (it carries the causal one)."""
    k_rot, v_rot = b.k_rot.get(False), b.v_rot.get(False)
    if k_rot is not None:
        q, k = b.hadamard(q, k_rot), b.hadamard(k, k_rot)
    if v_rot is not None:
        v = b.hadamard(v, v_rot)
    for t in (q, v, k):
        b.g.expand(t)
    ck, cv = b.cache(il, k_only=False)
    assert cv is not None and b.kq_mask is not None
    b.g.expand(b.cpy_k(ck, k, b.k_idxs.get(False)))
    b.g.expand(b.cpy_v(cv, v, b.v_idxs.get(False)))
    mask = reshape(sel, *b.kq_mask.ne)
    cur = b.attn_mha(q, b.get_k(il, ck), b.get_v(il, cv), mask, None, None)
    b.cb(cur, "kqv_out", il)
    if v_rot is not None:
        cur = b.hadamard(cur, v_rot)
    return cur


def _inputs(b: Builder, dn: DeltaNet, q: Qsa) -> tuple[_Rs, _KPool | None]:
    """``build_inp_mem_hybrid`` (the recurrent states' ``s_copy``, the attention's inputs), the k-pool
    inputs, the 4 IMRoPE positions per token, the output ids."""
    sh = b.sh
    n_rs = max(1, sh.n_seqs)
    rs = _Rs(input_tensor(I32, [n_rs], "rs_s_copy"), n_rs, sh.n_seqs, b.n_tokens // sh.n_seqs,
             dn.n_rs_seq + 1)
    b.build_inp_attn()
    kp = _inp_kpool(b, q) if q.kpool > 0 else None
    b.inp_pos = input_tensor(I32, [b.n_tokens * 4], "inp_pos")
    b.build_out_ids()
    return rs, kp


def qwen4exp_graph(b: Builder) -> None:
    """``llama_model_qwen4exp::graph``."""
    sh, dn, q = b.sh, b.sh.delta, b.sh.qsa
    if dn is None or q is None or sh.legacy_inputs or sh.kv_cpy_views:
        raise ValueError("the qwen4exp graph is modelled on the pinned build")
    inp = b.inp_embd()
    rs, kp = _inputs(b, dn, q)
    ple_emb = _inp_ple(b, q) if q.ple_layers else None
    if ple_emb is not None:
        b.g.expand(ple_emb)
    res_hc = repeat_4d(reshape(inp, sh.n_embd, 1, b.n_tokens), sh.n_embd, q.hc, b.n_tokens, 1)
    b.g.expand(res_hc)
    for il in range(sh.n_layer):
        if ple_emb is not None and il in q.ple_layers:
            res_hc = _ple(b, q, rs, ple_emb, res_hc, il)
        cur, inject = _hc_mix(b, res_hc, f"blk.{il}.hc_attn_", il, inject=True)
        b.g.expand(cur)
        cur = _linear_attn(b, dn, rs, cur, il) if dn.recurrent[il] else _attn_layer(b, q, kp, cur, il)
        assert inject is not None
        if il == sh.n_layer - 1:
            cur, inject = b.out_rows(cur, inject)
            res_hc = _stream_rows(b, res_hc)
        res_hc = _hc_combine(res_hc, cur, inject)
        cur, inject = _hc_mix(b, res_hc, f"blk.{il}.hc_ffn_", il, inject=True)
        assert inject is not None
        cur = hybrid_ffn(b, cur, il)
        res_hc = b.cb(_hc_combine(res_hc, cur, inject), "l_last", il)
    cur, _ = _hc_mix(b, res_hc, "output_hc_", -1, inject=False)
    b.cb(cur, "result_norm", -1)
    cur.flags |= OUTPUT
    cur = b.cb(mul_mat(b.req("output.weight"), cur), "result_output", -1)
    cur.flags |= OUTPUT
    b.g.expand(cur)


def qwen4exp_mtp_graph(b: Builder) -> None:
    """``llama_model_qwen4exp::graph_mtp``: the token embedding and the main model's hc-wide hidden state
    normed, projected to the streams, the NextN block (its attention with QSA, its FFN, both through
    the hyper-connections), every token's residual kept (``t_h_nextn``), the output rows mixed by the
    block's own head mixer (fused: ``il`` >= 0) and projected."""
    sh, q = b.sh, b.sh.qsa
    assert q is not None
    il, n_tok, n_embd = sh.n_layer, b.n_tokens, sh.n_embd  # the NextN block follows the trunk
    tokens = input_tensor(I32, [n_tok], "inp_tokens")
    h = input_tensor(F32, [n_embd * q.hc, n_tok], "mtp_h_input")
    tok = get_rows(b.req("token_embd.weight"), tokens)
    s_copy = input_tensor(I32, [max(1, sh.n_seqs)], "rs_s_copy")
    b.g.expand(s_copy)
    b.build_inp_attn()
    kp = _inp_kpool(b, q) if q.kpool > 0 else None
    b.inp_pos = input_tensor(I32, [n_tok * 4], "inp_pos")
    b.build_out_ids()
    assert b.out_ids is not None
    h_norm = b.norm(reshape(h, n_embd, q.hc, n_tok), b.lw(il, "nextn.hnorm.weight"), il)
    e_norm = b.norm(tok, b.lw(il, "nextn.enorm.weight"), il)
    e_norm = repeat_4d(reshape(e_norm, n_embd, 1, n_tok), n_embd, q.hc, n_tok, 1)
    res_hc = mul_mat(b.req(f"blk.{il}.nextn.eh_proj.weight"), concat(e_norm, h_norm, 0))
    cur, inject = _hc_mix(b, res_hc, f"blk.{il}.hc_attn_", il, inject=True)
    cur = _attn_layer(b, q, kp, cur, il)
    assert inject is not None
    res_hc = _hc_combine(res_hc, cur, inject)
    cur, inject = _hc_mix(b, res_hc, f"blk.{il}.hc_ffn_", il, inject=True)
    assert inject is not None
    res_hc = _hc_combine(res_hc, hybrid_ffn(b, cur, il), inject)
    flat = reshape(res_hc, n_embd * q.hc, n_tok)
    flat_out = get_rows(flat, b.out_ids)
    flat.flags |= OUTPUT  # t_h_nextn: every token (embeddings_nextn_masked is false)
    b.g.expand(flat)
    cur, _ = _hc_mix(b, reshape(flat_out, n_embd, q.hc, flat_out.ne[1]), f"blk.{il}.nextn.hc_head_", il,
                     inject=False)
    b.cb(cur, "result_norm", -1)
    cur.flags |= OUTPUT
    cur = b.cb(mul_mat(b.req("output.weight"), cur), "result_output", -1)
    cur.flags |= OUTPUT
    b.g.expand(cur)
