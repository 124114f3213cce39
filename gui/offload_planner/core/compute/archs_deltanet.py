"""The gated-delta-net hybrids' graphs: Qwen3-Next (``src/models/qwen3next.cpp``), Qwen3.5 dense and MoE
(``qwen35.cpp``, ``qwen35moe.cpp``), with ``delta-net-base.cpp`` and the recurrent-state helpers of
``llama-graph.cpp`` (``build_inp_mem_hybrid``, ``build_rs``).

Every ``full_attention_interval``-th trunk layer attends (its Q projection doubled by an output gate,
Q/K norms, rope, the KV cache), the others are a gated delta net: the QKV projection convolved over the
layer's conv state (``build_conv_state``: the state rows gathered by ``s_copy``, concatenated with the
ubatch, ``ssm_conv``, the last ``d_conv - 1`` columns copied back), L2-normed Q and K, the delta-net
state gathered the same way and run through ``ggml_gated_delta_net`` (the pinned build sets
``fused_gdn_ar`` and ``fused_gdn_ch`` and never probes them, so both reserves use the fused op; the
chunked and autoregressive ggml paths are not built), its new state copied back, the output
RMS-normed and gated by ``silu(z)``.  The reserve's memory context is the full one: ``n_rs`` =
``max(1, n_seq_max)`` cells, head 0, ``rs_z`` 0; with rollback snapshots (``n_rs_seq`` > 0: a
draft-mtp / eagle3 / dflash / dspark draft on qwen35 / qwen35moe) the cache holds ``n_rs_seq + 1``
slots of rows, the conv state is copied back once per slot and the fused op writes that many states.

The final norm runs over every token (``t_h_nextn``, kept) before the output rows are selected
(``embeddings_nextn_masked`` is false in a server context).

Measured (``tests/integration/test_deltanet_compute_vs_llama.py``, ``test_compute_vs_llama.py``,
``test_fit_vs_llama.py``): the synth models on llama-server with RPC devices, every compute buffer and
the node and split counts equal; the full-size Qwen3-Next-80B-A3B and Qwen3.5-397B-A17B headers equal
``llama-fit-params``' dry runs.  Not modelled (the scheduler has no ``supports_op``): a backend that
cannot run one of these ops sends it to the CPU in llama.cpp; CUDA runs ``SSM_CONV`` only with conv
channels a multiple of 128 and Metal ``GATED_DELTA_NET`` only with a value head size a multiple of 32,
which every published model meets (Qwen3-Next: 8192 channels, heads of 128).  Files with the experts'
gate and up fused (``ffn_gate_up_exps``, convert's opt-in ``--fuse-gate-up-exps``) are not built
(the estimate, saying so).
"""

from __future__ import annotations

from dataclasses import dataclass

from offload_planner.core.compute.deltanet_shape import MROPE_ARCHS, DeltaNet
from offload_planner.core.compute.ggml import (
    F32,
    I32,
    OUTPUT,
    T,
    concat,
    cont,
    cpy,
    dup_op,
    gated_delta_net,
    get_rows,
    input_tensor,
    mul_mat,
    repeat_4d,
    reshape,
    row_size,
    ssm_conv,
    transpose,
    view,
    view_tensor,
)
from offload_planner.core.compute.graph import Builder


@dataclass
class _Rs:
    """``llm_graph_input_rs`` of a reserve and the ubatch's split: sequences and tokens per sequence."""

    s_copy: T
    n_rs: int  # cells (``mem_size``): one per sequence
    n_seqs: int
    n_seq_tokens: int
    n_snap: int  # ``n_rs_seq + 1``: the state slots a ubatch writes (the current one, then snapshots)


def _unary(a: T) -> T:
    """``ggml_silu`` / ``ggml_sigmoid`` / ``ggml_softplus``: a contiguous copy of ``a``'s shape."""
    return dup_op(a, "UNARY", a)


def _row(n: int) -> int:
    return row_size(F32, n)


