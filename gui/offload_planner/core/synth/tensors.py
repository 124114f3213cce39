"""The tensor list of a :class:`ModelSpec`, arch by arch, as llama.cpp's ``load_arch_tensors`` wants it.

Shapes are in ggml order (``ne0`` first).  Each tensor carries a *slot*: the
:class:`~offload_planner.core.synth.spec.QuantMix` field that decides its type.  llama.cpp rejects a
file whose tensor set differs from what the arch creates ("wrong number of tensors"), so these
builders follow ``src/models/<arch>.cpp`` of the llama.cpp tree exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from offload_planner.core.synth.spec import ModelSpec

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TensorDef:
    name: str
    shape: Shape  # ggml order
    slot: str  # QuantMix field name
    layer: int | None = None


def _blk(il: int, base: str, shape: Shape, slot: str, suffix: str = "weight") -> TensorDef:
    return TensorDef(f"blk.{il}.{base}.{suffix}", shape, slot, il)


def _norm(il: int, base: str, n: int) -> TensorDef:
    return _blk(il, base, (n,), "small")


def _bias(il: int, base: str, shape: Shape) -> TensorDef:
    return _blk(il, base, shape, "small", "bias")


# --- shared pieces -------------------------------------------------------------------------


def _attn_qkv(spec: ModelSpec, il: int, *, out_bias: bool = False) -> list[TensorDef]:
    e = spec.n_embd
    n_q = spec.head_count(il) * spec.key_length
    n_k = spec.head_count_kv(il) * spec.key_length
    n_v = spec.head_count_kv(il) * spec.value_length
    out = [
        _blk(il, "attn_q", (e, n_q), "attn"),
        _blk(il, "attn_k", (e, n_k), "attn"),
        _blk(il, "attn_v", (e, n_v), "attn_v"),
    ]
    if spec.attn_bias:
        out += [_bias(il, "attn_q", (n_q,)), _bias(il, "attn_k", (n_k,)), _bias(il, "attn_v", (n_v,))]
    out.append(_blk(il, "attn_output", (spec.head_count(il) * spec.value_length, e), "attn"))
    if out_bias:
        out.append(_bias(il, "attn_output", (e,)))
    if spec.qk_norm:
        out += [_norm(il, "attn_k_norm", spec.key_length), _norm(il, "attn_q_norm", spec.key_length)]
    return out


def _dense_ffn(spec: ModelSpec, il: int) -> list[TensorDef]:
    e, f = spec.n_embd, spec.n_ff
    return [
        _blk(il, "ffn_gate", (e, f), "ffn"),
        _blk(il, "ffn_down", (f, e), "ffn_down"),
        _blk(il, "ffn_up", (e, f), "ffn"),
    ]


def _routed_experts(spec: ModelSpec, il: int) -> list[TensorDef]:
    e, f, x = spec.n_embd, spec.n_ff_exp, spec.n_expert
    return [
        _blk(il, "ffn_gate_inp", (e, x), "router"),
        _blk(il, "ffn_gate_exps", (e, f, x), "exps"),
        _blk(il, "ffn_down_exps", (f, e, x), "exps_down"),
        _blk(il, "ffn_up_exps", (e, f, x), "exps"),
    ]


def _shared_expert(spec: ModelSpec, il: int) -> list[TensorDef]:
    e, f = spec.n_embd, spec.n_ff_exp * spec.n_expert_shared
    return [
        _blk(il, "ffn_gate_shexp", (e, f), "shexp"),
        _blk(il, "ffn_down_shexp", (f, e), "shexp_down"),
        _blk(il, "ffn_up_shexp", (e, f), "shexp"),
    ]


def _nextn(spec: ModelSpec, il: int) -> list[TensorDef]:
    e, v = spec.n_embd, spec.tokenizer.n_vocab
    out = [
        _blk(il, "nextn.eh_proj", (2 * e, e), "nextn"),
        _norm(il, "nextn.enorm", e),
        _norm(il, "nextn.hnorm", e),
    ]
    if spec.nextn_embed_head:
        out += [
            _blk(il, "nextn.embed_tokens", (e, v), "nextn"),
            _blk(il, "nextn.shared_head_head", (e, v), "nextn"),
        ]
    out.append(_norm(il, "nextn.shared_head_norm", e))
    return out


# --- architectures -------------------------------------------------------------------------


def _llama_layer(spec: ModelSpec, il: int) -> list[TensorDef]:
    e = spec.n_embd
    return [
        _norm(il, "attn_norm", e),
        *_attn_qkv(spec, il),
        _norm(il, "ffn_norm", e),
        *(_dense_ffn(spec, il) if spec.n_expert == 0 else _routed_experts(spec, il)),
    ]


def _qwen3moe_layer(spec: ModelSpec, il: int) -> list[TensorDef]:
    e = spec.n_embd
    return [
        _norm(il, "attn_norm", e),
        *_attn_qkv(spec, il),
        _norm(il, "ffn_norm", e),
        *_routed_experts(spec, il),
    ]


def _mla_attention(spec: ModelSpec, il: int) -> list[TensorDef]:
    e, h = spec.n_embd, spec.head_count(il)
    rope = spec.rope_dim
    k_mla = spec.key_length_mla or spec.key_length
    v_mla = spec.value_length_mla or spec.value_length
    nope = k_mla - rope
    q_lora, kv_lora = spec.q_lora_rank, spec.kv_lora_rank
    out = [_norm(il, "attn_norm", e)]
    if q_lora:
        out.append(_norm(il, "attn_q_a_norm", q_lora))
    out.append(_norm(il, "attn_kv_a_norm", kv_lora))
    if q_lora:
        out += [
            _blk(il, "attn_q_a", (e, q_lora), "attn"),
            _blk(il, "attn_q_b", (q_lora, h * k_mla), "attn"),
        ]
    else:
        out.append(_blk(il, "attn_q", (e, h * k_mla), "attn"))
    out.append(_blk(il, "attn_kv_a_mqa", (e, kv_lora + rope), "attn"))
    if not spec.is_mla:
        out.append(_blk(il, "attn_kv_b", (kv_lora, h * (nope + v_mla)), "attn_v"))
    if spec.is_mla or spec.kv_b_and_split:
        out += [
            _blk(il, "attn_k_b", (nope, kv_lora, h), "attn"),
            _blk(il, "attn_v_b", (kv_lora, v_mla, h), "attn"),
        ]
    out.append(_blk(il, "attn_output", (h * v_mla, e), "attn"))
    return out


def _deepseek2_layer(spec: ModelSpec, il: int) -> list[TensorDef]:
    out = [*_mla_attention(spec, il), _norm(il, "ffn_norm", spec.n_embd)]
    if spec.is_moe_layer(il):
        gate_inp, *exps = _routed_experts(spec, il)
        out += [gate_inp, _bias(il, "exp_probs_b", (spec.n_expert,)), *exps]
        out += _shared_expert(spec, il)
    else:
        out += _dense_ffn(spec, il)
    if il >= spec.n_layer_trunk:
        out += _nextn(spec, il)
    return out


def _glm4moe_layer(spec: ModelSpec, il: int) -> list[TensorDef]:
    out = [
        _norm(il, "attn_norm", spec.n_embd),
        *_attn_qkv(spec, il),
        _norm(il, "post_attention_norm", spec.n_embd),
    ]
    if spec.is_moe_layer(il):
        gate_inp, *exps = _routed_experts(spec, il)
        out += [gate_inp, _bias(il, "exp_probs_b", (spec.n_expert,)), *exps]
        if spec.n_expert_shared:
            out += _shared_expert(spec, il)
    else:
        out += _dense_ffn(spec, il)
    if il >= spec.n_layer_trunk:
        out += _nextn(spec, il)
    return out


def _gpt_oss_layer(spec: ModelSpec, il: int) -> list[TensorDef]:
    e, f, x = spec.n_embd, spec.n_ff_exp, spec.n_expert
    return [
        _norm(il, "attn_norm", e),
        _norm(il, "post_attention_norm", e),
        *_attn_qkv(spec, il, out_bias=True),
        _blk(il, "attn_sinks", (spec.head_count(il),), "small"),
        _blk(il, "ffn_gate_inp", (e, x), "router"),
        _bias(il, "ffn_gate_inp", (x,)),
        _blk(il, "ffn_gate_exps", (e, f, x), "exps"),
        _bias(il, "ffn_gate_exps", (f, x)),
        _blk(il, "ffn_down_exps", (f, e, x), "exps_down"),
        _bias(il, "ffn_down_exps", (e, x)),
        _blk(il, "ffn_up_exps", (e, f, x), "exps"),
        _bias(il, "ffn_up_exps", (f, x)),
    ]


def _gemma3_layer(spec: ModelSpec, il: int) -> list[TensorDef]:
    e = spec.n_embd
    return [
        _norm(il, "attn_norm", e),
        *_attn_qkv(spec, il),
        _norm(il, "post_attention_norm", e),
        _norm(il, "ffn_norm", e),
        *_dense_ffn(spec, il),
        _norm(il, "post_ffw_norm", e),
    ]


def _gptneox_layer(spec: ModelSpec, il: int) -> list[TensorDef]:
    """GPT-NeoX (Pythia): layer norms with biases, fused QKV (typed like ``attn_v``: llama-quantize
    gives ``attn_qkv`` the attn_v-style bumps), biased output and FFN projections, no gate."""
    e, f = spec.n_embd, spec.n_ff
    n_qkv = e + 2 * spec.head_count_kv(il) * spec.key_length
    return [
        _norm(il, "attn_norm", e),
        _bias(il, "attn_norm", (e,)),
        _blk(il, "attn_qkv", (e, n_qkv), "attn_v"),
        _bias(il, "attn_qkv", (n_qkv,)),
        _blk(il, "attn_output", (e, e), "attn"),
        _bias(il, "attn_output", (e,)),
        _norm(il, "ffn_norm", e),
        _bias(il, "ffn_norm", (e,)),
        _blk(il, "ffn_down", (f, e), "ffn_down"),
        _bias(il, "ffn_down", (e,)),
        _blk(il, "ffn_up", (e, f), "ffn"),
        _bias(il, "ffn_up", (f,)),
    ]


# --- DeepSeek Sparse Attention (deepseek32, glm-dsa) ----------------------------------------


def indexer_hparams(spec: ModelSpec) -> tuple[int, int]:
    """The lightning indexer's (head_count, key_length): ``attention.indexer.*`` of ``extra_kv``."""
    kv = spec.extra_kv
    n_head, size = kv["attention.indexer.head_count"], kv["attention.indexer.key_length"]
    assert isinstance(n_head, int) and isinstance(size, int)
    return n_head, size


