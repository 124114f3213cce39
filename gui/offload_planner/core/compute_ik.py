"""Compute buffers as ik_llama.cpp reserves them, simulated on shapes like :mod:`offload_planner.core.compute`
does for mainline.

ik_llama.cpp builds its own graphs (``src/llama-build-context.cpp``): fused ops (``ggml_fused_rms_norm``
for every weighted RMS norm, ``ggml_fused_up_gate`` for dense gated FFNs, ``ggml_moe_up_gate`` and
``ggml_mul_multi_add`` for the routed experts), its own KQ mask (one f16 ``[n_kv, pad(n_tokens, 16)]``
tensor with flash attention), KV stores as ``ggml_cpy`` into cache views, and for DeepSeek-style models
its MLA paths (``-mla 1/2/3``; with flash attention and a prompt batch of >= 128 tokens, ``-mla 2/3``
expands the latent cache to per-head K and V through ``attn_kv_b``; -amb splits that expansion, or
the K*Q product of the paths without flash attention, when its f32 scratch exceeds the cap).  Graphs
here: deepseek2, llama (dense and MoE), qwen3moe, glm4moe, gpt-oss (SWA mask, sinks, expert biases) and
gemma3 (SWA mask, post norms); ik keeps full-size caches for SWA layers.  Its graph allocator is the older
``ggml-alloc.c`` (fewer ops may run in place) and it reserves one graph: a prompt batch of
``min(n_ctx, n_ubatch)`` tokens over the whole KV cache, every token an output.

This module builds those graphs on :class:`compute.T` shapes and runs :class:`compute.Scheduler` and an
allocator with ik's in-place rules over them.  Verified against ik's libllama (the
ik-llama-cpp-python wheel, CPU backend) to the 0.01 MiB it prints, node counts included:
``tests/integration/test_ik_compute.py``.  With GPUs the graph shapes are ik's but its scheduler and
CUDA buffer rules are not verified here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from offload_planner.core import ik
from offload_planner.core.buffer import IK_CPU_BUFFER_EXTRA, Buffer
from offload_planner.core.compute.allocator import GraphAllocator
from offload_planner.core.compute.buffers import BufferMemo, placement_key
from offload_planner.core.compute.ggml import (
    CPU,
    F16,
    F32,
    I32,
    OUTPUT,
    Graph,
    T,
    concat,
    get_rows,
    input_tensor,
    mul_mat,
    mul_mat_id,
    nbytes,
    permute,
    reshape,
    row_size,
    view,
)
from offload_planner.core.compute.graph import WeightAccess, gating_func
from offload_planner.core.compute.scheduler import Backend, Scheduler
from offload_planner.core.compute.simulate import backends_for, weight_factory
from offload_planner.core.ggml_types import GGMLType, type_by_name
from offload_planner.core.ik_repack import interleaved_off_gpu, repacked_off_gpu

if TYPE_CHECKING:
    from offload_planner.core.devices import DeviceSet
    from offload_planner.core.memory import ContextParams, ResolvedContext
    from offload_planner.core.model import Model
    from offload_planner.core.placement import Placement

#: ``ggml_op_can_inplace`` of ik's ggml-alloc.c.
IK_INPLACE_OPS = frozenset({
    "SCALE", "DIAG_MASK_ZERO", "DIAG_MASK_INF", "ADD", "ADD1", "SUB", "MUL", "DIV", "SQR", "SQRT", "LOG",
    "UNARY", "ROPE", "RMS_NORM", "SOFT_MAX",
})
KQ_MASK_PAD = 16  # GGML_KQ_MASK_PAD in ik's ggml.h
KQ_MASK_PAD_2025 = 32  # ... before July 2025 (PR 574 made it 64, PR 825 of October 2025 16)


# --- ik's extra ops ----------------------------------------------------------------------------------


def _new(type_: GGMLType, ne: list[int], op: str, *src: T | None) -> T:
    return T(type_, ne, op=op, src=src)


def _dup(a: T, op: str, *src: T | None) -> T:
    return T(a.type, a.ne, op=op, src=src or (a,))


def cast(a: T, type_: GGMLType) -> T:
    """``ggml_cast``: a CPY node that is its own second source."""
    t = T(type_, a.ne, op="CPY", src=(a,))
    t.src.append(t)
    return t


def cpy(a: T, dst: T) -> T:
    """``ggml_cpy``: a view of the destination (a KV cache view: nothing to allocate)."""
    t = T(dst.type, dst.ne, op="CPY", src=(a, dst), view_src=dst)
    t.nb = list(dst.nb)
    return t


def repeat(a: T, ne: list[int]) -> T:
    return _new(a.type, ne, "REPEAT", a)


def cont(a: T, *ne: int) -> T:
    return T(a.type, ne or a.ne, op="CONT", src=(a,))


def view2(a: T, ne0: int, ne1: int, nb1: int, offset: int) -> T:
    return view(a, [ne0, ne1], [nb1], offset)


def view3(a: T, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int, offset: int) -> T:
    return view(a, [ne0, ne1, ne2], [nb1, nb2], offset)


def flash_attn(q: T, k: T, v: T, mask: T | None, sinks: T | None = None) -> T:
    return _new(F32, [v.ne[0], q.ne[2], q.ne[1], q.ne[3]], "FLASH_ATTN_EXT", q, k, v, mask, sinks)


def top_k(a: T, k: int) -> T:
    s = _new(I32, list(a.ne), "ARGSORT", a)
    return view(s, [k, s.ne[1], s.ne[2], s.ne[3]], s.nb[1:4], 0)


# --- the graph ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IkShape:
    arch: str
    n_layer: int
    n_embd: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    head_k: int  # ik's n_embd_head_k (deepseek2: the per-head K length of the standard cache)
    head_v: int
    n_rot: int
    n_vocab: int
    n_expert: int
    n_expert_used: int
    n_dense_lead: int
    gating: int
    norm_w: bool
    w_scale: float
    kv_lora_rank: int
    mla: int
    n_tokens: int
    n_outputs: int
    n_kv: int
    flash_attn: bool
    type_k: GGMLType
    type_v: GGMLType
    cpu_only: bool
    attn_max_batch: int = 0
    mask_f32: bool = False  # ik before October 2025: an f32 mask input, cast to f16 for flash attention
    mla_fa_steps_expanded: bool = True  # ik from 2026-01-31: each -mla 2/3 FA head group's output expanded
    #: ``cparams.mtp`` (the server's main context beside an MTP stage): the last layer keeps every row
    #: (``build_glm4_moe``: ``inp_out_ids`` only ``if (n_tokens > 1 && !lctx.cparams.mtp)``)
    mtp: bool = False


class IkBuilder(WeightAccess):
    """``llm_build_context`` of ik_llama.cpp on shapes."""

    def __init__(self, sh: IkShape, weights: Callable[[str], T | None],
                 kv_dev: Callable[[int], str] = lambda il: CPU) -> None:
        self.sh = sh
        self.kv_dev = kv_dev
        self.g = Graph()
        self._w = weights
        self.n_tokens = sh.n_tokens
        self.inp_pos: T | None = None
        self.kq_mask: T | None = None
        self.cache: dict[tuple[str, int], T] = {}

    def expand(self, t: T) -> T:
        self.g.expand(t)
        return t

    # inputs

    def inp_embd(self) -> T:
        tokens = input_tensor(I32, [self.n_tokens], "inp_tokens")
        return get_rows(self.req("token_embd.weight"), tokens)

    def build_inp_pos(self) -> T:
        self.inp_pos = input_tensor(I32, [self.n_tokens], "inp_pos")
        return self.inp_pos

    def build_kq_mask(self, name: str = "KQ_mask") -> T:
        sh = self.sh
        if sh.mask_f32:  # ik of early 2025: ``ggml_cast`` of an f32 input where flash attention reads it
            padded = -(-self.n_tokens // KQ_MASK_PAD_2025) * KQ_MASK_PAD_2025
            f32 = input_tensor(F32, [sh.n_kv, padded], name)
            m = cast(f32, F16) if sh.flash_attn else f32
        else:
            padded = -(-self.n_tokens // KQ_MASK_PAD) * KQ_MASK_PAD
            m = input_tensor(F16 if sh.flash_attn else F32, [sh.n_kv, padded], name)
        if self.kq_mask is None:
            self.kq_mask = m
        return m

    def build_out_ids(self) -> T:
        return input_tensor(I32, [self.sh.n_outputs], "inp_out_ids")

    def kv_tensor(self, kind: str, il: int, type_: GGMLType, ne0: int) -> T:
        key = (kind, il)
        if key not in self.cache:
            t = T(type_, [ne0, self.sh.n_kv], name=f"cache_{kind}_l{il}")
            t.dev = self.kv_dev(il)
            self.cache[key] = t
        return self.cache[key]

    def kv_attn(self, il: int, wo: T | None, wo_b: T | None, k_cur: T, v_cur: T, q_cur: T,
                sinks: T | None = None, mask: T | None = None) -> T:
        """``llm_build_kv``: store K and V (transposed V without flash attention), then
        ``llm_build_kqv`` on the whole cache, then the output projection."""
        sh = self.sh
        n_tok, n_kv = self.n_tokens, sh.n_kv
        nh, nkv = sh.n_head[il], sh.n_head_kv[il]
        hk, hv = sh.head_k, sh.head_v
        for t in (q_cur, k_cur, v_cur):
            self.expand(t)
        kl = self.kv_tensor("k", il, sh.type_k, hk * nkv)
        vl = self.kv_tensor("v", il, sh.type_v, hv * nkv)
        head = n_kv - n_tok
        k_row = row_size(kl.type, hk)
        self.expand(cpy(k_cur, view2(kl, hk, n_tok * nkv, k_row, k_row * nkv * head)))
        v_gqa = hv * nkv
        if sh.flash_attn:
            dst = view(vl, [n_tok * v_gqa], [], head * row_size(vl.type, v_gqa))
        else:
            es = vl.type.type_size
            dst = view2(vl, n_tok, v_gqa, n_kv * es, head * es)
            v_cur = permute(v_cur, 1, 0, 2, 3)
        self.expand(cpy(v_cur, dst))
        q = permute(q_cur, 0, 2, 1, 3)
        k = view3(kl, hk, n_kv, nkv, k_row * nkv, k_row, 0)
        mask = self.kq_mask if mask is None else mask
        if sh.flash_attn:
            v = view3(vl, hv, n_kv, nkv, row_size(vl.type, v_gqa), row_size(vl.type, hv), 0)
            cur = reshape(flash_attn(q, k, v, mask, sinks), hv * nh, n_tok)
        else:
            es = vl.type.type_size
            v = view3(vl, n_kv, hv, nkv, es * n_kv, es * n_kv * hv, 0)
            kq_mib = n_kv * n_tok * nh * 4 // (1024 * 1024)
            amb = sh.attn_max_batch
            if amb <= 0 or amb >= kq_mib or nkv != nh or sinks is not None:
                kq = mul_mat(k, q)
                kq = _dup(kq, "SOFT_MAX", kq, mask, sinks)
                kqv = mul_mat(v, kq)
            else:  # -amb below the K*Q scratch and no GQA: one head at a time, concatenated
                acc: T | None = None
                for i in range(nh):
                    k_i = view3(k, k.ne[0], k.ne[1], 1, k.nb[1], k.nb[2], k.nb[2] * i)
                    q_i = view3(q, q.ne[0], q.ne[1], 1, q.nb[1], q.nb[2], q.nb[2] * i)
                    kq_i = mul_mat(k_i, q_i)
                    kq_i = _dup(kq_i, "SOFT_MAX", kq_i, mask)
                    v_i = view3(v, v.ne[0], v.ne[1], 1, v.nb[1], v.nb[2], v.nb[2] * i)
                    kqv_i = mul_mat(v_i, kq_i)
                    acc = kqv_i if acc is None else concat(acc, kqv_i, 2)
                assert acc is not None
                kqv = acc
            cur = cont(permute(kqv, 0, 2, 1, 3), hv * nh, n_tok)
        self.expand(cur)
        if wo is not None:
            cur = mul_mat(wo, cur)
        if wo_b is not None:
            cur = _dup(cur, "ADD", cur, wo_b)
        return cur

    # blocks

    def norm(self, cur: T, w: T | None) -> T:
        if w is not None:
            return _dup(cur, "FUSED_RMS_NORM", cur, w)
        return _dup(cur, "RMS_NORM", cur)

    def rope(self, x: T) -> T:
        return _dup(x, "ROPE", x, self.inp_pos, None)

    def ffn(self, cur: T, up: T, gate: T | None, down: T) -> T:
        """``llm_build_ffn`` with ik's defaults (-fug on): a fused up/gate op, then down."""
        if gate is not None:
            cur = _new(F32, [up.ne[1], cur.ne[1], cur.ne[2], cur.ne[3]], "FUSED_UP_GATE", up, gate, cur)
        else:
            cur = _dup(mul_mat(up, cur), "UNARY")
        return mul_mat(down, cur)

    def moe(self, cur: T, il: int, probs_b: T | None) -> T:
        """``llm_build_moe_ffn`` with ik's defaults (-fmoe on, fused_mmad on)."""
        sh = self.sh
        n_embd, n_tok = cur.ne[0], cur.ne[1]
        n_exp, n_used = sh.n_expert, sh.n_expert_used
        logits = mul_mat(self.req(f"blk.{il}.ffn_gate_inp.weight"), cur)
        if (gate_b := self.lw(il, "ffn_gate_inp.bias")) is not None:
            logits = _dup(logits, "ADD", logits, gate_b)
        if sh.gating == 1:
            probs = _dup(logits, "SOFT_MAX", logits, None)
        elif sh.gating == 2:
            probs = _dup(logits, "UNARY", logits)
        else:
            probs = logits
        sel = _dup(probs, "ADD", probs, probs_b) if probs_b is not None else probs
        selected = top_k(sel, n_used)
        weights = get_rows(reshape(probs, 1, n_exp, n_tok), selected)
        if sh.gating == 3:
            weights = reshape(_dup(reshape(weights, n_used, n_tok), "SOFT_MAX"), 1, n_used, n_tok)
        if sh.norm_w:
            weights = reshape(weights, n_used, n_tok)
            wsum = _new(weights.type, [1, n_tok], "SUM_ROWS", weights)
            weights = reshape(_dup(weights, "DIV", weights, wsum), 1, n_used, n_tok)
        if sh.w_scale and abs(sh.w_scale - 1) > 1e-5:
            weights = _dup(weights, "SCALE", weights)
        self.expand(weights)
        cur = reshape(cur, n_embd, 1, n_tok)
        up = self.req(f"blk.{il}.ffn_up_exps.weight")
        gate = self.req(f"blk.{il}.ffn_gate_exps.weight")
        up_b, gate_b, down_b = (self.lw(il, f"ffn_{x}_exps.bias") for x in ("up", "gate", "down"))
        if up.type is gate.type:
            ne = [up.ne[1], selected.ne[0], cur.ne[2], 1]
            par = _new(F32, ne, "MOE_FUSED_UP_GATE", up, gate, cur, selected, up_b, gate_b)
        elif up_b is not None or gate_b is not None:
            raise ValueError("expert biases without the fused up/gate op: not simulated")
        else:
            u = mul_mat_id(up, cur, selected)
            g = mul_mat_id(gate, cur, selected)
            self.expand(u)
            self.expand(g)
            par = _new(F32, list(g.ne), "FUSED_MUL_UNARY", g, u)
        experts = mul_mat_id(self.req(f"blk.{il}.ffn_down_exps.weight"), par, selected)
        if down_b is not None:
            experts = _dup(experts, "ADD_ID", experts, down_b, selected)
        return _new(F32, [n_embd, n_tok], "MUL_MULTI_ADD", experts, weights)

    def head(self, cur: T) -> T:
        """``build_output``: the final norm and the output projection."""
        cur = self.norm(cur, self.w("output_norm.weight"))
        cur = mul_mat(self.req("output.weight"), cur)
        cur.flags |= OUTPUT
        return self.expand(cur)

    def qkv(self, il: int, cur: T) -> tuple[T, T, T]:
        """``llm_build_mul_mat_qkv``: Q, K, V projections (+ biases), Q/K reshaped to heads and
        normed where the model has q/k norms; V stays 2-D."""
        sh, n_tok = self.sh, self.n_tokens
        out = []
        for x in "qkv":
            t = mul_mat(self.req(f"blk.{il}.attn_{x}.weight"), cur)
            out.append(t)
        for t in out:
            self.expand(t)
        q, k, v = out
        if (bq := self.lw(il, "attn_q.bias")) is not None:
            q = self.expand(_dup(q, "ADD", q, bq))
        if (bk := self.lw(il, "attn_k.bias")) is not None:
            k = self.expand(_dup(k, "ADD", k, bk))
        if (bv := self.lw(il, "attn_v.bias")) is not None:
            v = self.expand(_dup(v, "ADD", v, bv))
        q = reshape(q, sh.head_k, q.ne[0] // sh.head_k, n_tok)
        if (qn := self.lw(il, "attn_q_norm.weight")) is not None:
            q = self.norm(q, qn)
        k = reshape(k, sh.head_k, k.ne[0] // sh.head_k, n_tok)
        if (kn := self.lw(il, "attn_k_norm.weight")) is not None:
            k = self.norm(k, kn)
        return q, k, v

    def std_attention(self, il: int, inp: T, out_ids: T | None, *, add_input: bool = True,
                      factors: T | None = None, sinks: T | None = None, post_norm: T | None = None,
                      q_scale: bool = False, mask: T | None = None) -> T:
        """``build_std_attention`` (one device): norm, QKV, RoPE, KV store and attention, the rows
        of the last layer's outputs, the residual."""
        cur = self.norm(inp, self.lw(il, "attn_norm.weight"))
        q, k, v = self.qkv(il, cur)
        assert self.inp_pos is not None
        q = _dup(q, "ROPE", q, self.inp_pos, factors)
        k = _dup(k, "ROPE", k, self.inp_pos, factors)
        if q_scale:
            q = _dup(q, "SCALE", q)
        cur = self.kv_attn(il, self.lw(il, "attn_output.weight"), self.lw(il, "attn_output.bias"), k, v, q,
                           sinks=sinks, mask=mask)
        if out_ids is not None:
            cur = get_rows(cur, out_ids)
            if add_input:
                inp = get_rows(inp, out_ids)
        if post_norm is not None:
            cur = self.norm(cur, post_norm)
        if add_input:
            cur = _dup(cur, "ADD", cur, inp)
        return cur

    def ffn_block(self, il: int, inp: T, *, norm: str = "ffn_norm.weight", add_input: bool = True,
                  post_norm: T | None = None) -> T:
        """``llm_build_ffn`` with its own norm and residual."""
        cur = self.norm(inp, self.lw(il, norm))
        cur = self.ffn(cur, self.req(f"blk.{il}.ffn_up.weight"), self.lw(il, "ffn_gate.weight"),
                       self.req(f"blk.{il}.ffn_down.weight"))
        if post_norm is not None:
            cur = self.norm(cur, post_norm)
        return _dup(cur, "ADD", cur, inp) if add_input else cur

    def std_moe(self, il: int, inp: T, *, norm: str = "ffn_norm.weight", add_input: bool = True) -> T:
        """``llm_build_std_moe_ffn`` (one device): norm, routed experts (+ shared expert), residual."""
        cur = self.norm(inp, self.lw(il, norm))
        routed = self.moe(cur, il, self.lw(il, "exp_probs_b.bias"))
        up_sh = self.lw(il, "ffn_up_shexp.weight")
        if up_sh is None:
            if add_input:
                routed = _dup(routed, "ADD", routed, inp)
            return self.expand(routed)
        if add_input:
            routed = _dup(routed, "ADD", routed, inp)
        self.expand(routed)
        shared = self.ffn(cur, up_sh, self.lw(il, "ffn_gate_shexp.weight"),
                          self.req(f"blk.{il}.ffn_down_shexp.weight"))
        return self.expand(_dup(routed, "ADD", routed, shared))


def _deepseek2_attn(b: IkBuilder, il: int, cur: T) -> T:
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
        kq = _dup(kq, "SOFT_MAX", kq, mask)
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
        kq_i = _dup(kq_i, "SOFT_MAX", kq_i, mask)
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


def _deepseek2(b: IkBuilder) -> None:
    sh = b.sh
    inp = b.inp_embd()
    b.build_inp_pos()
    b.build_kq_mask()
    for il in range(sh.n_layer):
        inp_sa = inp
        cur = b.norm(inp, b.lw(il, "attn_norm.weight"))
        cur = _deepseek2_attn(b, il, cur)
        if il == sh.n_layer - 1:
            ids = b.build_out_ids()
            b.n_tokens = sh.n_outputs
            cur = get_rows(cur, ids)
            inp_sa = get_rows(inp_sa, ids)
        ffn_inp = _dup(cur, "ADD", cur, inp_sa)
        cur = b.norm(ffn_inp, b.lw(il, "ffn_norm.weight"))
        if il < sh.n_dense_lead:
            cur = b.ffn(cur, b.req(f"blk.{il}.ffn_up.weight"), b.lw(il, "ffn_gate.weight"),
                        b.req(f"blk.{il}.ffn_down.weight"))
        else:
            moe = b.moe(cur, il, b.lw(il, "exp_probs_b.bias"))
            shexp = b.ffn(cur, b.req(f"blk.{il}.ffn_up_shexp.weight"), b.lw(il, "ffn_gate_shexp.weight"),
                          b.req(f"blk.{il}.ffn_down_shexp.weight"))
            cur = _dup(moe, "ADD", moe, shexp)
        inp = _dup(cur, "ADD", cur, ffn_inp)
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
            inp = b.expand(_dup(routed, "ADD", routed, normed))
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
    inp = _dup(inp, "SCALE", inp)
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
        cur = _dup(cur, "ADD", cur, inp)
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


def loads_nextn(model: Model, placement: Placement) -> bool:
    """The model is loaded with its NextN layers (``llama_model_params.mtp``: an MTP stage)."""
    return model.summary.n_nextn > 0 and any(
        it.device is not None for it in placement.items if it.tensor.layer is not None
        and it.tensor.layer >= model.summary.n_layer_trunk)


# --- the allocator -------------------------------------------------------------------------------------


class IkGraphAllocator(GraphAllocator):
    """ik's ``ggml_gallocr``: the mainline walk with ik's (older) list of ops that may run in place,
    and an in-place child keeps its whole parent (no tail given back)."""

    inplace_ops = IK_INPLACE_OPS
    frees_tail = False

    def size(self, t: T, bid: int) -> int:
        size = nbytes(t)
        if self.backends[bid].cuda_like and t.type.quantized and t.ne[0] % 512:
            size += row_size(t.type, 512 - t.ne[0] % 512)
        return size


# --- from the planner's model to the simulation -----------------------------------------------------------


def supported(model: Model, p: ContextParams) -> bool:
    """Whether this module has ik's graph for the model: the configurations verified against ik's CPU
    build (``tests/integration/test_ik_compute.py``).  DeepSeek-style MLA files with sigmoid (V3, R1,
    Kimi K2, ...) or softmax routing (V2) in every -mla mode, with and without flash attention, -amb
    included; dense and Mixtral-style MoE llama; qwen3moe; glm4moe; gpt-oss; gemma3.  Other
    architectures are left to the estimate."""
    if model.arch == "deepseek2":
        return ik.uses_mla(model) and gating_func(model) in (1, 2)
    return model.arch in ("llama", "qwen3moe", "glm4moe", "gpt-oss", "gemma3")


def _norm_w(model: Model) -> bool:
    """``norm_w`` of the architecture's ``llm_build_moe_ffn`` call: fixed in the graph builder for
    llama/qwen3moe (on) and gpt-oss (off), from ``expert_weights_norm`` for the DeepSeek/GLM family."""
    if model.arch in ("llama", "qwen3moe"):
        return True
    if model.arch == "gpt-oss":
        return False
    return bool(model.metadata.get(f"{model.arch}.expert_weights_norm"))


def ik_shape(model: Model, ctx: ResolvedContext, p: ContextParams, cpu_only: bool) -> IkShape:
    s = model.summary
    # ik bounds the batch by the padded context: n_batch = min(n_ctx, -b), n_ubatch = min(n_batch, -ub)
    n_tokens = min(ctx.n_ctx, p.n_batch, p.n_ubatch or p.n_batch)
    head_k, head_v = ik.head_dims(model) if model.arch == "deepseek2" else (s.head_dim_k, s.head_dim_v)

    def per_layer(v: int | list[int]) -> tuple[int, ...]:
        return tuple(v) if isinstance(v, list) else (v,) * s.n_layer

    gating = gating_func(model)
    scale = model.arch_float("expert_weights_scale", 0.0)
    n_head = per_layer(s.n_head)
    return IkShape(
        arch=model.arch, n_layer=s.n_layer_trunk, n_embd=s.n_embd, n_head=n_head,
        n_head_kv=n_head if model.arch == "deepseek2" else per_layer(s.n_head_kv),
        head_k=head_k, head_v=head_v, n_rot=ik.n_rot(model), n_vocab=s.n_vocab,
        n_expert=s.n_expert, n_expert_used=s.n_expert_used, n_dense_lead=s.n_layer_dense_lead,
        gating=gating, norm_w=_norm_w(model),
        w_scale=scale,
        kv_lora_rank=s.kv_lora_rank, mla=p.mla, attn_max_batch=p.amb, n_tokens=n_tokens,
        n_outputs=n_tokens, n_kv=ctx.n_ctx,
        flash_attn=p.flash_attn, type_k=type_by_name(p.type_k), type_v=type_by_name(p.type_v),
        cpu_only=cpu_only, mask_f32=p.dialect.f32_kq_mask,
        mla_fa_steps_expanded=p.dialect.mla_fa_steps_expanded,
    )


def _weights(model: Model, placement: Placement, mla: int) -> Callable[[str], T | None]:
    """The model's weights, plus the attention tensors ik computes at load for the MLA mode."""
    base = weight_factory(model, placement)
    extra: dict[str, T] = {}
    for ct, dev in ik.placed_computed_tensors(model, placement, mla):
        t = T(ct.type, ct.shape, name=ct.name)
        t.dev, t.weights = dev, True
        extra[ct.name] = t

    def get(name: str) -> T | None:
        return extra.get(name) or base(name)

    return get


@dataclass(frozen=True)
class IkReserve:
    backends: list[Backend]
    sizes: list[int]  # bytes per backend as ik's gallocr reserves them
    n_nodes: int
    n_splits: int
    n_tokens: int


@dataclass(frozen=True)
class IkBackend(Backend):
    """ik's ``ggml_backend_cuda_offload_op``: an op with a weight in host memory runs on the GPU
    (the weight copied through its compute buffer) when ``ne[1]`` reaches the offload batch (32);
    for the MoE ops when the batch reaches it and ``batch * active experts >= 32 * experts``
    (DeepSeek-V3, 8 of 256: from 1024 tokens, so not at the default -ub 512).  Never for a weight
    ``-rtr`` repacked into a type the GPU cannot run (``refused``, :mod:`core.ik_repack`)."""

    refused: frozenset[str] = frozenset()

    def offloads(self, op: T) -> bool:
        if self.offload_min_batch is None:
            return False
        w0 = op.src[0] if op.src else None
        if w0 is not None and w0.name in self.refused:
            return False
        if self.offload_only is not None and op.op not in self.offload_only:
            return False
        n = self.offload_min_batch
        if op.op in ("MUL_MAT_ID", "MOE_FUSED_UP_GATE"):
            ids = op.src[2] if op.op == "MUL_MAT_ID" else op.src[3]
            w = op.src[0]
            if ids is None or w is None or op.ne[2] < n:
                return False
            return op.ne[2] * ids.ne[0] >= n * w.ne[2]
        return op.ne[1] >= n and op.op != "GET_ROWS"


def _ik_backends(devices: DeviceSet, placement: Placement, repack: bool,
                 cuda_r4: bool = True) -> list[Backend]:
    """The backends, the GPUs refusing ops on host weights they cannot multiply (-rtr repacked, or a file's
    row-interleaved type the build's CUDA backend lacks)."""
    host = [(it.tensor.name, it.tensor.shape, it.tensor.type.name) for it in placement.items
            if it.device == CPU and not it.copy]
    refused = interleaved_off_gpu(host, cuda_r4) | (repacked_off_gpu(host) if repack else frozenset())
    return [IkBackend(b.name, b.buft, b.alignment, b.cuda_like, b.offload_min_batch, b.offload_only,
                      refused if b.cuda_like else frozenset())
            for b in backends_for(devices, placement)]


def simulate_ik(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
                p: ContextParams, graph: Callable[[IkBuilder], None] | None = None) -> IkReserve:
    """ik's one reserve: the prompt graph of ``min(n_ctx, n_batch, n_ubatch)`` tokens over the whole
    cache (``graph``: another of the architecture's graphs, the MTP context's)."""
    arch_fn = graph or IK_GRAPHS[model.arch]
    backends = _ik_backends(devices, placement, p.repack, p.dialect.cuda_multiplies_r4)
    sh = replace(ik_shape(model, ctx, p, cpu_only=len(backends) == 1), mtp=loads_nextn(model, placement))

    def kv_dev(il: int) -> str:
        return placement.layer_device(il) if p.offload_kqv else CPU

    b = IkBuilder(sh, _weights(model, placement, p.mla), kv_dev)
    arch_fn(b)
    sched = Scheduler(backends, 1, p.op_offload)
    sched.split_graph(b.g)
    galloc = IkGraphAllocator(backends)
    sizes = galloc.run(sched.nodes, sched.node_ids, sched.leafs, sched.leaf_ids)
    return IkReserve(backends, sizes, len(b.g.nodes), len(sched.splits), sh.n_tokens)


#: ``why`` of every compute buffer this module projects starts with this.
IK_SIMULATED = "ik_llama.cpp's own graph simulated"


_IK_MEMO: BufferMemo[list[Buffer] | None] = BufferMemo()


def ik_compute_buffers(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
                       p: ContextParams) -> list[Buffer] | None:
    """ik_llama.cpp's compute buffers, or None where this module has no graph for the model.

    Remembered for the last few placements (:class:`compute.BufferMemo`)."""
    key = (model, devices, ctx, p, *placement_key(placement))
    return _IK_MEMO.get(key, lambda: _ik_compute_buffers(model, devices, placement, ctx, p))


def _ik_compute_buffers(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
                        p: ContextParams) -> list[Buffer] | None:

    if not supported(model, p):
        return None
    try:
        r = simulate_ik(model, devices, placement, ctx, p)
    except (KeyError, IndexError, ValueError, ZeroDivisionError, AssertionError):
        return None  # tensors that do not fit the architecture's graph: the caller's estimate
    mode = f", -mla {p.mla}" if ik.uses_mla(model) else ""
    what = (f"{IK_SIMULATED} ({model.arch}{mode}, flash attention {'on' if p.flash_attn else 'off'}): "
            f"peak of the {r.n_tokens}-token prompt graph over {ctx.n_ctx} cells, {r.n_nodes} nodes")
    return _sized_buffers(r, what, "the graph is ik's but its scheduler and CUDA buffer rules are not "
                          "verified (estimate)")


def _sized_buffers(r: IkReserve, what: str, unverified: str) -> list[Buffer]:
    """A simulation's compute buffer per backend that holds one (ik's CPU build adds its fixed extra);
    ``what`` says how it was computed, ``unverified`` what is not verified with several backends."""
    out = []
    for be, size in zip(r.backends, r.sizes, strict=True):
        if size <= 1:
            continue
        if len(r.backends) == 1:
            why = what + "; equal to ik's CPU build on the verified configurations"
            size += IK_CPU_BUFFER_EXTRA if be.buft == CPU else 0
        else:
            why = what + f"; {r.n_splits} splits: with GPUs {unverified}"
        out.append(Buffer(be.name, be.buft, "compute", size, why))
    return out


def ik_mtp_compute_buffers(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
                           p: ContextParams) -> list[Buffer] | None:
    """The compute buffers of ik's MTP context (its graph reserved as ``MTP_OP_WARMUP``, the op the
    server creates it with: common/speculative.cpp ``cparams_dft.mtp_op_type``), or None where ik has
    no MTP graph for the architecture here (:data:`IK_MTP_GRAPHS`)."""
    graph = IK_MTP_GRAPHS.get(model.arch)
    if graph is None:
        return None
    key = (model, devices, ctx, p, *placement_key(placement))
    return _IK_MTP_MEMO.get(key, lambda: _ik_mtp_buffers(model, devices, placement, ctx, p, graph))


_IK_MTP_MEMO: BufferMemo[list[Buffer]] = BufferMemo()


def _ik_mtp_buffers(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
                    p: ContextParams, graph: Callable[[IkBuilder], None]) -> list[Buffer]:
    r = simulate_ik(model, devices, placement, ctx, p, graph)
    what = (f"{IK_SIMULATED} ({model.arch} MTP, NextN layer {model.summary.n_layer_trunk}, flash attention "
            f"{'on' if p.flash_attn else 'off'}): peak of the {r.n_tokens}-token warmup graph over "
            f"{ctx.n_ctx} cells, {r.n_nodes} nodes")
    return _sized_buffers(r, what, "the scheduler and CUDA rules are not verified")