def delta_net_graph(b: Builder) -> None:
    """qwen3next, qwen35 and qwen35moe (``llama_model_*::graph``)."""
    sh, dn = b.sh, b.sh.delta
    if dn is None or sh.legacy_inputs or sh.kv_cpy_views:
        raise ValueError("the delta-net graph is modelled on the pinned build (fused gated delta net)")
    inp = b.inp_embd()
    n_rs = max(1, sh.n_seqs)
    rs = _Rs(input_tensor(I32, [n_rs], "rs_s_copy"), n_rs, sh.n_seqs, b.n_tokens // sh.n_seqs,
             dn.n_rs_seq + 1)
    b.build_inp_attn()
    n_pos = 4 if sh.arch in MROPE_ARCHS else 1
    b.inp_pos = input_tensor(I32, [b.n_tokens * n_pos], "inp_pos")
    b.build_out_ids()
    for il in range(sh.n_layer):
        inp_sa = inp
        cur = b.norm(inp, b.lw(il, "attn_norm.weight"), il)
        b.g.expand(cur)
        if dn.recurrent[il]:
            cur = _linear_attn(b, dn, rs, cur, il)
        else:  # Qwen3-Next's trunk reshapes Q and its gate to 4-D first
            cur = gated_attention(b, cur, il, views_4d=sh.arch == "qwen3next")
        cur = dup_op(cur, "ADD", cur, inp_sa)
        ffn_residual = cur
        cur = b.norm(cur, b.lw(il, "post_attention_norm.weight"), il)
        cur = hybrid_ffn(b, cur, il)
        inp = b.cb(dup_op(cur, "ADD", cur, ffn_residual), "l_out", il)
    _head(b, inp)


def _head(b: Builder, cur: T) -> None:
    """The final norm over every token (``t_h_nextn``), the output rows (``t_embd``), the logits."""
    cur = b.norm(cur, b.w("output_norm.weight"), -1)
    cur.flags |= OUTPUT
    assert b.out_ids is not None
    cur = b.cb(get_rows(cur, b.out_ids), "result_norm", -1)
    cur.flags |= OUTPUT
    cur = b.cb(mul_mat(b.req("output.weight"), cur), "result_output", -1)
    cur.flags |= OUTPUT
    b.g.expand(cur)


# --- the FFN --------------------------------------------------------------------------------------


def hybrid_ffn(b: Builder, cur: T, il: int) -> T:
    """Dense (qwen35), or routed experts plus the sigmoid-gated shared expert."""
    if b.lw(il, "ffn_gate_inp.weight") is None:
        return b.ffn(cur, b.req(f"blk.{il}.ffn_up.weight"), b.lw(il, "ffn_gate.weight"),
                     b.req(f"blk.{il}.ffn_down.weight"))
    moe_out = b.moe(cur, il)
    if b.lw(il, "ffn_up_shexp.weight") is None:
        return moe_out
    shexp = b.ffn(cur, b.req(f"blk.{il}.ffn_up_shexp.weight"), b.lw(il, "ffn_gate_shexp.weight"),
                  b.req(f"blk.{il}.ffn_down_shexp.weight"))
    gate = _unary(mul_mat(b.req(f"blk.{il}.ffn_gate_inp_shexp.weight"), cur))
    shexp = dup_op(shexp, "MUL", shexp, gate)
    return dup_op(moe_out, "ADD", moe_out, shexp)


# --- the gated full-attention layers ----------------------------------------------------------------


def _qkv_flat(b: Builder, il: int, cur: T, n_q: int, n_k: int, n_v: int) -> tuple[T, T, T]:
    """``build_qkv(..., reshape=false)``: the fused projection's views made contiguous, or Q, K, V."""
    wqkv = b.lw(il, "attn_qkv.weight")
    if wqkv is None:
        return (b.mm(b.req(f"blk.{il}.attn_q.weight"), cur, b.lw(il, "attn_q.bias")),
                b.mm(b.req(f"blk.{il}.attn_k.weight"), cur, b.lw(il, "attn_k.bias")),
                b.mm(b.req(f"blk.{il}.attn_v.weight"), cur, b.lw(il, "attn_v.bias")))
    qkv = b.mm(wqkv, cur, b.lw(il, "attn_qkv.bias"))
    n_tok, nb1 = qkv.ne[1], qkv.nb[1]
    return (cont(view(qkv, [n_q, n_tok], [nb1], 0)), cont(view(qkv, [n_k, n_tok], [nb1], _row(n_q))),
            cont(view(qkv, [n_v, n_tok], [nb1], _row(n_q + n_k))))