def indexer_full(spec: ModelSpec, il: int) -> bool:
    """Whether trunk layer ``il`` has its own indexer: ``attention.indexer.types`` when written (glm-dsa's
    GLM-5.2 files), else every layer (``load_arch_hparams`` of deepseek32.cpp / glm-dsa.cpp)."""
    types = spec.extra_kv.get("attention.indexer.types")
    return not isinstance(types, tuple) or il >= len(types) or bool(types[il])


def _indexer(spec: ModelSpec, il: int) -> list[TensorDef]:
    """The DSA lightning indexer's tensors (``load_arch_tensors`` of src/models/deepseek32.cpp)."""
    e, q_lora = spec.n_embd, spec.q_lora_rank
    n_head, size = indexer_hparams(spec)
    return [
        _norm(il, "indexer.k_norm", size),
        _bias(il, "indexer.k_norm", (size,)),
        # F32 as convert_hf_to_gguf writes it ("DSA indexer weights should be F32", conversion/base.py):
        # typed like the never-quantized router
        _blk(il, "indexer.proj", (e, n_head), "router"),
        _blk(il, "indexer.attn_k", (e, size), "attn"),
        _blk(il, "indexer.attn_q_b", (q_lora, n_head * size), "attn"),
    ]


def _dsa_layer(spec: ModelSpec, il: int) -> list[TensorDef]:
    """deepseek32 / glm-dsa: deepseek2's MLA layer plus the indexer (glm-dsa: optional, written on the
    layers with a full indexer and on the NextN blocks, as deepseek32 needs it on every block)."""
    out = [*_mla_attention(spec, il), _norm(il, "ffn_norm", spec.n_embd)]
    if spec.arch == "deepseek32" or il >= spec.n_layer_trunk or indexer_full(spec, il):
        out += _indexer(spec, il)
    if spec.is_moe_layer(il):
        gate_inp, *exps = _routed_experts(spec, il)
        out += [gate_inp, _bias(il, "exp_probs_b", (spec.n_expert,)), *exps]
        out += _shared_expert(spec, il)
    else:
        out += _dense_ffn(spec, il)
    if il >= spec.n_layer_trunk:
        out += _nextn(spec, il)
    return out


