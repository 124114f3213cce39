"""glm5-next's graph (GLM-5.3-Flash, ``src/models/glm5-next.cpp`` with ``delta-net-base.cpp``).

Four mHC streams: before each block ``build_hc_pre`` (RMS norm of the flattened streams, the mixes
projection, the pre / post weights from its first ``2 hc`` rows, the fused ``ggml_dsv4_hc_comb`` and
``ggml_dsv4_hc_pre``: the pinned build resolves every fused HC op as supported), after it the fused
``ggml_dsv4_hc_post`` with the Sinkhorn matrices; the head narrows to the output rows and takes the
streams' mean.  KDA layers (``head_count_kv`` 0): Q, K, V each projected and convolved over its third
of the layer's conv row (``glm5_conv1d``), the softplus decay gate per channel, the fused gated delta
net (:mod:`.archs_deltanet`'s ``build_rs`` and ``build_recurrent_attn``), the RMS-normed output gated
by ``sigmoid(g2)``.  MLA layers: nope-only MLA over the K-only cache, with the k-pool DSA indexer
(``build_kpool_select``: keys, pool gates and pooled keys in the indexer cache, every pool re-pooled at
reserve, ``ggml_lightning_indexer`` (``fused_lid``, f16 pool mask), top-k re-ordered by score, the
top pools plus the tail scattered into a ``[1, n_kv + n_sel, n_tokens]`` mask); shared-indexer layers
reuse the previous full layer's selection.  Not built: the gathered-latents path of ``-ub`` <= 16
(``GLM5_GATHER_UBATCH``: the simulation declines, the estimate).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from offload_planner.core.compute.archs_deltanet import (
    _build_rs,
    _l2_norm,
    _recurrent_attn,
    _Rs,
    _state_cache,
    _unary,
)
from offload_planner.core.compute.archs_qwen4exp import _fill_rows
from offload_planner.core.compute.blocks import dense_lead_or_shared_moe
from offload_planner.core.compute.ggml import (
    CPU,
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
    dsv4_hc_comb,
    dsv4_hc_post,
    dsv4_hc_pre,
    dup_op,
    get_rows,
    input_tensor,
    lightning_indexer,
    mul_mat,
    new,
    permute,
    repeat_4d,
    reshape,
    row_size,
    set_rows,
    ssm_conv,
    top_k,
    transpose,
    view,
)
from offload_planner.core.compute.glm5_shape import Glm5
from offload_planner.core.compute.graph import Builder

if TYPE_CHECKING:
    from offload_planner.core.placement import Placement


#: ``max_ub`` of ``build_inp_kpool``: at most this ``-ub`` (and a context past the selection) the
#: selection gathers the latents, a path not built here
GLM5_GATHER_UBATCH = 16


def glm5_simulated(placement: Placement) -> bool:
    """Whether the fused mHC ops are known to resolve as enabled for this placement, so the graph built
    here is the one llama.cpp reserves.  The resolution (``resolve_fused_ops``) disables an op when the
    scheduler puts one of its nodes on another device than its layer's: measured when a layer on the
    CPU is followed by a layer or the output on a GPU (``-ngl 5``: "layer 3 is assigned to device CPU
    but fused DeepSeek V4 HC post is assigned to device RPC0", then the unfused combine, 2491 nodes);
    never with every layer on GPUs (split or not), all on the CPU, or with experts on the host.  A
    layer's other tensors moved off its device may move those nodes too: those placements, and the
    ones above, take the estimate (the unfused paths are not built)."""
    units = placement.unit_devices
    first_cpu = next((i for i, d in enumerate(units) if d == CPU), None)
    if first_cpu is not None and any(d != CPU for d in units[first_cpu:]):
        return False
    for it in placement.items:
        name = it.tensor.name
        if not name.startswith("blk.") or "_exps" in name or it.device is None:
            continue
        il = int(name.split(".", 2)[1])
        if il < len(units) - 1 and it.device != units[il]:
            return False
    return True


def _row(n: int) -> int:
    return row_size(F32, n)


def _scale(a: T) -> T:
    return dup_op(a, "SCALE", a)


def _affine(x: T, scale: T, base: T) -> T:
    x = dup_op(x, "MUL", x, scale)
    return dup_op(x, "ADD", x, base)


def _hc_pre(b: Builder, g: Glm5, x: T, prefix: str) -> tuple[T, T, T]:
    """``build_hc_pre`` (fused): the block input, the post weights and the comb matrices."""
    hc, n_embd, nt = g.hc, x.ne[0], x.ne[2]
    flat = reshape(x, hc * n_embd, nt)
    mixes = mul_mat(b.req(f"{prefix}fn.weight"), dup_op(flat, "RMS_NORM", flat))
    sc, base = b.req(f"{prefix}scale.weight"), b.req(f"{prefix}base.weight")
    scale_pre, scale_post = view(sc, [1], [], 0), view(sc, [1], [], _row(1))
    base_pre, base_post = view(base, [hc], [], 0), view(base, [hc], [], _row(hc))
    pre = _affine(view(mixes, [hc, nt], [mixes.nb[1]], 0), scale_pre, base_pre)
    pre = _scale(_unary(pre))
    post = _affine(view(mixes, [hc, nt], [mixes.nb[1]], _row(hc)), scale_post, base_post)
    post = _scale(_unary(post))
    comb = dsv4_hc_comb(mixes, sc, base)
    return dsv4_hc_pre(x, pre), post, comb


# --- KDA ------------------------------------------------------------------------------------------


def _conv1d(b: Builder, g: Glm5, rs: _Rs, caches: tuple[T, T], qkv: int, x: T, w: T, conv_w: T) -> T:
    """``glm5_conv1d``: one of Q, K, V projected, convolved over its third of the conv row."""
    r_cache, state_all = caches
    dn, ns, nst = g.dn, rs.n_seqs, rs.n_seq_tokens
    d_conv, d_inner = dn.d_conv, dn.d_inner
    size = (d_conv - 1) * d_inner
    total = 3 * size
    sx = view(state_all, [d_conv - 1, d_inner, ns], [_row(d_conv - 1), _row(total)], _row(qkv * size))
    x3 = reshape(mul_mat(w, x), d_inner, nst, ns)
    conv_x = concat(sx, transpose(x3), 0)
    for s in range(rs.n_snap):
        src = view(conv_x, [d_conv - 1, d_inner, ns], [conv_x.nb[1], conv_x.nb[2]], max(0, nst - s) * 4)
        dst = view(r_cache, [d_conv - 1, d_inner, ns], [_row(d_conv - 1), _row(total)],
                   _row(s * rs.n_rs * total + qkv * size))
        b.g.expand(cpy(src, dst))
    out = ssm_conv(conv_x, reshape(conv_w, d_conv, d_inner))
    out = _unary(reshape(out, d_inner, b.n_tokens))
    return reshape(out, dn.d_state, dn.n_group, nst, ns)


def _kda_gate(b: Builder, g: Glm5, rs: _Rs, cur: T, il: int) -> T:
    dn, n_tok = g.dn, b.n_tokens
    g1 = mul_mat(b.req(f"blk.{il}.ssm_f_b.weight"), mul_mat(b.req(f"blk.{il}.ssm_f_a.weight"), cur))
    g1 = dup_op(g1, "ADD", g1, b.req(f"blk.{il}.ssm_dt.bias"))
    a = reshape(b.req(f"blk.{il}.ssm_a"), 1, dn.n_group, 1)
    if g.gate_lower_bound:
        g1 = reshape(g1, dn.d_state, dn.n_group, n_tok)
        g1 = dup_op(g1, "MUL", g1, a)
        g1 = _scale(_unary(_scale(g1)))
    else:
        g1 = reshape(_unary(g1), dn.d_state, dn.n_group, n_tok)
        g1 = dup_op(g1, "MUL", g1, a)
    return reshape(g1, dn.d_state, dn.n_group, rs.n_seq_tokens, rs.n_seqs)


def _kda_layer(b: Builder, g: Glm5, rs: _Rs, cur: T, il: int) -> T:
    """``build_kda_layer``."""
    dn, ns, n_tok = g.dn, rs.n_seqs, b.n_tokens
    dev = b.kv_dev(il)
    r_cache = _state_cache(f"cache_r_l{il}", dn.n_embd_r, rs.n_rs * rs.n_snap, dev)
    s_cache = _state_cache(f"cache_s_l{il}", dn.n_embd_s, rs.n_rs * rs.n_snap, dev)
    caches = (r_cache, _build_rs(b, rs, r_cache, dn.n_embd_r))
    q, k, v = (_conv1d(b, g, rs, caches, i, cur, b.req(f"blk.{il}.attn_{n}.weight"),
                       b.req(f"blk.{il}.ssm_conv1d_{n}.weight")) for i, n in enumerate("qkv"))
    gate = _kda_gate(b, g, rs, cur, il)
    beta = mul_mat(b.req(f"blk.{il}.ssm_beta.weight"), cur)
    beta = _unary(reshape(beta, 1, dn.n_group, rs.n_seq_tokens, ns))
    state = reshape(_build_rs(b, rs, s_cache, dn.n_embd_s), dn.d_state, dn.d_state, dn.n_group, ns)
    out = cont(_recurrent_attn(b, dn, rs, s_cache, _l2_norm(q), _l2_norm(k), v, gate, beta, state))
    g2 = mul_mat(b.req(f"blk.{il}.ssm_g_b.weight"), mul_mat(b.req(f"blk.{il}.ssm_g_a.weight"), cur))
    g2 = reshape(g2, dn.d_state, dn.n_group, n_tok)
    normed = b.norm(reshape(out, dn.d_state, dn.n_group, n_tok), b.lw(il, "ssm_norm.weight"), il)
    gated = cont(dup_op(normed, "MUL", normed, _unary(g2)), dn.d_inner, n_tok)
    return mul_mat(b.req(f"blk.{il}.attn_output.weight"), gated)


# --- the k-pool DSA layers ------------------------------------------------------------------------


@dataclass
class _KPool:
    k_idxs: T
    pool_cells: T
    pool_idxs: T
    pool_mask: T
    tail_idxs: T
    gather_mask: T
    new_pool_idxs: T
    new_pool_rep: T


def _inp_kpool(b: Builder, g: Glm5) -> _KPool:
    n_tok = b.n_tokens
    kp = _KPool(input_tensor(I64, [n_tok], "idx_inp_k_idxs"), input_tensor(I32, [g.n_pool], "pool_cells"),
                input_tensor(I32, [g.kpool, g.n_pool], "pool_idxs"),
                input_tensor(F16, [g.n_pool, n_tok], "pool_mask"),
                input_tensor(I32, [g.kpool - 1, n_tok], "tail_idxs"),
                input_tensor(F32, [g.n_sel, 1, 1, n_tok], "gather_mask"),
                input_tensor(I32, [g.kpool, g.n_new], "new_pool_idxs"),
                input_tensor(I64, [g.n_new], "new_pool_rep"))
    for t in (kp.pool_cells, kp.pool_idxs, kp.pool_mask, kp.tail_idxs, kp.gather_mask):
        b.g.expand(t)
    return kp


def _pooled_keys(b: Builder, g: Glm5, kp: _KPool, cache: T, il: int) -> T:
    """The fresh pools' gated keys (softmax over each pool's members), scattered; all pools gathered."""
    d, kpool, n_new, n_cells = g.idx_dim, g.kpool, g.n_new, cache.ne[1] * cache.ne[2]
    key_gate = view(cache, [2 * d, n_cells], [cache.nb[1]], 0)
    pooled_slot = view(cache, [d, n_cells], [cache.nb[1]], row_size(cache.type, 2 * d))
    rows = reshape(get_rows(key_gate, reshape(kp.new_pool_idxs, kpool * n_new)), 2 * d, kpool, n_new)
    pk = view(rows, [d, kpool, n_new], [rows.nb[1], rows.nb[2]], 0)
    pg = view(rows, [d, kpool, n_new], [rows.nb[1], rows.nb[2]], _row(d))
    logits = dup_op(pg, "ADD", pg, b.req(f"blk.{il}.indexer_compressor_ape.weight"))
    logits = cont(permute(logits, 1, 0, 2, 3))
    probs = reshape(logits, kpool, d * n_new)
    probs = reshape(dup_op(probs, "SOFT_MAX", probs, None, None), kpool, d, n_new)
    pk = cont(permute(pk, 1, 0, 2, 3))
    prod = dup_op(probs, "MUL", probs, pk)
    pooled = reshape(new(F32, [1, d, n_new], "SUM_ROWS", prod), d, n_new)
    b.g.expand(set_rows(pooled_slot, pooled, kp.new_pool_rep))
    return reshape(get_rows(pooled_slot, kp.pool_cells), d, 1, g.n_pool)


def _sel_idx(b: Builder, g: Glm5, kp: _KPool, cur: T, qr: T, il: int) -> T:
    """``build_kpool_select`` up to the selected cells ``[n_sel, n_tokens]``."""
    n_tok, d, n_top = b.n_tokens, g.idx_dim, g.n_top_pool
    iq = reshape(mul_mat(b.req(f"blk.{il}.indexer.attn_q_b.weight"), qr), d, g.n_idx_head, n_tok)
    ik = mul_mat(b.req(f"blk.{il}.indexer.attn_k.weight"), cur)
    ik = b.norm(ik, b.lw(il, "indexer.k_norm.weight"), il, b.lw(il, "indexer.k_norm.bias"), op="NORM")
    ig = mul_mat(b.req(f"blk.{il}.indexer_compressor_gate.weight"), cur)
    pzero = new(F32, [d, n_tok])
    packed = reshape(concat(concat(ik, ig, 0), dup_op(pzero, "FILL", pzero), 0), 3 * d, 1, n_tok)
    sh = b.sh
    cache = T(sh.type_k, [3 * d, sh.n_kv, sh.n_stream], name=f"cache_k_l{il}")
    cache.dev = b.kv_dev(il)
    b.g.expand(b.cpy_k(cache, packed, kp.k_idxs))
    pooled = _pooled_keys(b, g, kp, cache, il)
    w = _scale(mul_mat(b.req(f"blk.{il}.indexer.proj.weight"), cur))
    score = lightning_indexer(iq, pooled, w, kp.pool_mask)
    top = top_k(score, n_top)
    sel_score = get_rows(reshape(score, 1, g.n_pool, n_tok), top)
    sel_score = reshape(sel_score, n_top, n_tok)
    order = new(I32, sel_score.ne, "ARGSORT", sel_score)
    top_f = get_rows(reshape(cast(top, F32), 1, n_top, n_tok), order)
    top = cast(cont(reshape(top_f, n_top, n_tok)), I32)
    sel = reshape(get_rows(kp.pool_idxs, reshape(top, n_top * n_tok)), g.kpool * n_top, n_tok)
    return concat(sel, kp.tail_idxs, 0) if g.select_tail else sel


def _kpool_select(b: Builder, g: Glm5, kp: _KPool, cur: T, qr: T, il: int) -> T:
    """``build_kpool_select`` (scatter): the KQ mask with only the selected cells open."""
    n_tok, n_sel = b.n_tokens, g.n_sel
    kq_mask = b.kq_mask
    assert kq_mask is not None
    n_kv = kq_mask.ne[0]
    sel_idx = _sel_idx(b, g, kp, cur, qr, il)
    b.g.expand(sel_idx)
    mask_all = _fill_rows(kq_mask.type, n_kv + n_sel, n_tok)
    zeros = _fill_rows(kq_mask.type, n_sel, n_tok)
    live = _unary(reshape(kp.gather_mask, n_sel, n_tok))
    dump = new(F32, [n_sel], "ARANGE")
    idx_f = cast(sel_idx, F32)
    diff = dup_op(idx_f, "SUB", idx_f, dump)
    prod = dup_op(diff, "MUL", diff, live)
    idx_f = dup_op(prod, "ADD", prod, dump)
    sel = set_rows(mask_all, zeros, reshape(cast(idx_f, I32), n_sel, n_tok, 1))
    sel = view(sel, [n_kv, n_tok], [sel.nb[2]], 0)
    return dup_op(sel, "ADD", sel, reshape(kq_mask, n_kv, n_tok))


def _dsa_layer(b: Builder, g: Glm5, kp: _KPool, cur: T, prev: T | None, il: int) -> tuple[T, T]:
    """``build_dsa_layer`` (scatter): nope MLA over the selection; the selection for the next layer."""
    sh, n_tok = b.sh, b.n_tokens
    qr = b.norm(mul_mat(b.req(f"blk.{il}.attn_q_a.weight"), cur), b.lw(il, "attn_q_a_norm.weight"), il)
    q = reshape(mul_mat(b.req(f"blk.{il}.attn_q_b.weight"), qr), sh.head_k_mla, sh.n_head[il], n_tok)
    kv = mul_mat(b.req(f"blk.{il}.attn_kv_a_mqa.weight"), cur)
    kv = reshape(b.norm(kv, b.lw(il, "attn_kv_a_norm.weight"), il), sh.kv_lora_rank, 1, n_tok)
    qa = permute(mul_mat(b.req(f"blk.{il}.attn_k_b.weight"), permute(q, 0, 2, 1, 3)), 0, 2, 1, 3)
    sel = _kpool_select(b, g, kp, cur, qr, il) if g.indexer_full[il] or prev is None else prev
    b.g.expand(qa)
    b.g.expand(kv)
    ck, _ = b.cache(il, k_only=True)
    b.g.expand(b.cpy_k(ck, kv, b.k_idxs.get(False)))
    assert b.kq_mask is not None
    mask = reshape(sel, *b.kq_mask.ne)
    k = b.get_k(il, ck)
    v = view(k, [sh.kv_lora_rank, k.ne[1], k.ne[2], k.ne[3]], k.nb[1:4], 0)
    out = b.attn_mha(qa, k, v, mask, None, b.req(f"blk.{il}.attn_v_b.weight"))
    b.cb(out, "kqv_out", il)
    return mul_mat(b.req(f"blk.{il}.attn_output.weight"), out), sel


def _head(b: Builder, g: Glm5, x: T) -> None:
    """The output rows, the streams' mean, the final norm (``t_h_nextn`` and ``t_embd``), the logits."""
    n_embd = b.sh.n_embd
    assert b.out_ids is not None
    flat = get_rows(reshape(x, n_embd * g.hc, x.ne[2]), b.out_ids)
    x = reshape(flat, n_embd, g.hc, flat.ne[1])
    acc = view(x, [n_embd, x.ne[2]], [x.nb[2]], 0)
    for s in range(1, g.hc):
        acc = dup_op(acc, "ADD", acc, view(x, [n_embd, x.ne[2]], [x.nb[2]], s * x.nb[1]))
    cur = b.norm(_scale(acc), b.w("output_norm.weight"), -1)
    b.cb(cur, "result_norm", -1)
    cur.flags |= OUTPUT
    cur = b.cb(mul_mat(b.req("output.weight"), cur), "result_output", -1)
    cur.flags |= OUTPUT
    b.g.expand(cur)