def gated_attention(b: Builder, cur: T, il: int, *, views_4d: bool) -> T:
    """``build_layer_attn`` (and the MTP block's attention): Q and its gate from one projection, Q/K
    norms, rope, attention, the sigmoid gate, the output projection.  ``views_4d``: Q and the gate
    are views of the projection reshaped to 4-D (Qwen3-Next's trunk), else 3-D views of it."""
    sh, n_tok = b.sh, b.n_tokens
    hd, nh, nkv = sh.head_k, sh.n_head[il], sh.n_head_kv[il]
    q_full, k, v = _qkv_flat(b, il, cur, hd * 2 * nh, hd * nkv, sh.head_v * nkv)
    if views_4d:
        q_full = reshape(q_full, hd * 2, nh, n_tok, 1)
        nb = q_full.nb[1:4]
        q = view(q_full, [hd, nh, n_tok, 1], nb, 0)
        gate = view(q_full, [hd, nh, n_tok, 1], nb, _row(hd))
    else:
        nb = [_row(hd * 2), _row(hd * 2 * nh)]
        q = view(q_full, [hd, nh, n_tok], nb, 0)
        gate = view(q_full, [hd, nh, n_tok], nb, _row(hd))
    k = reshape(k, hd, nkv, n_tok)
    v = reshape(v, sh.head_v, nkv, n_tok)
    q = b.rope(b.norm(q, b.lw(il, "attn_q_norm.weight"), il))
    k = b.rope(b.norm(k, b.lw(il, "attn_k_norm.weight"), il))
    cur = b.attn(il, None, None, q, k, v)
    gate = _unary(cont(gate, hd * nh, n_tok))
    cur = dup_op(cur, "MUL", cur, gate)
    return mul_mat(b.req(f"blk.{il}.attn_output.weight"), cur)


# --- the gated delta net layers ---------------------------------------------------------------------


