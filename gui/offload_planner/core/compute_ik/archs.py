"""ik's graph of each supported architecture (``src/llama-build-context.cpp``), and its MTP graphs."""

from __future__ import annotations

from collections.abc import Callable

from offload_planner.core.compute.ggml import F32, I32, OUTPUT, concat, get_rows, input_tensor, mul_mat
from offload_planner.core.compute_ik.builder import IkBuilder
from offload_planner.core.compute_ik.mla import deepseek2_attn
from offload_planner.core.compute_ik.ops import dup


def _deepseek2(b: IkBuilder) -> None:
    sh = b.sh
    inp = b.inp_embd()
    b.build_inp_pos()
    b.build_kq_mask()
    for il in range(sh.n_layer):
        inp_sa = inp
        cur = b.norm(inp, b.lw(il, "attn_norm.weight"))
        cur = deepseek2_attn(b, il, cur)
        if il == sh.n_layer - 1:
            ids = b.build_out_ids()
            b.n_tokens = sh.n_outputs
            cur = get_rows(cur, ids)
            inp_sa = get_rows(inp_sa, ids)
        ffn_inp = dup(cur, "ADD", cur, inp_sa)
        cur = b.norm(ffn_inp, b.lw(il, "ffn_norm.weight"))
        if il < sh.n_dense_lead:
            cur = b.ffn(cur, b.req(f"blk.{il}.ffn_up.weight"), b.lw(il, "ffn_gate.weight"),
                        b.req(f"blk.{il}.ffn_down.weight"))
        else:
            moe = b.moe(cur, il, b.lw(il, "exp_probs_b.bias"))
            shexp = b.ffn(cur, b.req(f"blk.{il}.ffn_up_shexp.weight"), b.lw(il, "ffn_gate_shexp.weight"),
                          b.req(f"blk.{il}.ffn_down_shexp.weight"))
            cur = dup(moe, "ADD", moe, shexp)
        inp = dup(cur, "ADD", cur, ffn_inp)
    b.head(inp)


def _llama(b: IkBuilder) -> None:
    """``build_llama`` (dense or MoE without shared experts) and ``build_qwen3moe``."""
    sh = b.sh
    inp = b.inp_embd()
    b.build_inp_pos()
    b.build_kq_mask()
    out_ids = b.build_out_ids() if b.n_tokens > 1 else None
    factors = b.w("rope_freqs.weight")
    for il in range(sh.n_layer):
        last = out_ids if il == sh.n_layer - 1 else None
        cur = b.std_attention(il, inp, last, factors=factors)
        if b.lw(il, "ffn_gate_inp.weight") is None:
            inp = b.ffn_block(il, cur)
        elif sh.arch == "llama":
            # build_llama calls llm_build_moe_ffn with add_input: the sum takes the normed input
            normed = b.norm(cur, b.lw(il, "ffn_norm.weight"))
            routed = b.moe(normed, il, None)
            inp = b.expand(dup(routed, "ADD", routed, normed))
        else:
            inp = b.std_moe(il, cur)
    b.head(inp)


def _glm4moe(b: IkBuilder) -> None:
    """``build_glm4_moe``: std attention with q/k/v biases, the leading dense layers' FFN and the MoE
    layers (sigmoid routing with ``exp_probs_b``, a shared expert) after ``post_attention_norm``; the
    NextN block is not part of the graph."""
    sh = b.sh
    inp = b.inp_embd()
    b.build_inp_pos()
    b.build_kq_mask()
    out_ids = b.build_out_ids() if b.n_tokens > 1 and not sh.mtp else None
    for il in range(sh.n_layer):
        last = out_ids if il == sh.n_layer - 1 else None
        cur = b.std_attention(il, inp, last)
        if il < sh.n_dense_lead:
            inp = b.ffn_block(il, cur, norm="post_attention_norm.weight")
        else:
            inp = b.std_moe(il, cur, norm="post_attention_norm.weight")
    b.head(inp)