def _gated_attention(spec: ModelSpec, il: int) -> list[TensorDef]:
    """Qwen3-Next / Qwen3.5 full attention: Q doubled by its output gate, q/k norms (``create_tensor_qkv``
    with ``n_embd_head_k * n_head * 2``)."""
    e, hk = spec.n_embd, spec.key_length
    n_q = spec.head_count(il) * hk
    return [
        _blk(il, "attn_q", (e, n_q * 2), "attn"),
        _blk(il, "attn_k", (e, spec.head_count_kv(il) * hk), "attn"),
        _blk(il, "attn_v", (e, spec.head_count_kv(il) * spec.value_length), "attn_v"),
        _blk(il, "attn_output", (n_q, e), "attn"),
        _norm(il, "attn_q_norm", hk),
        _norm(il, "attn_k_norm", hk),
    ]


def _gated_delta_net(spec: ModelSpec, il: int, *, fused_ba: bool) -> list[TensorDef]:
    """A linear-attention (gated delta net) layer's tensors: qwen3next fuses beta and alpha
    (``ssm_ba``), Qwen3.5 keeps them apart (``ssm_beta``, ``ssm_alpha``); ``ssm_a`` has no suffix."""
    e, state = spec.n_embd, spec.ssm_d_state
    key_dim, value_dim, heads_v = state * spec.ssm_n_group, state * spec.ssm_dt_rank, spec.ssm_dt_rank
    out = [
        _blk(il, "attn_qkv", (e, key_dim * 2 + value_dim), "attn_v"),
        _blk(il, "attn_gate", (e, value_dim), "attn"),
        _blk(il, "ssm_conv1d", (spec.ssm_d_conv, key_dim * 2 + value_dim), "small"),  # never quantized
        _bias(il, "ssm_dt", (heads_v,)),
        TensorDef(f"blk.{il}.ssm_a", (heads_v,), "small", il),
    ]
    if fused_ba:
        out.append(_blk(il, "ssm_ba", (e, heads_v * 2), "attn"))
    else:
        out += [_blk(il, "ssm_beta", (e, heads_v), "attn"), _blk(il, "ssm_alpha", (e, heads_v), "attn")]
    return [*out, _norm(il, "ssm_norm", state), _blk(il, "ssm_out", (value_dim, e), "attn")]


def _hybrid_layer(spec: ModelSpec, il: int, *, fused_ba: bool) -> list[TensorDef]:
    e = spec.n_embd
    out = [_norm(il, "attn_norm", e), _norm(il, "post_attention_norm", e)]
    if spec.is_recurrent(il):
        out += _gated_delta_net(spec, il, fused_ba=fused_ba)
    else:
        out += _gated_attention(spec, il)
    nextn = _nextn(spec, il) if il >= spec.n_layer_trunk else []  # the MTP block: attention + FFN + NextN
    if spec.n_expert == 0:
        return out + _dense_ffn(spec, il) + nextn
    f = spec.n_ff_shexp
    return [
        *out,
        *_routed_experts(spec, il),
        _blk(il, "ffn_gate_inp_shexp", (e,), "small"),
        _blk(il, "ffn_gate_shexp", (e, f), "shexp"),
        _blk(il, "ffn_down_shexp", (f, e), "shexp_down"),
        _blk(il, "ffn_up_shexp", (e, f), "shexp"),
        *nextn,
    ]


