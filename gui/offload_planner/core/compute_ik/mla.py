"""The self-attention of ik's ``build_deepseek2`` in every -mla mode (MLA: the latent cache, its per-head
expansion with flash attention, the absorbed-weights path, -amb chunking; -mla 0's standard cache)."""

from __future__ import annotations

from offload_planner.core.compute.ggml import F16, T, concat, mul_mat, permute, reshape, row_size
from offload_planner.core.compute_ik.builder import IkBuilder
from offload_planner.core.compute_ik.ops import cast, cont, cpy, dup, flash_attn, repeat, view2, view3


def deepseek2_attn(b: IkBuilder, il: int, cur: T) -> T:
    """The self-attention of ``build_deepseek2`` for every -mla mode."""
    sh = b.sh
    q_nope, q_rope, k_rope, kv_cmpr = _deepseek2_qkv(b, il, cur)
    assert b.kq_mask is not None
    if sh.mla == 0:
        return _deepseek2_std_attn(b, il, q_nope, q_rope, k_rope, kv_cmpr)
    kl, kv_trans = _deepseek2_cache_write(b, il, k_rope, kv_cmpr)
    if sh.mla > 1 and sh.flash_attn and b.n_tokens >= 128:
        cur = _deepseek2_fa_heads(b, il, kl, q_nope, q_rope)
    else:
        cur = _deepseek2_absorbed(b, il, kl, kv_trans, q_nope, q_rope)
    b.expand(cur)
    return mul_mat(b.req(f"blk.{il}.attn_output.weight"), cur)


def _deepseek2_qkv(b: IkBuilder, il: int, cur: T) -> tuple[T, T, T, T]:
    """Q (no-rope and rope parts), the roped K and the compressed KV of one layer."""
    sh = b.sh
    n_tok = b.n_tokens
    nh = sh.n_head[il]
    rope_d = sh.n_rot
    nope = sh.head_k - rope_d
    kvr = sh.kv_lora_rank
    if (wq := b.lw(il, "attn_q.weight")) is not None and b.lw(il, "attn_q_a.weight") is None:
        q = b.expand(mul_mat(wq, cur))
        kv_pe = b.expand(mul_mat(b.req(f"blk.{il}.attn_kv_a_mqa.weight"), cur))
    else:
        q = mul_mat(b.req(f"blk.{il}.attn_q_a.weight"), cur)
        kv_pe = mul_mat(b.req(f"blk.{il}.attn_kv_a_mqa.weight"), cur)
        b.expand(q)
        b.expand(kv_pe)
        q = b.norm(q, b.lw(il, "attn_q_a_norm.weight"))
        q = mul_mat(b.req(f"blk.{il}.attn_q_b.weight"), q)
    rs_q = row_size(q.type, sh.head_k)
    q_nope = view3(q, nope, nh, n_tok, rs_q, rs_q * nh, 0)
    q_rope = view3(q, rope_d, nh, n_tok, rs_q, rs_q * nh, row_size(q.type, nope))
    k_rope = view3(kv_pe, rope_d, 1, n_tok, kv_pe.nb[1], kv_pe.nb[1], row_size(kv_pe.type, kvr))
    kv_cmpr = view2(kv_pe, kvr, n_tok, kv_pe.nb[1], 0)
    b.expand(q_rope)
    b.expand(k_rope)
    q_rope = b.expand(b.rope(q_rope))
    k_rope = b.expand(b.rope(k_rope))
    kv_cmpr = b.norm(kv_cmpr, b.lw(il, "attn_kv_a_norm.weight"))
    return q_nope, q_rope, k_rope, kv_cmpr


def _deepseek2_cache_write(b: IkBuilder, il: int, k_rope: T, kv_cmpr: T) -> tuple[T, T | None]:
    """Copy this batch into the MLA cache: the K cache (and -mla 1's transposed V without FA)."""
    sh = b.sh
    n_tok = b.n_tokens
    rope_d = sh.n_rot
    kvr = sh.kv_lora_rank
    tk, tv = sh.type_k, sh.type_v
    k_type = tv if sh.mla >= 2 and not sh.flash_attn else tk
    kl = b.kv_tensor("k", il, k_type, kvr + rope_d)
    kv_trans = None
    if sh.mla == 1 and not sh.flash_attn:
        vl = b.kv_tensor("v", il, tv, kvr)
        vrow = row_size(tv, sh.n_kv)
        tview = view2(vl, n_tok, kvr, vrow, row_size(tv, sh.n_kv - n_tok))
        b.expand(cpy(permute(kv_cmpr, 1, 0, 2, 3), tview))
        kv_trans = view2(vl, sh.n_kv, kvr, vrow, 0)
    kvr_t = concat(permute(k_rope, 0, 2, 1, 3), kv_cmpr, 0)
    rs_c = row_size(kl.type, kvr + rope_d)
    b.expand(cpy(kvr_t, view2(kl, kl.ne[0], n_tok, rs_c, rs_c * (sh.n_kv - n_tok))))
    return kl, kv_trans


