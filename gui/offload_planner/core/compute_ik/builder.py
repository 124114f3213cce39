"""``llm_build_context`` of ik_llama.cpp on shapes: the graph's shape parameters and the builder's blocks
(inputs, KV store and attention, norms, FFN and MoE, the output head)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
    permute,
    reshape,
    row_size,
    view,
)
from offload_planner.core.compute.graph import WeightAccess
from offload_planner.core.compute_ik.ops import (
    KQ_MASK_PAD,
    KQ_MASK_PAD_2025,
    cast,
    cont,
    cpy,
    dup,
    flash_attn,
    new,
    top_k,
    view2,
    view3,
)
from offload_planner.core.ggml_types import GGMLType


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
                kq = dup(kq, "SOFT_MAX", kq, mask, sinks)
                kqv = mul_mat(v, kq)
            else:  # -amb below the K*Q scratch and no GQA: one head at a time, concatenated
                acc: T | None = None
                for i in range(nh):
                    k_i = view3(k, k.ne[0], k.ne[1], 1, k.nb[1], k.nb[2], k.nb[2] * i)
                    q_i = view3(q, q.ne[0], q.ne[1], 1, q.nb[1], q.nb[2], q.nb[2] * i)
                    kq_i = mul_mat(k_i, q_i)
                    kq_i = dup(kq_i, "SOFT_MAX", kq_i, mask)
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
            cur = dup(cur, "ADD", cur, wo_b)
        return cur

    # blocks

    def norm(self, cur: T, w: T | None) -> T:
        if w is not None:
            return dup(cur, "FUSED_RMS_NORM", cur, w)
        return dup(cur, "RMS_NORM", cur)

    def rope(self, x: T) -> T:
        return dup(x, "ROPE", x, self.inp_pos, None)

    def ffn(self, cur: T, up: T, gate: T | None, down: T) -> T:
        """``llm_build_ffn`` with ik's defaults (-fug on): a fused up/gate op, then down."""
        if gate is not None:
            cur = new(F32, [up.ne[1], cur.ne[1], cur.ne[2], cur.ne[3]], "FUSED_UP_GATE", up, gate, cur)
        else:
            cur = dup(mul_mat(up, cur), "UNARY")
        return mul_mat(down, cur)

    def moe(self, cur: T, il: int, probs_b: T | None) -> T:
        """``llm_build_moe_ffn`` with ik's defaults (-fmoe on, fused_mmad on)."""
        sh = self.sh
        n_embd, n_tok = cur.ne[0], cur.ne[1]
        n_exp, n_used = sh.n_expert, sh.n_expert_used
        logits = mul_mat(self.req(f"blk.{il}.ffn_gate_inp.weight"), cur)
        if (gate_b := self.lw(il, "ffn_gate_inp.bias")) is not None:
            logits = dup(logits, "ADD", logits, gate_b)
        if sh.gating == 1:
            probs = dup(logits, "SOFT_MAX", logits, None)
        elif sh.gating == 2:
            probs = dup(logits, "UNARY", logits)
        else:
            probs = logits
        sel = dup(probs, "ADD", probs, probs_b) if probs_b is not None else probs
        selected = top_k(sel, n_used)
        weights = get_rows(reshape(probs, 1, n_exp, n_tok), selected)
        if sh.gating == 3:
            weights = reshape(dup(reshape(weights, n_used, n_tok), "SOFT_MAX"), 1, n_used, n_tok)
        if sh.norm_w:
            weights = reshape(weights, n_used, n_tok)
            wsum = new(weights.type, [1, n_tok], "SUM_ROWS", weights)
            weights = reshape(dup(weights, "DIV", weights, wsum), 1, n_used, n_tok)
        if sh.w_scale and abs(sh.w_scale - 1) > 1e-5:
            weights = dup(weights, "SCALE", weights)
        self.expand(weights)
        cur = reshape(cur, n_embd, 1, n_tok)
        up = self.req(f"blk.{il}.ffn_up_exps.weight")
        gate = self.req(f"blk.{il}.ffn_gate_exps.weight")
        up_b, gate_b, down_b = (self.lw(il, f"ffn_{x}_exps.bias") for x in ("up", "gate", "down"))
        if up.type is gate.type:
            ne = [up.ne[1], selected.ne[0], cur.ne[2], 1]
            par = new(F32, ne, "MOE_FUSED_UP_GATE", up, gate, cur, selected, up_b, gate_b)
        elif up_b is not None or gate_b is not None:
            raise ValueError("expert biases without the fused up/gate op: not simulated")
        else:
            u = mul_mat_id(up, cur, selected)
            g = mul_mat_id(gate, cur, selected)
            self.expand(u)
            self.expand(g)
            par = new(F32, list(g.ne), "FUSED_MUL_UNARY", g, u)
        experts = mul_mat_id(self.req(f"blk.{il}.ffn_down_exps.weight"), par, selected)
        if down_b is not None:
            experts = dup(experts, "ADD_ID", experts, down_b, selected)
        return new(F32, [n_embd, n_tok], "MUL_MULTI_ADD", experts, weights)

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
            q = self.expand(dup(q, "ADD", q, bq))
        if (bk := self.lw(il, "attn_k.bias")) is not None:
            k = self.expand(dup(k, "ADD", k, bk))
        if (bv := self.lw(il, "attn_v.bias")) is not None:
            v = self.expand(dup(v, "ADD", v, bv))
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
        q = dup(q, "ROPE", q, self.inp_pos, factors)
        k = dup(k, "ROPE", k, self.inp_pos, factors)
        if q_scale:
            q = dup(q, "SCALE", q)
        cur = self.kv_attn(il, self.lw(il, "attn_output.weight"), self.lw(il, "attn_output.bias"), k, v, q,
                           sinks=sinks, mask=mask)
        if out_ids is not None:
            cur = get_rows(cur, out_ids)
            if add_input:
                inp = get_rows(inp, out_ids)
        if post_norm is not None:
            cur = self.norm(cur, post_norm)
        if add_input:
            cur = dup(cur, "ADD", cur, inp)
        return cur

    def ffn_block(self, il: int, inp: T, *, norm: str = "ffn_norm.weight", add_input: bool = True,
                  post_norm: T | None = None) -> T:
        """``llm_build_ffn`` with its own norm and residual."""
        cur = self.norm(inp, self.lw(il, norm))
        cur = self.ffn(cur, self.req(f"blk.{il}.ffn_up.weight"), self.lw(il, "ffn_gate.weight"),
                       self.req(f"blk.{il}.ffn_down.weight"))
        if post_norm is not None:
            cur = self.norm(cur, post_norm)
        return dup(cur, "ADD", cur, inp) if add_input else cur

    def std_moe(self, il: int, inp: T, *, norm: str = "ffn_norm.weight", add_input: bool = True) -> T:
        """``llm_build_std_moe_ffn`` (one device): norm, routed experts (+ shared expert), residual."""
        cur = self.norm(inp, self.lw(il, norm))
        routed = self.moe(cur, il, self.lw(il, "exp_probs_b.bias"))
        up_sh = self.lw(il, "ffn_up_shexp.weight")
        if up_sh is None:
            if add_input:
                routed = dup(routed, "ADD", routed, inp)
            return self.expand(routed)
        if add_input:
            routed = dup(routed, "ADD", routed, inp)
        self.expand(routed)
        shared = self.ffn(cur, up_sh, self.lw(il, "ffn_gate_shexp.weight"),
                          self.req(f"blk.{il}.ffn_down_shexp.weight"))
        return self.expand(dup(routed, "ADD", routed, shared))