def _mamba2_mixer(spec: ModelSpec, il: int) -> list[TensorDef]:
    """A Mamba2 mixer (Nemotron-H, Granite hybrid): ``ssm_a``/``ssm_d`` without suffix, grouped norm."""
    e, d_inner, ng, ds = spec.n_embd, spec.ssm_d_inner, spec.ssm_n_group, spec.ssm_d_state
    nh = spec.ssm_dt_rank
    conv = d_inner + 2 * ng * ds
    return [
        _blk(il, "ssm_in", (e, 2 * d_inner + 2 * ng * ds + nh), "attn"),
        _blk(il, "ssm_conv1d", (spec.ssm_d_conv, conv), "small"),
        _bias(il, "ssm_conv1d", (conv,)),
        _bias(il, "ssm_dt", (nh,)),
        TensorDef(f"blk.{il}.ssm_a", (1, nh), "small", il),
        TensorDef(f"blk.{il}.ssm_d", (1, nh), "small", il),
        _blk(il, "ssm_norm", (d_inner // ng, ng), "small"),
        _blk(il, "ssm_out", (d_inner, e), "attn"),
    ]


def _granite_hybrid_layer(spec: ModelSpec, il: int) -> list[TensorDef]:
    """Granite hybrid (src/models/granite-hybrid.cpp): a Mamba2 mixer where ``head_count_kv`` is 0, else
    attention; then an FFN norm and MoE experts sized by ``feed_forward_length`` with a shared expert."""
    e = spec.n_embd
    mixer = _mamba2_mixer(spec, il) if spec.head_count_kv(il) == 0 else [
        _blk(il, "attn_q", (e, spec.head_count(il) * spec.key_length), "attn"),
        _blk(il, "attn_k", (e, spec.head_count_kv(il) * spec.key_length), "attn"),
        _blk(il, "attn_v", (e, spec.head_count_kv(il) * spec.value_length), "attn_v"),
        _blk(il, "attn_output", (spec.head_count(il) * spec.key_length, e), "attn"),
    ]
    f = spec.n_ff_shexp
    return [
        _norm(il, "attn_norm", e), *mixer, _norm(il, "ffn_norm", e), *_routed_experts(spec, il),
        _blk(il, "ffn_gate_shexp", (e, f), "shexp"), _blk(il, "ffn_up_shexp", (e, f), "shexp"),
        _blk(il, "ffn_down_shexp", (f, e), "shexp_down"),
    ]


def _nemotron_h_layer(spec: ModelSpec, il: int) -> list[TensorDef]:
    """Nemotron-H (src/models/nemotron-h.cpp load_arch_tensors): every block one mixer, by
    ``layer_pattern``: Mamba2 (``ssm_a``/``ssm_d`` without suffix), attention, MoE (up/down experts, no
    gate, exp_probs_b, an up/down shared expert) or a dense up/down MLP."""
    e, kind = spec.n_embd, spec.layer_pattern[il]
    out = [_norm(il, "attn_norm", e)]
    if kind == "M":
        return out + _mamba2_mixer(spec, il)
    if kind == "*":
        hk, n_q = spec.key_length, spec.head_count(il) * spec.key_length
        return [
            *out,
            _blk(il, "attn_q", (e, n_q), "attn"),
            _blk(il, "attn_k", (e, spec.head_count_kv(il) * hk), "attn"),
            _blk(il, "attn_v", (e, spec.head_count_kv(il) * spec.value_length), "attn_v"),
            _blk(il, "attn_output", (n_q, e), "attn"),
        ]
    if kind == "E":
        f, x, fs = spec.n_ff_exp, spec.n_expert, spec.n_ff_shexp
        return [
            *out,
            _blk(il, "ffn_gate_inp", (e, x), "router"),
            _bias(il, "exp_probs_b", (x,)),
            _blk(il, "ffn_down_exps", (f, e, x), "exps_down"),
            _blk(il, "ffn_up_exps", (e, f, x), "exps"),
            _blk(il, "ffn_down_shexp", (fs, e), "shexp_down"),
            _blk(il, "ffn_up_shexp", (e, fs), "shexp"),
        ]
    return [*out, _blk(il, "ffn_down", (spec.n_ff, e), "ffn_down"), _blk(il, "ffn_up", (e, spec.n_ff), "ffn")]


def _kimi_linear_layer(spec: ModelSpec, il: int) -> list[TensorDef]:
    """Kimi-Linear (src/models/kimi-linear.cpp load_arch_tensors): a KDA layer where ``head_count_kv`` is
    0 (q/k/v short convolutions, f/g low-rank gates, beta, ``ssm_a`` without suffix), MLA elsewhere
    (no q compression, split k_b/v_b); a leading dense FFN, then routed experts with a shared expert."""
    e, h = spec.n_embd, spec.head_count(il)
    if spec.head_count_kv(il) == 0:
        hd, dc = int(spec.extra_kv["kda.head_dim"]), int(spec.extra_kv["ssm.conv_kernel"])  # type: ignore[arg-type]
        out = [
            _norm(il, "attn_norm", e),
            *(_blk(il, f"ssm_conv1d_{x}", (dc, 1, hd * h), "small") for x in "qkv"),
            _blk(il, "attn_q", (e, hd * h), "attn"),
            _blk(il, "attn_k", (e, hd * h), "attn"),
            _blk(il, "attn_v", (e, hd * h), "attn_v"),
            _blk(il, "ssm_f_a", (e, hd), "attn"),
            _blk(il, "ssm_f_b", (hd, hd * h), "attn"),
            _blk(il, "ssm_beta", (e, h), "attn"),
            TensorDef(f"blk.{il}.ssm_a", (1, h), "small", il),
            _bias(il, "ssm_dt", (hd * h,)),
            _blk(il, "ssm_g_a", (e, hd), "attn"),
            _blk(il, "ssm_g_b", (hd, hd * h), "attn"),
            _norm(il, "ssm_norm", hd),
            _blk(il, "attn_output", (hd * h, e), "attn"),
        ]
    else:
        out = _mla_attention(spec, il)
    out.append(_norm(il, "ffn_norm", e))
    if not spec.is_moe_layer(il):
        return out + _dense_ffn(spec, il)
    gate_inp, *exps = _routed_experts(spec, il)
    return [*out, gate_inp, *exps, *_shared_expert(spec, il), _bias(il, "exp_probs_b", (spec.n_expert,))]


def _kimi_k3_layer(spec: ModelSpec, il: int) -> list[TensorDef]:
    """Kimi-K3 (src/models/kimi-k3.cpp load_arch_tensors): kimi-linear's KDA/MLA split with a full-rank
    KDA gate (``ssm_g``), a 1-D ``ssm_a``; no cross-layer residual scores (``attn_res.block_size`` 0)
    and experts at ``n_embd`` (no latent)."""
    e, h = spec.n_embd, spec.head_count(il)
    out = [_norm(il, "attn_norm", e), _norm(il, "ffn_norm", e)]
    if spec.head_count_kv(il) == 0:
        hd, dc = int(spec.extra_kv["kda.head_dim"]), int(spec.extra_kv["ssm.conv_kernel"])  # type: ignore[arg-type]
        d = hd * h
        out += [
            *(_blk(il, f"ssm_conv1d_{x}", (dc, 1, d), "small") for x in "qkv"),
            _blk(il, "attn_q", (e, d), "attn"),
            _blk(il, "attn_k", (e, d), "attn"),
            _blk(il, "attn_v", (e, d), "attn_v"),
            _blk(il, "ssm_f_a", (e, hd), "attn"),
            _blk(il, "ssm_f_b", (hd, d), "attn"),
            _blk(il, "ssm_beta", (e, h), "attn"),
            TensorDef(f"blk.{il}.ssm_a", (h,), "small", il),
            _bias(il, "ssm_dt", (d,)),
            _blk(il, "ssm_g", (e, d), "attn"),
            _norm(il, "ssm_norm", hd),
            _blk(il, "attn_output", (d, e), "attn"),
        ]
    else:
        out += _mla_attention(spec, il)[1:]  # its attn_norm is above
    if not spec.is_moe_layer(il):
        return out + _dense_ffn(spec, il)
    gate_inp, *exps = _routed_experts(spec, il)
    return [*out, gate_inp, _bias(il, "exp_probs_b", (spec.n_expert,)), *exps, *_shared_expert(spec, il)]


def _qwen3next_layer(spec: ModelSpec, il: int) -> list[TensorDef]:
    return _hybrid_layer(spec, il, fused_ba=True)


def _qwen35_layer(spec: ModelSpec, il: int) -> list[TensorDef]:
    return _hybrid_layer(spec, il, fused_ba=False)


def _deepseek4_layer(spec: ModelSpec, il: int) -> list[TensorDef]:
    """DeepSeek V4 (src/models/deepseek4.cpp load_arch_tensors): low-rank q, one shared K/V head
    (``attn_kv``), a grouped low-rank output, hyper-connection mixers around attention and FFN; a block
    whose ``compress_ratios`` entry is 4 or 128 adds a compressor (ratio 4: twice as wide, plus the
    lightning indexer's projections and compressor); routed experts with a shared expert, hash-routed
    (``ffn_gate_tid2eid``, I32) in the first ``hash_layer_count`` blocks, else a probability bias."""
    e, h, hd = spec.n_embd, spec.head_count(il), spec.key_length
    q_rank, hc = spec.q_lora_rank, _kv_int(spec, "hyper_connection.count")
    groups = _kv_int(spec, "attention.output_group_count")
    o_rank = _kv_int(spec, "attention.output_lora_rank")
    mix = (2 + hc) * hc
    ratio = int(spec.extra_kv["attention.compress_ratios"][il])  # type: ignore[index]
    out = [
        _norm(il, "attn_norm", e),
        _blk(il, "attn_sinks", (h,), "small"),
        _blk(il, "attn_q_a", (e, q_rank), "attn"),
        _norm(il, "attn_q_a_norm", q_rank),
        _blk(il, "attn_q_b", (q_rank, h * hd), "attn"),
        _blk(il, "attn_kv", (e, hd), "attn"),
        _norm(il, "attn_kv_a_norm", hd),
        _blk(il, "attn_output_a", (h * hd // groups, o_rank * groups), "attn"),  # file shape (2-D)
        _blk(il, "attn_output_b", (groups * o_rank, e), "attn"),
    ]
    for part in ("attn", "ffn"):
        out += [_blk(il, f"hc_{part}_fn", (hc * e, mix), "small"),
                _blk(il, f"hc_{part}_base", (mix,), "small"),
                _blk(il, f"hc_{part}_scale", (3,), "small")]
    if ratio:
        coff = 2 if ratio == 4 else 1
        out += [
            _blk(il, "attn_compressor_kv", (e, coff * hd), "attn"),
            _blk(il, "attn_compressor_gate", (e, coff * hd), "attn"),
            _blk(il, "attn_compressor_ape", (coff * hd, ratio), "small"),
            _norm(il, "attn_compressor_norm", hd),
        ]
    if ratio == 4:
        n_ih = _kv_int(spec, "attention.indexer.head_count")
        ihd = _kv_int(spec, "attention.indexer.key_length")
        out += [
            _blk(il, "indexer.proj", (e, n_ih), "attn"),
            _blk(il, "indexer.attn_q_b", (q_rank, n_ih * ihd), "attn"),
            _blk(il, "indexer_compressor_kv", (e, 2 * ihd), "attn"),
            _blk(il, "indexer_compressor_gate", (e, 2 * ihd), "attn"),
            _blk(il, "indexer_compressor_ape", (2 * ihd, ratio), "small"),
            _norm(il, "indexer_compressor_norm", ihd),
        ]
    gate_inp, *exps = _routed_experts(spec, il)
    out.append(gate_inp)
    if il < _kv_int(spec, "hash_layer_count"):
        out.append(_blk(il, "ffn_gate_tid2eid", (spec.n_expert_used, spec.tokenizer.n_vocab), "ids"))
    else:
        out.append(_bias(il, "exp_probs_b", (spec.n_expert,)))
    out += [_norm(il, "ffn_norm", e), *exps, *_shared_expert(spec, il)]
    if il >= spec.n_layer_trunk:
        out += _nextn(spec, il)
    return out


def _deepseek4_globals(spec: ModelSpec) -> list[TensorDef]:
    """The hyper-connection head: ``output_hc_fn`` {hc * n_embd, hc}, ``output_hc_base`` {hc},
    ``output_hc_scale`` {1}."""
    hc = _kv_int(spec, "hyper_connection.count")
    return [TensorDef("output_hc_fn.weight", (hc * spec.n_embd, hc), "small"),
            TensorDef("output_hc_base.weight", (hc,), "small"),
            TensorDef("output_hc_scale.weight", (1,), "small")]


def _kv_int(spec: ModelSpec, key: str) -> int:
    v = spec.extra_kv[key]
    assert isinstance(v, int), key
    return v


def _qwen4exp_hc(spec: ModelSpec) -> tuple[int, int, int]:
    """(hc, hc * n_embd, low rank): ``hyper_connection.count`` and ``hyper_connection.low_rank``."""
    hc, lr = _kv_int(spec, "hyper_connection.count"), _kv_int(spec, "hyper_connection.low_rank")
    return hc, hc * spec.n_embd, lr


def _qwen4exp_mixer(il: int, which: str, spec: ModelSpec) -> list[TensorDef]:
    """One hyper-connection module (``hc_attn_*`` before the token mixer, ``hc_ffn_*`` before the MoE)."""
    hc, hc_dim, lr = _qwen4exp_hc(spec)
    return [
        _blk(il, f"hc_{which}_norm", (spec.n_embd, hc), "small"),
        _blk(il, f"hc_{which}_down", (hc_dim, lr), "small"),
        _blk(il, f"hc_{which}_up", (lr, hc_dim), "small"),
        _blk(il, f"hc_{which}_inject", (hc_dim, hc), "small"),
    ]


def _qwen4exp_ple(spec: ModelSpec, il: int) -> list[TensorDef]:
    """The PLE module of a (linear) layer ``ple.layers`` names: key/value projections, three norms and the
    dilated depthwise convolution over the hc streams."""
    e = spec.n_embd
    hc, hc_dim, _ = _qwen4exp_hc(spec)
    return [
        _blk(il, "ple_key", (e, hc_dim), "attn"),
        _blk(il, "ple_value", (e, e), "attn"),
        _blk(il, "ple_norm_key", (e, hc), "small"),
        _blk(il, "ple_norm_query", (e, hc), "small"),
        _blk(il, "ple_norm_conv", (e, hc), "small"),
        _blk(il, "ple_conv1d", (_kv_int(spec, "ple.conv_kernel"), hc_dim), "small"),
    ]


def _qwen4exp_table(spec: ModelSpec) -> list[TensorDef]:
    """``per_layer_token_embd``: ``embedding_length_per_layer_input`` wide, as many rows as the PLE heads'
    ranges reach (``max(offset + vocab size)``; the converter may pad it)."""
    offsets, sizes = spec.extra_kv.get("ple.head_offsets"), spec.extra_kv.get("ple.head_vocab_sizes")
    if not isinstance(offsets, tuple) or not isinstance(sizes, tuple):
        return []
    rows = max(int(o) + int(n) for o, n in zip(offsets, sizes, strict=True))
    width = _kv_int(spec, "embedding_length_per_layer_input")
    return [TensorDef("per_layer_token_embd.weight", (width, rows), "small")]


def _qwen4exp_layer(spec: ModelSpec, il: int) -> list[TensorDef]:
    """qwen4exp (src/models/qwen4exp.cpp load_arch_tensors): two hyper-connection modules and no layer
    norms; Qwen3.5's gated delta net on the recurrent layers, gated attention plus the QSA indexer's
    q/k projections and norms on the others; routed experts and a gated shared expert (no PLE here)."""
    e = spec.n_embd
    out = [*_qwen4exp_mixer(il, "attn", spec), *_qwen4exp_mixer(il, "ffn", spec)]
    if spec.is_recurrent(il):
        out += _gated_delta_net(spec, il, fused_ba=False)
        ple = spec.extra_kv.get("ple.layers")
        if isinstance(ple, tuple) and il in ple:
            out += _qwen4exp_ple(spec, il)
    else:
        n_idx = _kv_int(spec, "attention.indexer.head_count")
        d_idx = _kv_int(spec, "attention.indexer.key_length")
        out += [
            *_gated_attention(spec, il),
            _blk(il, "indexer.q_proj", (e, n_idx * d_idx), "attn"),
            _blk(il, "indexer.k_proj", (e, d_idx), "attn"),
            _norm(il, "indexer.q_norm", d_idx),
            _norm(il, "indexer.k_norm", d_idx),
        ]
    f = spec.n_ff_shexp
    out += [
        *_routed_experts(spec, il),
        _blk(il, "ffn_gate_inp_shexp", (e,), "small"),
        _blk(il, "ffn_gate_shexp", (e, f), "shexp"),
        _blk(il, "ffn_down_shexp", (f, e), "shexp_down"),
        _blk(il, "ffn_up_shexp", (e, f), "shexp"),
    ]
    if il < spec.n_layer_trunk:
        return out
    hc, hc_dim, lr = _qwen4exp_hc(spec)  # the MTP block: a QSA layer with its NextN projections
    return [
        *out,
        _blk(il, "nextn.eh_proj", (2 * e, e), "nextn"),
        _norm(il, "nextn.enorm", e),
        _blk(il, "nextn.hnorm", (e, hc), "small"),
        _blk(il, "nextn.hc_head_norm", (e, hc), "small"),
        _blk(il, "nextn.hc_head_down", (hc_dim, lr), "small"),
        _blk(il, "nextn.hc_head_up", (lr, hc_dim), "small"),
    ]


def _qwen4exp_head(spec: ModelSpec) -> list[TensorDef]:
    """No ``output_norm``: the final hyper-connection mixer ``output_hc_*`` carries it (and the PLE table,
    with PLE)."""
    hc, hc_dim, lr = _qwen4exp_hc(spec)
    return [
        *_qwen4exp_table(spec),
        TensorDef("output_hc_norm.weight", (spec.n_embd, hc), "small"),
        TensorDef("output_hc_down.weight", (hc_dim, lr), "small"),
        TensorDef("output_hc_up.weight", (lr, hc_dim), "small"),
    ]


def _glm5_next_kda(spec: ModelSpec, il: int) -> list[TensorDef]:
    """glm5-next's KDA layer (head_count_kv 0): q/k/v short convolutions, f/g low-rank gates, a 1-D
    ``ssm_a`` and a ``d_inner`` dt bias."""
    e, h = spec.n_embd, spec.head_count(il)
    hd, dc = _kv_int(spec, "kda.head_dim"), _kv_int(spec, "ssm.conv_kernel")
    d = hd * h
    return [
        *(_blk(il, f"ssm_conv1d_{x}", (dc, 1, d), "small") for x in "qkv"),
        _blk(il, "attn_q", (e, d), "attn"),
        _blk(il, "attn_k", (e, d), "attn"),
        _blk(il, "attn_v", (e, d), "attn_v"),
        _blk(il, "ssm_f_a", (e, hd), "attn"),
        _blk(il, "ssm_f_b", (hd, d), "attn"),
        _blk(il, "ssm_beta", (e, h), "attn"),
        TensorDef(f"blk.{il}.ssm_a", (h,), "small", il),
        _bias(il, "ssm_dt", (d,)),
        _blk(il, "ssm_g_a", (e, hd), "attn"),
        _blk(il, "ssm_g_b", (hd, d), "attn"),
        _norm(il, "ssm_norm", hd),
        _blk(il, "attn_output", (d, e), "attn"),
    ]


def _glm5_next_dsa(spec: ModelSpec, il: int) -> list[TensorDef]:
    """glm5-next's DSA layer: nope-only MLA (rope.dimension_count 0: ``attn_kv_a_mqa`` is ``kv_lora`` wide)
    and, where the layer has a full indexer (``attention.indexer.types``), the k-pool indexer."""
    e, h = spec.n_embd, spec.head_count(il)
    k_mla, v_mla = spec.key_length_mla, spec.value_length_mla
    q_lora, kv_lora = spec.q_lora_rank, spec.kv_lora_rank
    out = [
        _norm(il, "attn_q_a_norm", q_lora),
        _norm(il, "attn_kv_a_norm", kv_lora),
        _blk(il, "attn_q_a", (e, q_lora), "attn"),
        _blk(il, "attn_q_b", (q_lora, h * k_mla), "attn"),
        _blk(il, "attn_kv_a_mqa", (e, kv_lora), "attn"),
        _blk(il, "attn_k_b", (k_mla, kv_lora, h), "attn"),
        _blk(il, "attn_v_b", (kv_lora, v_mla, h), "attn"),
        _blk(il, "attn_output", (h * v_mla, e), "attn"),
    ]
    types = spec.extra_kv.get("attention.indexer.types")
    if isinstance(types, tuple) and il < spec.n_layer_trunk and not types[il]:
        return out
    n_idx = _kv_int(spec, "attention.indexer.head_count")
    d_idx = _kv_int(spec, "attention.indexer.key_length")
    return [
        *out,
        _norm(il, "indexer.k_norm", d_idx),
        _bias(il, "indexer.k_norm", (d_idx,)),
        _blk(il, "indexer.proj", (e, n_idx), "small"),
        _blk(il, "indexer.attn_k", (e, d_idx), "attn"),
        _blk(il, "indexer.attn_q_b", (q_lora, n_idx * d_idx), "attn"),
        _blk(il, "indexer_compressor_gate", (e, d_idx), "attn"),
        _blk(il, "indexer_compressor_ape", (d_idx, _kv_int(spec, "attention.indexer.kpool")), "small"),
    ]


def _glm5_next_layer(spec: ModelSpec, il: int) -> list[TensorDef]:
    """glm5-next (src/models/glm5-next.cpp load_arch_tensors): attention and FFN norms, the mHC mixers
    (``hc_*_fn`` of ``(2 + hc) * hc`` outputs, base, 3 scales), KDA or DSA, then a leading dense FFN or
    routed experts with ``exp_probs_b`` and a shared expert; a layer past the trunk adds the NextN tensors."""
    e = spec.n_embd
    hc = _kv_int(spec, "hyper_connection.count")
    mix = (2 + hc) * hc
    out = [_norm(il, "attn_norm", e), _norm(il, "ffn_norm", e)]
    for which in ("attn", "ffn") if il < spec.n_layer_trunk else ():  # (no mixers in an MTP block)
        out += [
            _blk(il, f"hc_{which}_fn", (hc * e, mix), "small"),
            _blk(il, f"hc_{which}_base", (mix,), "small"),
            _blk(il, f"hc_{which}_scale", (3,), "small"),
        ]
    out += _glm5_next_kda(spec, il) if spec.head_count_kv(il) == 0 else _glm5_next_dsa(spec, il)
    nextn = _nextn(spec, il) if il >= spec.n_layer_trunk else []  # (an MTP block: the NextN tensors too)
    if not spec.is_moe_layer(il):
        return out + _dense_ffn(spec, il) + nextn
    gate_inp, *exps = _routed_experts(spec, il)
    probs_b = _bias(il, "exp_probs_b", (spec.n_expert,))
    return [*out, gate_inp, probs_b, *exps, *_shared_expert(spec, il), *nextn]


LayerBuilder = Callable[[ModelSpec, int], list[TensorDef]]

#: Architectures with tensors of their own outside the blocks (after the output matrix).
GLOBAL_BUILDERS: dict[str, Callable[[ModelSpec], list[TensorDef]]] = {
    "deepseek4": _deepseek4_globals,
}
#: the output norm tensors of architectures without ``output_norm.weight``
HEAD_NORMS: dict[str, Callable[[ModelSpec], list[TensorDef]]] = {"qwen4exp": _qwen4exp_head}

LAYER_BUILDERS: dict[str, LayerBuilder] = {
    "llama": _llama_layer,
    "qwen3": _llama_layer,  # dense Qwen3: llama's layer with the q/k norms (``qk_norm``)
    "qwen3moe": _qwen3moe_layer,
    "deepseek2": _deepseek2_layer,
    "glm4moe": _glm4moe_layer,
    "gpt-oss": _gpt_oss_layer,
    "gemma3": _gemma3_layer,
    "gptneox": _gptneox_layer,
    "deepseek32": _dsa_layer,
    "glm-dsa": _dsa_layer,
    "qwen3next": _qwen3next_layer,
    "qwen35": _qwen35_layer,
    "qwen35moe": _qwen35_layer,
    "nemotron_h": _nemotron_h_layer,
    "nemotron_h_moe": _nemotron_h_layer,
    "kimi-linear": _kimi_linear_layer,
    "kimi-k3": _kimi_k3_layer,
    "granitehybrid": _granite_hybrid_layer,
    "deepseek4": _deepseek4_layer,
    "qwen4exp": _qwen4exp_layer,
    "glm5-next": _glm5_next_layer,
}

#: Architectures whose norms are LayerNorm with a bias (``output_norm.bias`` too) and whose epsilon
#: key is ``attention.layer_norm_epsilon``.
LAYERNORM_ARCHS = frozenset({"gptneox"})

SUPPORTED_ARCHS = frozenset(LAYER_BUILDERS)


def tensor_defs(spec: ModelSpec) -> list[TensorDef]:
    """All tensors of the model in file order: embeddings, blocks, output norm, output (the last two
    first with ``output_first``)."""
    try:
        layer = LAYER_BUILDERS[spec.arch]
    except KeyError:
        raise ValueError(f"synth: unsupported architecture {spec.arch!r}") from None
    e, v = spec.n_embd, spec.tokenizer.n_vocab
    out: list[TensorDef] = []
    if spec.rope_freqs:
        out.append(TensorDef("rope_freqs.weight", (spec.rope_dim // 2,), "small"))
    norm = HEAD_NORMS.get(spec.arch)
    head = norm(spec) if norm is not None else [TensorDef("output_norm.weight", (e,), "small")]
    if spec.arch in LAYERNORM_ARCHS:
        head.append(TensorDef("output_norm.bias", (e,), "small"))
    if not spec.tied_embeddings:
        head.append(TensorDef("output.weight", (e, v), "output"))
    if spec.arch in GLOBAL_BUILDERS:
        head += GLOBAL_BUILDERS[spec.arch](spec)
    if spec.output_first:
        out += head
    out.append(TensorDef("token_embd.weight", (e, v), "embd"))
    for il in range(spec.n_layer):
        out += layer(spec, il)
    return out if spec.output_first else out + head