def _deepseek2_heads_per_step(b: IkBuilder, wkv_b: T, nh: int) -> int:
    """How many heads -amb lets one step of the FA prompt path expand at once."""
    sh = b.sh
    kv_f32_mib = wkv_b.ne[1] * sh.n_kv * 4 // (1024 * 1024)
    if sh.attn_max_batch <= 0 or kv_f32_mib <= sh.attn_max_batch:
        return nh
    for niter in range(2, nh):
        if nh % niter == 0 and kv_f32_mib // niter <= sh.attn_max_batch:
            return nh // niter
    return 1


def _mla_dims(b: IkBuilder, il: int) -> tuple[int, int, int, int, T]:
    """Layer ``il``'s heads, rope and no-rope dimensions of a K head, the KV LoRA rank, and the KQ mask."""
    sh, mask = b.sh, b.kq_mask
    assert mask is not None
    return sh.n_head[il], sh.n_rot, sh.head_k - sh.n_rot, sh.kv_lora_rank, mask


def _deepseek2_fa_heads(b: IkBuilder, il: int, kl: T, q_nope: T, q_rope: T) -> T:
    """-mla 2/3 with flash attention on a prompt batch: K and V expanded from the cache per head group."""
    sh, n_tok = b.sh, b.n_tokens
    nh, rope_d, nope, kvr, mask = _mla_dims(b, il)
    kv_nope = view2(kl, kvr, sh.n_kv, kl.nb[1], row_size(kl.type, rope_d))
    wkv_b = b.req(f"blk.{il}.attn_kv_b.weight")
    n_max_head = _deepseek2_heads_per_step(b, wkv_b, nh)
    n_per_head = wkv_b.ne[1] // nh
    kv_rope = view3(kl, rope_d, sh.n_kv, 1, kl.nb[1], kl.nb[2], 0)
    kv_type = kl.type if sh.cpu_only else F16
    rep = [rope_d, sh.n_kv, n_max_head]
    k_rope_r = repeat(kv_rope, rep) if kv_rope.type is kv_type else repeat(cast(kv_rope, F16), rep)
    qc = b.expand(permute(concat(q_rope, q_nope, 0), 0, 2, 1, 3))
    v_full = sh.head_v
    out: T | None = None
    for it in range(nh // n_max_head):
        wv = view2(wkv_b, wkv_b.ne[0], n_per_head * n_max_head, wkv_b.nb[1],
                   wkv_b.nb[1] * n_per_head * n_max_head * it)
        kv_f32 = mul_mat(wv, kv_nope)
        stride = row_size(kv_f32.type, n_max_head * (nope + v_full))
        per = row_size(kv_f32.type, nope + v_full)
        v_f32 = view3(kv_f32, v_full, sh.n_kv, n_max_head, stride, per, row_size(kv_f32.type, nope))
        k_nope_f32 = view3(kv_f32, nope, sh.n_kv, n_max_head, stride, per, 0)
        v = cast(v_f32, kv_type)
        k_nope = cast(k_nope_f32, kv_type)
        b.expand(k_nope)
        b.expand(v)
        k = b.expand(concat(k_rope_r, k_nope, 0))
        q_it = view3(qc, qc.ne[0], qc.ne[1], n_max_head, qc.nb[1], qc.nb[2], qc.nb[2] * n_max_head * it)
        kqv = flash_attn(q_it, k, v, mask)
        r = reshape(kqv, sh.head_v * n_max_head, n_tok)
        out = r if out is None else concat(out, r, 0)
        if sh.mla_fa_steps_expanded:
            b.expand(out)
    assert out is not None
    return out


def _deepseek2_absorbed(b: IkBuilder, il: int, kl: T, kv_trans: T | None, q_nope: T, q_rope: T) -> T:
    """The absorbed-weights path: attention over the compressed cache, then attn_v_b."""
    sh = b.sh
    nh, rope_d, nope, kvr, mask = _mla_dims(b, il)
    rs_c = row_size(kl.type, kvr + rope_d)
    kv_cache = view2(kl, kvr + rope_d, sh.n_kv, rs_c, 0)
    wk_b = b.req(f"blk.{il}.attn_k_b.weight")
    if wk_b.ne[1] != kvr:
        wk_b = reshape(wk_b, nope, kvr, nh)
    q_nope2 = mul_mat(wk_b, permute(q_nope, 0, 2, 1, 3))
    qq = concat(permute(q_rope, 0, 2, 1, 3), q_nope2, 0)
    if sh.flash_attn and sh.mla in (1, 3):
        lora = view2(kl, kvr, sh.n_kv, rs_c, row_size(kl.type, rope_d))
        kqv_c = permute(flash_attn(qq, kv_cache, lora, mask), 0, 2, 1, 3)
    else:
        if sh.mla > 1:
            lora = view2(kl, kvr, sh.n_kv, rs_c, row_size(kl.type, rope_d))
            kv_trans = cont(permute(lora, 1, 0, 2, 3))
        assert kv_trans is not None
        kqv_c = _deepseek2_kq(b, kv_cache, kv_trans, qq, mask)
    wv_b = b.req(f"blk.{il}.attn_v_b.weight")
    if wv_b.ne[1] != sh.head_v:
        wv_b = reshape(wv_b, kvr, sh.head_v, nh)
    kqv = mul_mat(wv_b, kqv_c)
    if b.n_tokens > 1:
        kqv = cont(permute(kqv, 0, 2, 1, 3))
    return reshape(kqv, sh.head_v * nh, b.n_tokens)


def _deepseek2_kq(b: IkBuilder, kv_cache: T, kv_trans: T, qq: T, mask: T) -> T:
    """KQ, softmax and KQV without flash attention; in -amb sized head chunks when KQ is larger."""
    sh = b.sh
    pp_opt = b.n_tokens >= 128
    kq_mib = kv_cache.ne[1] * qq.ne[1] * qq.ne[2] * 4 // (1024 * 1024)
    if sh.attn_max_batch <= 0 or sh.attn_max_batch >= kq_mib:
        if not pp_opt:
            qq = permute(qq, 0, 2, 1, 3)
        kq = mul_mat(kv_cache, qq)
        if not pp_opt:
            kq = cont(permute(kq, 0, 2, 1, 3))
        kq = dup(kq, "SOFT_MAX", kq, mask)
        if not pp_opt:
            kq = permute(kq, 0, 2, 1, 3)
        kqv_c = mul_mat(kv_trans, kq)
        return permute(kqv_c, 0, 2, 1, 3) if not pp_opt else kqv_c
    n_step = min(-(-kq_mib // sh.attn_max_batch), qq.ne[2])
    n_per = -(-qq.ne[2] // n_step)
    acc: T | None = None
    for i in range(0, qq.ne[2], n_per):
        ne12 = min(n_per, qq.ne[2] - i)
        q_i = view3(qq, qq.ne[0], qq.ne[1], ne12, qq.nb[1], qq.nb[2], qq.nb[2] * i)
        kq_i = mul_mat(kv_cache, q_i)
        kq_i = dup(kq_i, "SOFT_MAX", kq_i, mask)
        kqv_i = mul_mat(kv_trans, kq_i)
        acc = kqv_i if acc is None else concat(acc, kqv_i, 2)
        b.expand(acc)
    assert acc is not None
    return acc


def _deepseek2_std_attn(b: IkBuilder, il: int, q_nope: T, q_rope: T, k_rope: T, kv_cmpr: T) -> T:
    """-mla 0: K and V of every head from ``attn_kv_b``, the standard cache and attention."""
    sh = b.sh
    n_tok, nh = b.n_tokens, sh.n_head[il]
    nope, hv = sh.head_k - sh.n_rot, sh.head_v
    kv = mul_mat(b.req(f"blk.{il}.attn_kv_b.weight"), kv_cmpr)
    per, stride = row_size(kv.type, nope + hv), row_size(kv.type, (nope + hv) * nh)
    k_nope = view3(kv, nope, nh, n_tok, per, stride, 0)
    v_states = cont(view3(kv, hv, nh, n_tok, per, stride, row_size(kv.type, nope)))
    v_states = view2(v_states, hv * nh, n_tok, row_size(kv.type, hv * nh), 0)
    q_states = concat(q_nope, q_rope, 0)
    k_states = concat(k_nope, repeat(k_rope, list(q_rope.ne)), 0)
    return b.kv_attn(il, b.req(f"blk.{il}.attn_output.weight"), None, k_states, v_states, q_states)