def _linear_attn(b: Builder, dn: DeltaNet, rs: _Rs, cur: T, il: int) -> T:
    """``build_layer_attn_linear``."""
    ns, nst = rs.n_seqs, rs.n_seq_tokens
    hk, n_kh, n_vh = dn.d_state, dn.n_group, dn.dt_rank
    hv = dn.d_inner // n_vh
    qkv_mixed, z = _qkvz(b, dn, rs, cur, il)
    beta, gate = _beta_gate(b, dn, rs, cur, il)
    dev = b.kv_dev(il)
    r_cache = _state_cache(f"cache_r_l{il}", dn.n_embd_r, rs.n_rs * rs.n_snap, dev)
    s_cache = _state_cache(f"cache_s_l{il}", dn.n_embd_s, rs.n_rs * rs.n_snap, dev)
    kernel = b.req(f"blk.{il}.ssm_conv1d.weight")
    conv_input = _conv_state(b, dn, rs, r_cache, qkv_mixed, kernel.ne[0])
    state = reshape(_build_rs(b, rs, s_cache, dn.n_embd_s), hv, hv, n_vh, ns)
    conv = _unary(ssm_conv(conv_input, kernel))
    nb1 = _row(2 * hk * n_kh + hv * n_vh)
    q = view(conv, [hk, n_kh, nst, ns], [_row(hk), nb1, nb1 * nst], 0)
    k = view(conv, [hk, n_kh, nst, ns], [_row(hk), nb1, nb1 * nst], _row(hk * n_kh))
    v = view(conv, [hv, n_vh, nst, ns], [_row(hv), nb1, nb1 * nst], _row(2 * hk * n_kh))
    q, k = _l2_norm(q), _l2_norm(k)
    if b.sh.arch == "qwen3next" and n_kh != n_vh:  # Qwen3.5 leaves the broadcast to the fused op
        q, k = _repeat_heads(q, n_vh // n_kh), _repeat_heads(k, n_vh // n_kh)
    out = _recurrent_attn(b, dn, rs, s_cache, q, k, v, gate, beta, state)
    z = reshape(z, hv, n_vh, nst, ns)
    normed = b.norm(out, b.lw(il, "ssm_norm.weight"), il)
    cur = dup_op(normed, "MUL", normed, _unary(z))
    cur = mul_mat(b.req(f"blk.{il}.ssm_out.weight"), reshape(cur, hv * n_vh, nst, ns))
    return reshape(cur, b.sh.n_embd, nst * ns)


def _state_cache(name: str, width: int, n_rows: int, dev: str) -> T:
    """``cache_r_l*`` / ``cache_s_l*``: f32 rows of the recurrent memory on the layer's device (the
    CPU with -nkvo): a row per cell and snapshot slot."""
    t = T(F32, [width, n_rows], name=name)
    t.dev = dev
    return t


def _l2_norm(x: T) -> T:
    """``build_gdn_l2_norm``: ``ggml_scale(ggml_rms_norm(x))``."""
    return dup_op(dup_op(x, "RMS_NORM", x), "SCALE")


def _repeat_heads(x: T, factor: int) -> T:
    """Qwen3-Next's repeat-interleave of the key heads up to the value heads."""
    hk, n_kh, nst, ns = x.ne
    rep = repeat_4d(reshape(x, hk, 1, n_kh, nst * ns), hk, factor, n_kh, nst * ns)
    return reshape(rep, hk, n_kh * factor, nst, ns)


def _qkvz(b: Builder, dn: DeltaNet, rs: _Rs, cur: T, il: int) -> tuple[T, T]:
    """``build_qkvz``: the convolved QKV rows ``[conv_dim, n_seq_tokens, n_seqs]`` and the gate z."""
    ns, nst = rs.n_seqs, rs.n_seq_tokens
    wqkv = b.lw(il, "attn_qkv.weight")
    if wqkv is not None or b.sh.arch != "qwen3next":
        qkv = mul_mat(b.req(f"blk.{il}.attn_qkv.weight"), cur)
        return reshape(qkv, qkv.ne[0], nst, ns), mul_mat(b.req(f"blk.{il}.attn_gate.weight"), cur)
    # legacy Qwen3-Next files: one ssm_in projection split per key head
    hk, n_kh, n_vh = dn.d_state, dn.n_group, dn.dt_rank
    hv_k = dn.d_inner // n_vh * (n_vh // n_kh)  # value (and z) columns per key head
    mixed = mul_mat(b.req(f"blk.{il}.ssm_in.weight"), cur)
    r = reshape(mixed, 2 * hk + 2 * hv_k, n_kh, nst, ns)
    nb = r.nb[1:4]
    query = view(r, [hk, n_kh, nst, ns], nb, 0)
    key = view(r, [hk, n_kh, nst, ns], nb, _row(hk))
    value = view(r, [hv_k, n_kh, nst, ns], nb, _row(2 * hk))
    z = cont(view(r, [hv_k, n_kh, nst, ns], nb, _row(2 * hk + hv_k)))
    qkv = concat(cont(query, hk * n_kh, nst, ns), cont(key, hk * n_kh, nst, ns), 0)
    return concat(qkv, cont(value, hv_k * n_kh, nst, ns), 0), z


def _beta_gate(b: Builder, dn: DeltaNet, rs: _Rs, cur: T, il: int) -> tuple[T, T]:
    """beta (sigmoid) and the decay gate (``softplus(alpha + dt_bias) * A``), both ``[1, n_v_heads,
    n_seq_tokens, n_seqs]``: from Qwen3-Next's fused ``ssm_ba`` or Qwen3.5's ``ssm_beta`` / ``ssm_alpha``."""
    ns, nst = rs.n_seqs, rs.n_seq_tokens
    n_kh, n_vh = dn.n_group, dn.dt_rank
    if b.sh.arch == "qwen3next":
        per = n_vh // n_kh
        r = reshape(mul_mat(b.req(f"blk.{il}.ssm_ba.weight"), cur), 2 * per, n_kh, nst, ns)
        nb = r.nb[1:4]
        beta = reshape(_unary(cont(view(r, [per, n_kh, nst, ns], nb, 0))), 1, n_vh, nst, ns)
        alpha = cont(view(r, [per, n_kh, nst, ns], nb, _row(per)), n_vh, nst, ns)
    else:
        beta = _unary(reshape(mul_mat(b.req(f"blk.{il}.ssm_beta.weight"), cur), 1, n_vh, nst, ns))
        alpha = reshape(mul_mat(b.req(f"blk.{il}.ssm_alpha.weight"), cur), n_vh, nst, ns)
    alpha = _unary(dup_op(alpha, "ADD", alpha, b.req(f"blk.{il}.ssm_dt.bias")))
    gate = dup_op(alpha, "MUL", alpha, b.req(f"blk.{il}.ssm_a"))
    return beta, reshape(gate, 1, n_vh, nst, ns)


def _build_rs(b: Builder, rs: _Rs, s: T, state_size: int) -> T:
    """``build_rs`` on the full memory context: the zeroed state (in place), the gather of every row by
    ``s_copy``, the ubatch's rows, and the copy-back of the extra rows (none: ``n_rs == n_seqs``)."""
    states = reshape(s, state_size, s.ne[1])
    b.g.expand(view_tensor(view(states, [state_size], [], 0), "SCALE"))
    states_all = get_rows(states, rs.s_copy)
    out = view(states_all, [state_size, rs.n_seqs], [states_all.nb[1]], 0)
    b.g.expand(out)
    n_extra, nb1 = rs.n_rs - rs.n_seqs, states_all.nb[1]
    extra = view(states_all, [state_size, n_extra], [nb1], rs.n_seqs * nb1)
    b.g.expand(cpy(extra, view(s, [state_size, n_extra], [s.nb[1]], rs.n_seqs * s.nb[1])))
    return out


def _conv_state(b: Builder, dn: DeltaNet, rs: _Rs, r_cache: T, qkv_mixed: T, d_conv: int) -> T:
    """``build_conv_state``: the conv state rows then the ubatch's (transposed), and the last
    ``d_conv - 1`` columns copied back to the cache (with rollback snapshots: the columns ending at
    each of the last ``n_snap`` tokens, into slot ``n_snap - t``)."""
    ns, channels = rs.n_seqs, dn.conv_channels
    states = reshape(_build_rs(b, rs, r_cache, dn.n_embd_r), d_conv - 1, channels, ns)
    conv_input = concat(states, transpose(qkv_mixed), 0)
    row_count = (d_conv - 1) * channels
    k = rs.n_snap
    for t in range(1, k + 1):
        s_idx = max(0, rs.n_seq_tokens - k + t)  # (k == 1: the ubatch's last d_conv - 1 columns)
        last = view(conv_input, [d_conv - 1, channels, ns], [conv_input.nb[1], conv_input.nb[2]],
                    _row(s_idx))
        update = view(r_cache, [row_count, ns], [r_cache.nb[1]], (k - t) * rs.n_rs * _row(row_count))
        b.g.expand(cpy(last, update))
    return conv_input


def _recurrent_attn(b: Builder, dn: DeltaNet, rs: _Rs, s_cache: T, q: T, k: T, v: T, gate: T, beta: T,
                    state: T) -> T:
    """``build_recurrent_attn``: the fused op, its output view, the new state (with rollback snapshots:
    the last ``min(n_seq_tokens, n_snap)`` states, one slot each) copied back to the cache."""
    ns, nst, n_snap = rs.n_seqs, rs.n_seq_tokens, rs.n_snap
    s_v, h_v = v.ne[0], v.ne[1]
    res = gated_delta_net(q, k, v, gate, beta, state, n_snap)
    out = view(res, [s_v, h_v, nst, ns], [_row(s_v), _row(s_v * h_v), _row(s_v * h_v * nst)], 0)
    if n_snap == 1:
        src = view(res, [s_v, s_v, h_v, ns], [_row(s_v), _row(s_v * s_v), _row(s_v * s_v * h_v)],
                   _row(s_v * h_v * nst * ns))
        b.g.expand(cpy(src, view(s_cache, [dn.n_embd_s, ns], [s_cache.nb[1]], 0)))
        return out
    d, n_written = s_v * s_v * h_v, min(nst, n_snap)
    src = view(res, [d, ns, n_written], [_row(d), _row(d * ns)], _row(s_v * h_v * nst * ns))
    dst = view(s_cache, [d, ns, n_written], [s_cache.nb[1], rs.n_rs * _row(dn.n_embd_s)], 0)
    b.g.expand(cpy(src, dst))
    return out