def _glm4moe_mtp(b: IkBuilder) -> None:
    """``build_glm4_moe`` with ``cparams.mtp_op_type`` set (the MTP context reserves it as
    ``MTP_OP_WARMUP``): ``build_mtp_tail`` on the NextN layer (ik 55d3c05 src/llama-build-context.cpp
    8018-8034, 8158-8257): the main model's hidden states (a 2-D input), the mask and the output ids,
    the token rows of ``nextn.embed_tokens`` (else ``token_embd``), both normed, concatenated and
    projected by ``nextn.eh_proj``; attention over the context's own cache of the NextN layer with the
    residual, the MoE (+ shared expert) with its residual, ``shared_head_norm``, then the output rows
    and ``shared_head_head`` (else ``output``)."""
    sh = b.sh
    il = sh.n_layer  # the NextN layer follows the trunk
    b.build_inp_pos()
    hidden = input_tensor(F32, [sh.n_embd, b.n_tokens], "result_embd_pooled")
    b.build_kq_mask()
    out_ids = b.build_out_ids()
    tokens = input_tensor(I32, [b.n_tokens], "inp_tokens")
    tok = get_rows(b.lw(il, "nextn.embed_tokens.weight") or b.req("token_embd.weight"), tokens)
    tok_norm = b.norm(tok, b.lw(il, "nextn.enorm.weight"))
    hidden_norm = b.norm(hidden, b.lw(il, "nextn.hnorm.weight"))
    cur = mul_mat(b.req(f"blk.{il}.nextn.eh_proj.weight"), concat(tok_norm, hidden_norm, 0))
    cur = b.std_attention(il, cur, None)
    cur = b.std_moe(il, cur, norm="post_attention_norm.weight")
    cur = get_rows(b.norm(cur, b.lw(il, "nextn.shared_head_norm.weight")), out_ids)
    cur = mul_mat(b.lw(il, "nextn.shared_head_head.weight") or b.req("output.weight"), cur)
    cur.flags |= OUTPUT
    b.expand(cur)


def _gpt_oss(b: IkBuilder) -> None:
    """``build_openai_moe``: attention with biases and sinks, the SWA mask on even layers (the cache
    is not shrunk for them), the MoE with a router bias, top-k softmax weights and expert biases."""
    sh = b.sh
    inp = b.inp_embd()
    b.build_inp_pos()
    mask = b.build_kq_mask()
    mask_swa = b.build_kq_mask(name="KQ_mask_swa")
    out_ids = b.build_out_ids() if b.n_tokens > 1 else None
    for il in range(sh.n_layer):
        last = out_ids if il == sh.n_layer - 1 else None
        cur = b.std_attention(il, inp, last, sinks=b.lw(il, "attn_sinks.weight"),
                              mask=mask_swa if il % 2 == 0 else mask)
        inp = b.std_moe(il, cur, norm="post_attention_norm.weight")
    b.head(inp)


def _gemma3(b: IkBuilder) -> None:
    """``build_gemma3``: scaled embeddings, q/k norms, post-attention and post-FFN norms, the SWA mask
    on five layers of six (the cache is not shrunk for them)."""
    sh = b.sh
    inp = b.inp_embd()
    inp = dup(inp, "SCALE", inp)
    b.build_inp_pos()
    mask = b.build_kq_mask()
    mask_swa = b.build_kq_mask(name="KQ_mask_swa")
    out_ids = b.build_out_ids() if b.n_tokens > 1 else None
    for il in range(sh.n_layer):
        post = b.lw(il, "post_attention_norm.weight")
        layer_mask = mask_swa if il % 6 < 5 else mask
        cur = b.std_attention(il, inp, None, add_input=False, post_norm=post, mask=layer_mask)
        if il == sh.n_layer - 1 and out_ids is not None:
            cur = get_rows(cur, out_ids)
            inp = get_rows(inp, out_ids)
        cur = dup(cur, "ADD", cur, inp)
        inp = b.ffn_block(il, cur, post_norm=b.lw(il, "post_ffw_norm.weight"))
    b.head(inp)


IK_GRAPHS: dict[str, Callable[[IkBuilder], None]] = {
    "gemma3": _gemma3,
    "gpt-oss": _gpt_oss,
    "glm4moe": _glm4moe,
    "deepseek2": _deepseek2,
    "llama": _llama,
    "qwen3moe": _llama,
}


#: ik's MTP graphs (``cparams.mtp_op_type`` set): ik 55d3c05, the ik-llama-cpp-python 0.1.5 build, has
#: GLM-4.x MoE only (src/llama.cpp 5503: ``cparams.mtp`` is turned off for any other architecture)
IK_MTP_GRAPHS: dict[str, Callable[[IkBuilder], None]] = {"glm4moe": _glm4moe_mtp}