def glm5_next_graph(b: Builder) -> None:
    """``llama_model_glm5_next::graph`` (the scatter selection: ``-ub`` > 16)."""
    sh, g = b.sh, b.sh.glm5
    if g is None or g.gather or sh.legacy_inputs or sh.kv_cpy_views:
        raise ValueError("the glm5-next graph is modelled on the pinned build's scatter selection")
    inp = b.inp_embd()
    n_rs = max(1, sh.n_seqs)
    rs = _Rs(input_tensor(I32, [n_rs], "rs_s_copy"), n_rs, sh.n_seqs, b.n_tokens // sh.n_seqs,
             g.dn.n_rs_seq + 1)
    b.build_inp_attn(k_only=True)
    kp = _inp_kpool(b, g)
    b.build_out_ids()
    x = repeat_4d(reshape(inp, sh.n_embd, 1, b.n_tokens), sh.n_embd, g.hc, b.n_tokens, 1)
    prev: T | None = None
    for il in range(sh.n_layer):
        residual = x
        cur, post, comb = _hc_pre(b, g, x, f"blk.{il}.hc_attn_")
        cur = b.norm(cur, b.lw(il, "attn_norm.weight"), il)
        b.g.expand(cur)
        if g.dn.recurrent[il]:
            cur = _kda_layer(b, g, rs, cur, il)
        else:
            cur, prev = _dsa_layer(b, g, kp, cur, prev, il)
        x = dsv4_hc_post(cur, residual, post, comb)
        residual = x
        cur, post, comb = _hc_pre(b, g, x, f"blk.{il}.hc_ffn_")
        cur = b.norm(cur, b.lw(il, "ffn_norm.weight"), il)
        cur = dense_lead_or_shared_moe(b, il, cur)
        x = b.cb(dsv4_hc_post(cur, residual, post, comb), "l_out", il)
    _head(b, g, x)
