"""The graph of each supported architecture (``src/models/*.cpp``)."""

from __future__ import annotations

import math
from collections.abc import Callable

from offload_planner.core.compute.archs_deltanet import delta_net_graph
from offload_planner.core.compute.archs_glm5_next import glm5_next_graph
from offload_planner.core.compute.archs_qwen4exp import qwen4exp_graph
from offload_planner.core.compute.blocks import dense_lead_or_shared_moe
from offload_planner.core.compute.dsa import dsa_graph
from offload_planner.core.compute.ggml import (
    OUTPUT,
    T,
    concat,
    cont,
    dup_op,
    mul_mat,
    permute,
    reshape,
    row_size,
    view,
)
from offload_planner.core.compute.graph import Builder

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
        cur = glm4moe_attention(b, il, inp)
        if il == sh.n_layer - 1:
            cur, inp_sa = b.out_rows(cur, inp_sa)
        ffn_inp = dup_op(cur, "ADD", cur, inp_sa)
        cur = b.norm(ffn_inp, b.lw(il, "post_attention_norm.weight"), il)
        cur = dense_lead_or_shared_moe(b, il, cur)
        inp = b.cb(dup_op(cur, "ADD", cur, ffn_inp), "l_out", il)
    b.head(inp)


def glm4moe_attention(b: Builder, il: int, inp: T) -> T:
    """GLM-4.x self-attention of layer ``il`` (trunk and NextN): norm, QKV (optional Q/K norms),
    rope, attention and its output projection."""
    cur = b.norm(inp, b.lw(il, "attn_norm.weight"), il)
    q, k, v = b.qkv(il, cur, b.sh.head_v)
    if (qn := b.lw(il, "attn_q_norm.weight")) is not None:
        q = b.norm(q, qn, il)
    if (kn := b.lw(il, "attn_k_norm.weight")) is not None:
        k = b.norm(k, kn, il)
    q, k = b.rope(q), b.rope(k)
    return b.attn(il, b.lw(il, "attn_output.weight"), None, q, k, v)


def mla_attention(b: Builder, il: int, cur: T) -> T:
    """DeepSeek-V3's MLA attention block on the normed input (q through the q LoRA when present, the
    compressed KV with its rope part, the absorbed k_b; only K is cached)."""
    sh, n_tok = b.sh, b.n_tokens
    hk, rope_d = sh.head_k_mla, sh.n_rot
    nope, kvr = hk - rope_d, sh.kv_lora_rank
    nh = sh.n_head[il]
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
    return b.attn_k(il, b.req(f"blk.{il}.attn_output.weight"), qcur, kcur, kv_cmpr,
                    b.req(f"blk.{il}.attn_v_b.weight"))


def _deepseek2(b: Builder) -> None:
    sh = b.sh
    inp = b.inp_embd()
    b.build_inp_pos()
    b.build_inp_attn(k_only=True)
    b.build_out_ids()
    for il in range(sh.n_layer):
        inp_sa = inp
        cur = b.norm(inp, b.lw(il, "attn_norm.weight"), il)
        cur = mla_attention(b, il, cur)
        if il == sh.n_layer - 1:
            cur, inp_sa = b.out_rows(cur, inp_sa)
        ffn_inp = dup_op(cur, "ADD", cur, inp_sa)
        cur = b.norm(ffn_inp, b.lw(il, "ffn_norm.weight"), il)
        cur = dense_lead_or_shared_moe(b, il, cur)
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
        if sh.kv_cpy_views:  # builds before b6050 (llama.cpp-2025-early): ggml_cont of each 2-D view
            q, k, v = (reshape(cont(t, t.ne[0] * t.ne[1], n_tok), t.ne[0], t.ne[1], n_tok) for t in (q, k, v))
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


__all__ = ["ARCH_GRAPHS", "dense_lead_or_shared_moe", "glm4moe_attention", "mla_attention"]

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
    "deepseek32": dsa_graph,
    "glm-dsa": dsa_graph,
    "qwen3next": delta_net_graph,
    "qwen35": delta_net_graph,
    "qwen35moe": delta_net_graph,
    "qwen4exp": qwen4exp_graph,
    "glm5-next": glm5_next_graph,
}


