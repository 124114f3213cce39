"""The models the project ships and tests with.

``SMALL_MODELS``: tiny (a few MB), complete and loadable by llama.cpp; one per architecture
family the planner must get right.  ``BIG_MODELS``: the real shapes of well-known models, from
their public ``config.json`` and their published GGUFs (tensor counts, vocabulary and merge
counts), meant to be written header-only.
"""

from __future__ import annotations

from dataclasses import replace

from gguf import GGMLQuantizationType as Q

from offload_planner.core.synth.spec import (
    FTYPE_MXFP4_MOE,
    FTYPE_Q4_K_M,
    FTYPE_Q8_0,
    KvValue,
    ModelSpec,
    QuantMix,
    RopeScaling,
    TokenizerKind,
    TokenizerSpec,
)

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# --- quantization mixes ----------------------------------------------------------------------

# llama-quantize Q4_K_M: q4_K everywhere, q6_K output, and q6_K attn_v / ffn_down* on the
# "use_more_bits" layers; 1-D tensors and routers stay f32.
Q4_K_M = QuantMix(
    name="Q4_K_M",
    ftype=FTYPE_Q4_K_M,
    embd=Q.Q4_K,
    output=Q.Q6_K,
    attn=Q.Q4_K,
    attn_v=Q.Q4_K,
    ffn=Q.Q4_K,
    ffn_down=Q.Q4_K,
    shexp=Q.Q4_K,
    shexp_down=Q.Q4_K,
    exps=Q.Q4_K,
    exps_down=Q.Q4_K,
    nextn=Q.Q4_K,
    more_bits=Q.Q6_K,
)

# On a 70B Llama llama-quantize bumps attn_v to q5_K (8 query heads share each KV head).
Q4_K_M_70B = replace(Q4_K_M, attn_v=Q.Q5_K)

# "Dynamic" MoE mix as community quantizers publish: attention and shared expert kept high,
# routed experts q4_K with q6_K down projections.
MOE_DYNAMIC = replace(
    Q4_K_M,
    name="Q4_K_M-dynamic",
    embd=Q.Q6_K,
    attn=Q.Q8_0,
    attn_v=Q.Q8_0,
    ffn=Q.Q6_K,
    ffn_down=Q.Q6_K,
    shexp=Q.Q6_K,
    shexp_down=Q.Q8_0,
    exps_down=Q.Q6_K,
    nextn=Q.Q8_0,
    more_bits=None,
)

# llama-quantize MXFP4_MOE (gpt-oss as published): experts mxfp4, other matrices q8_0.
MXFP4_MOE = QuantMix(
    name="MXFP4_MOE",
    ftype=FTYPE_MXFP4_MOE,
    embd=Q.Q8_0,
    output=Q.Q8_0,
    attn=Q.Q8_0,
    attn_v=Q.Q8_0,
    ffn=Q.Q8_0,
    ffn_down=Q.Q8_0,
    shexp=Q.Q8_0,
    shexp_down=Q.Q8_0,
    exps=Q.MXFP4,
    exps_down=Q.MXFP4,
    nextn=Q.Q8_0,
)

# --- tokenizers ------------------------------------------------------------------------------


def _bpe(n_vocab: int, pre: str, n_merges: int, n_special: int = 8) -> TokenizerSpec:
    return TokenizerSpec(
        TokenizerKind.BPE, n_vocab, pre, n_merges, n_special, chat_template=CHATML_TEMPLATE
    )


# --- small, loadable models ------------------------------------------------------------------

SMALL_MODELS: dict[str, ModelSpec] = {
    # dense GQA, untied, Llama-3.1 style rope_freqs
    "llama": ModelSpec(
        name="synth-llama",
        arch="llama",
        n_layer=4,
        n_embd=256,
        n_head=8,
        n_head_kv=2,
        n_ff=512,
        n_ctx_train=4096,
        rope_freq_base=500000.0,
        rope_freqs=True,
        rms_eps=1e-5,
        tokenizer=_bpe(1024, "llama-bpe", 900),
        quant=Q4_K_M,
    ),
    # Qwen3 MoE: q/k norms, no shared expert, tied embeddings
    "qwen3moe": ModelSpec(
        name="synth-qwen3moe",
        arch="qwen3moe",
        n_layer=4,
        n_embd=256,
        n_head=4,
        n_head_kv=2,
        head_dim_k=64,
        head_dim_v=64,
        n_ff=768,
        n_expert=8,
        n_expert_used=2,
        n_ff_exp=256,
        n_ctx_train=4096,
        rope_freq_base=1000000.0,
        qk_norm=True,
        tied_embeddings=True,
        tokenizer=_bpe(1536, "qwen2", 1200),
        quant=Q4_K_M,
    ),
    # DeepSeek-V3 style: MLA (key_length_mla -> MLA cache), split attn_k_b/attn_v_b,
    # 1 leading dense layer, shared expert, sigmoid gating with exp_probs_b
    "deepseek2": ModelSpec(
        name="synth-deepseek2",
        arch="deepseek2",
        n_layer=4,
        n_embd=256,
        n_head=4,
        n_head_kv=1,
        head_dim_k=256 + 32,  # kv_lora_rank + rope dims: the MLA cache row
        head_dim_v=256,
        n_rot=32,
        n_ff=512,
        n_expert=8,
        n_expert_used=2,
        n_expert_shared=1,
        n_ff_exp=256,
        n_layer_dense_lead=1,
        q_lora_rank=256,
        kv_lora_rank=256,
        key_length_mla=96,
        value_length_mla=64,
        n_ctx_train=4096,
        tokenizer=_bpe(1280, "deepseek-v3", 1000),
        quant=MOE_DYNAMIC,
        extra_kv={
            "expert_weights_scale": 2.5,
            "expert_weights_norm": True,
            "expert_gating_func": 2,
        },
    ),
    # GLM-4.5 style: q/k/v biases, leading dense layer, shared expert, exp_probs_b,
    # partial rotary, one NextN/MTP block (block_count = trunk + 1)
    "glm4moe": ModelSpec(
        name="synth-glm4moe",
        arch="glm4moe",
        n_layer=5,
        n_nextn=1,
        n_embd=256,
        n_head=4,
        n_head_kv=2,
        head_dim_k=64,
        head_dim_v=64,
        n_rot=32,
        n_ff=512,
        n_expert=8,
        n_expert_used=2,
        n_expert_shared=1,
        n_ff_exp=256,
        n_layer_dense_lead=1,
        n_ctx_train=4096,
        rope_freq_base=1000000.0,
        rms_eps=1e-5,
        attn_bias=True,
        tokenizer=_bpe(1024, "glm4", 1500),
        quant=Q4_K_M,
        extra_kv={
            "expert_weights_scale": 1.0,
            "expert_weights_norm": True,
            "expert_gating_func": 2,
        },
    ),
    # gpt-oss: alternating sliding-window attention, attn_sinks, biases everywhere,
    # MXFP4 routed experts
    "gpt-oss": ModelSpec(
        name="synth-gpt-oss",
        arch="gpt-oss",
        n_layer=4,
        n_embd=256,
        n_head=8,
        n_head_kv=2,
        head_dim_k=64,
        head_dim_v=64,
        n_rot=64,
        n_ff=256,
        n_expert=8,
        n_expert_used=2,
        n_ff_exp=256,
        sliding_window=128,
        n_ctx_train=4096,
        rope_freq_base=150000.0,
        rms_eps=1e-5,
        attn_bias=True,
        tokenizer=_bpe(1024, "gpt-4o", 1100),
        quant=MXFP4_MOE,
        rope_scaling=RopeScaling("yarn", 32.0, 4096),
    ),
    # Gemma 3: SWA pattern 6 (5 local : 1 global), q/k norms, post norms, tied embeddings,
    # SentencePiece vocabulary; head_count_kv written as a per-layer array
    "gemma3": ModelSpec(
        name="synth-gemma3",
        arch="gemma3",
        n_layer=6,
        n_embd=256,
        n_head=4,
        n_head_kv=(1, 1, 1, 1, 1, 1),
        head_dim_k=64,
        head_dim_v=64,
        n_ff=512,
        sliding_window=128,
        sliding_window_pattern=6,
        n_ctx_train=8192,
        rope_freq_base=1000000.0,
        qk_norm=True,
        tied_embeddings=True,
        tokenizer=TokenizerSpec(TokenizerKind.SPM, 2048, n_special=8),
        quant=Q4_K_M,
        extra_kv={"rope.freq_base_swa": 10000.0},
    ),
}

# Hybrid Qwen models (llama.cpp's llm_arch_is_hybrid): 3 gated-delta-net (recurrent) layers to 1 full
# attention layer, so 8 layers give 2 attention layers (3 and 7) to split across devices.  The delta net:
# 2 key heads and 4 value heads of 32 dims (ssm.inner_size 128), conv kernel 4
_HYBRID_SMALL = dict(
    n_layer=8,
    n_embd=256,
    n_head=4,
    n_head_kv=2,
    head_dim_k=64,
    head_dim_v=64,
    n_rot=16,
    n_ctx_train=4096,
    rope_freq_base=10000000.0,
    full_attention_interval=4,
    ssm_d_conv=4,
    ssm_d_state=32,
    ssm_n_group=2,
    ssm_dt_rank=4,
)
# Qwen3-Next: MoE with a shared expert, fused ssm_ba, no full_attention_interval key (default 4)
SMALL_MODELS["qwen3next"] = ModelSpec(
    name="synth-qwen3next",
    arch="qwen3next",
    n_ff=512,
    n_expert=8,
    n_expert_used=2,
    n_ff_exp=128,
    n_ff_shexp=128,
    tokenizer=_bpe(1024, "qwen2", 1000),
    quant=Q4_K_M,
    **_HYBRID_SMALL,  # type: ignore[arg-type]
)
# Qwen3.5 MoE: split ssm_beta/ssm_alpha, the interval key, M-RoPE sections
SMALL_MODELS["qwen35moe"] = replace(
    SMALL_MODELS["qwen3next"],
    name="synth-qwen35moe",
    arch="qwen35moe",
    n_ff=0,
    write_attention_interval=True,
    tokenizer=_bpe(1024, "qwen35", 1000),
    extra_kv={"rope.dimension_sections": (3, 3, 2, 0)},
)
# Qwen3.5 MoE with its MTP block (block_count 9, nextn_predict_layers 1: a full-attention layer with the
# NextN projections, no embed_tokens/shared_head_head of its own): --spec-type draft-mtp
SMALL_MODELS["qwen35moe-mtp"] = replace(
    SMALL_MODELS["qwen35moe"], name="synth-qwen35moe-mtp", n_layer=9, n_nextn=1, nextn_embed_head=False
)
# Qwen3.5 dense: the same layers with a dense FFN
SMALL_MODELS["qwen35"] = replace(
    SMALL_MODELS["qwen35moe"],
    name="synth-qwen35",
    arch="qwen35",
    n_ff=512,
    n_expert=0,
    n_expert_used=0,
    n_ff_exp=0,
    n_ff_shexp=0,
)

# Qwen3.8-Flash-Next's architecture (qwen4exp, src/models/qwen4exp.cpp): Qwen3.5 MoE's layers (attention 3 and
# 7) with two residual streams (hyper-connections, low rank 16) and no layer norms, and the QSA indexer on
# the attention layers (2 heads of 32, top-k 64, keys pooled by 4: compress ratio 4 on layers 3 and 7), so
# llama_memory_hybrid_idx adds an indexer cache of 32 x 2 (key | pooled) per attention layer; no PLE
SMALL_MODELS["qwen4exp"] = replace(
    SMALL_MODELS["qwen35moe"],
    name="synth-qwen4exp",
    arch="qwen4exp",
    extra_kv={
        "rope.dimension_sections": (3, 3, 2, 0),
        "hyper_connection.count": 2,
        "hyper_connection.low_rank": 16,
        "attention.indexer.head_count": 2,
        "attention.indexer.key_length": 32,
        "attention.indexer.top_k": 64,
        "attention.compress_ratios": (0, 0, 0, 4, 0, 0, 0, 4),
    },
)

# ... with its MTP block (block_count 9, nextn_predict_layers 1: a QSA layer, compress ratio 4 too, with
# the NextN projections and its own hyper-connection head): --spec-type draft-mtp; 4 experts (8 would
# take the file past a few MB)
SMALL_MODELS["qwen4exp-mtp"] = replace(
    SMALL_MODELS["qwen4exp"],
    name="synth-qwen4exp-mtp",
    n_layer=9,
    n_nextn=1,
    n_expert=4,
    extra_kv={**SMALL_MODELS["qwen4exp"].extra_kv, "attention.compress_ratios": (0, 0, 0, 4, 0, 0, 0, 4, 4)},
)

# ... with PLE n-gram embeddings on layer 1 (a linear layer): 3-grams, 2 heads a gram (4 heads of 64 rows
# in a 256-row table: 4 x 64 = n_embd, as the key projection wants), conv kernel 4, so layer 1 keeps a
# third recurrent row cache_ple_r_l of (4 - 1) x 3 x 2 x 256 = 4608 f32 per cell
SMALL_MODELS["qwen4exp-ple"] = replace(
    SMALL_MODELS["qwen4exp"],
    name="synth-qwen4exp-ple",
    extra_kv={
        **SMALL_MODELS["qwen4exp"].extra_kv,
        "ple.layers": (1,),
        "ple.ngram_size": 3,
        "ple.heads_per_ngram": 2,
        "ple.conv_kernel": 4,
        "ple.eos_token_id": 1017,
        "embedding_length_per_layer_input": 64,
        "ple.layer_multipliers": (1000003, 999983, 998244353),
        "ple.head_offsets": (0, 64, 128, 192),
        "ple.head_vocab_sizes": (64, 64, 64, 64),
    },
)

# GLM-5.3-Flash's architecture (glm5-next, src/models/glm5-next.cpp): kimi-linear's KDA layers where
# head_count_kv is 0 (0-2, 4-6; KDA heads of 32), nope-only MLA on 3 and 7 (one 128-wide latent head, the
# K-only cache: key_length 128, rope.dimension_count 0) with a k-pool DSA indexer (2 heads of 32, pools of
# 4: llama_memory_hybrid_idx keeps 32 x 3 per cell), 4 mHC streams, a leading dense FFN then experts
SMALL_MODELS["glm5-next"] = ModelSpec(
    name="synth-glm5-next",
    arch="glm5-next",
    n_layer=8,
    n_embd=256,
    n_head=4,
    n_head_kv=(0, 0, 0, 1, 0, 0, 0, 1),
    head_dim_k=128,
    head_dim_v=128,
    n_ff=512,
    n_expert=8,
    n_expert_used=2,
    n_expert_shared=1,
    n_ff_exp=128,
    n_layer_dense_lead=1,
    q_lora_rank=64,
    kv_lora_rank=128,
    key_length_mla=64,
    value_length_mla=32,
    n_ctx_train=4096,
    rms_eps=1e-5,
    tokenizer=_bpe(1024, "default", 1000),
    quant=Q4_K_M,
    extra_kv={
        "rope.dimension_count": 0,
        "kda.head_dim": 32,
        "ssm.conv_kernel": 4,
        "attention.indexer.head_count": 2,
        "attention.indexer.key_length": 32,
        "attention.indexer.top_k": 64,
        "attention.indexer.kpool": 4,
        "hyper_connection.count": 4,
        "hyper_connection.sinkhorn_iterations": 20,
        "hyper_connection.epsilon": 1e-6,
        "expert_gating_func": 2,
    },
)

# ... with a shared indexer on layer 7 (attention.indexer.types 0: it reuses layer 3's selection and caches
# no indexer keys of its own)
SMALL_MODELS["glm5-next-shared"] = replace(
    SMALL_MODELS["glm5-next"],
    name="synth-glm5-next-shared",
    extra_kv={**SMALL_MODELS["glm5-next"].extra_kv, "attention.indexer.types": (1, 1, 1, 1, 1, 1, 1, 0)},
)

# Nemotron-H MoE: Mamba2 (M), attention (*) and MoE (E) blocks as its hybrid_override_pattern orders them
# (8 here: 3 Mamba2, 2 attention, 3 MoE); the Mamba2 mixer: 8 heads of 64 (ssm.inner_size 512), 2 groups,
# state 32; MoE: up/down experts (relu^2, no gate) with sigmoid routing and an up/down shared expert
SMALL_MODELS["nemotron_h_moe"] = ModelSpec(
    name="synth-nemotron_h_moe",
    arch="nemotron_h_moe",
    n_layer=8,
    layer_pattern="MEM*EME*",
    n_embd=256,
    n_head=4,
    n_head_kv=2,
    head_dim_k=64,
    head_dim_v=64,
    n_ctx_train=4096,
    n_expert=8,
    n_expert_used=2,
    n_ff_exp=128,
    n_ff_shexp=256,
    ssm_d_conv=4,
    ssm_d_state=32,
    ssm_n_group=2,
    ssm_dt_rank=8,
    ssm_inner=512,
    rms_eps=1e-5,
    tokenizer=_bpe(1024, "default", 1000),
    quant=Q4_K_M,
    extra_kv={"attention.layer_norm_epsilon": 1e-5, "expert_weights_norm": True,
              "expert_weights_scale": 2.5, "expert_shared_count": 1},
)

# Kimi-Linear: KDA (recurrent: head_count_kv 0) and MLA layers 3:1, MLA without q compression and with
# split k_b/v_b (its cache: one 160-wide K row, kv_lora_rank 128 + 32 rope dims), a leading dense layer,
# then 8 experts / 2 used with a shared expert and sigmoid gating; KDA heads of 32 dims, conv kernel 4
SMALL_MODELS["kimi-linear"] = ModelSpec(
    name="synth-kimi-linear",
    arch="kimi-linear",
    n_layer=8,
    n_embd=256,
    n_head=4,
    n_head_kv=(0, 0, 0, 1, 0, 0, 0, 1),
    head_dim_k=128 + 32,
    head_dim_v=128,
    n_rot=32,
    n_ff=512,
    n_expert=8,
    n_expert_used=2,
    n_expert_shared=1,
    n_ff_exp=128,
    n_layer_dense_lead=1,
    kv_lora_rank=128,
    key_length_mla=64,
    value_length_mla=32,
    n_ctx_train=4096,
    rms_eps=1e-5,
    tokenizer=_bpe(1024, "default", 1000),
    quant=Q4_K_M,
    extra_kv={"ssm.conv_kernel": 4, "kda.head_dim": 32, "expert_gating_func": 2,
              "expert_weights_scale": 2.5, "expert_weights_norm": True},
)

# Kimi-K3: kimi-linear's layer split (KDA where head_count_kv is 0) with its full-rank KDA gate, situ
# activations and no cross-layer residual attention (attn_res.block_size 0)
SMALL_MODELS["kimi-k3"] = replace(
    SMALL_MODELS["kimi-linear"],
    name="synth-kimi-k3",
    arch="kimi-k3",
    extra_kv={**SMALL_MODELS["kimi-linear"].extra_kv, "attn_res.block_size": 0,
              "activation.situ_beta": 1.0, "activation.situ_linear_beta": 0.0},
)

# Granite hybrid (Granite 4.0-H): a Mamba2 mixer where head_count_kv is 0 (6 of 8 layers), attention in
# layers 3 and 7, every layer an MoE FFN of feed_forward_length with a shared expert
SMALL_MODELS["granitehybrid"] = ModelSpec(
    name="synth-granitehybrid",
    arch="granitehybrid",
    n_layer=8,
    n_embd=256,
    n_head=4,
    n_head_kv=(0, 0, 0, 2, 0, 0, 0, 2),
    head_dim_k=64,
    head_dim_v=64,
    n_ff=128,
    n_expert=8,
    n_expert_used=2,
    n_ff_exp=128,
    n_ff_shexp=256,
    n_ctx_train=4096,
    ssm_d_conv=4,
    ssm_d_state=32,
    ssm_n_group=1,
    ssm_dt_rank=8,
    ssm_inner=512,
    rms_eps=1e-5,
    tokenizer=_bpe(1024, "default", 1000),
    quant=Q4_K_M,
)

# DeepSeek-V3 layout: the trunk plus one NextN/MTP block (block_count = trunk + 1), which llama-server
# loads with --spec-type draft-mtp; without the block's own embed_tokens/shared_head_head (optional in
# llama.cpp: the MTP graph then reads token_embd and output), so both paths are tested with glm4moe
SMALL_MODELS["deepseek2-mtp"] = replace(
    SMALL_MODELS["deepseek2"], name="synth-deepseek2-mtp", n_layer=4, n_nextn=1, nextn_embed_head=False
)
# DeepSeek Sparse Attention (src/models/deepseek32.cpp, glm-dsa.cpp): deepseek2's MLA plus a lightning
# indexer per layer (its own MQA key cache: llama_kv_cache_dsa) and one NextN/MTP block, as the V3.2 and
# GLM-5 converters write them (conversion/deepseek.py DeepseekV32Model, conversion/glm.py GlmMoeDsaModel)
_DSA_SMALL_KV = {
    "attention.indexer.head_count": 4,
    "attention.indexer.key_length": 64,
    "attention.indexer.top_k": 128,
}
SMALL_MODELS["deepseek32"] = replace(
    SMALL_MODELS["deepseek2"], name="synth-deepseek32", arch="deepseek32", n_layer=5, n_nextn=1,
    nextn_embed_head=False, quant=Q4_K_M,  # smaller than deepseek2's mix: under the 8 MB of a small model
    extra_kv={**SMALL_MODELS["deepseek2"].extra_kv, **_DSA_SMALL_KV},
)
# GLM-5.2 style: ``attention.indexer.types`` marks the layers with their own indexer (the others reuse
# the last full layer's top-k), so the indexer cache holds only those layers
SMALL_MODELS["glm-dsa"] = replace(
    SMALL_MODELS["deepseek32"], name="synth-glm-dsa", arch="glm-dsa", rms_eps=1e-5,
    rope_freq_base=1000000.0, tokenizer=_bpe(1024, "glm4", 1500),
    extra_kv={"expert_weights_scale": 2.5, "expert_weights_norm": True, "expert_gating_func": 2,
              **_DSA_SMALL_KV, "attention.indexer.types": (True, False, True, False)},
)
# A speculative-decoding draft for "llama": the same vocabulary, fewer layers (llama-server -md)
SMALL_MODELS["llama-draft"] = replace(SMALL_MODELS["llama"], name="synth-llama-draft", n_layer=2)


def _dsv4_kv(ratios: tuple[int, ...], n_layer: int, *, o_groups: int, o_rank: int, idx_heads: int,
             idx_dim: int, hash_layers: int) -> dict[str, KvValue]:
    """DeepSeek V4's own keys as convert_hf_to_gguf (conversion/deepseek.py set_gguf_parameters) writes
    them; the rest (routed scale 1.5, swiglu limit 10, top-k 512, compress rope 160000, 4 hyper-connections
    of 20 Sinkhorn iterations, eps 1e-6, sqrtsoftplus gating 4) are V4-Flash's config.json values."""
    return {
        "expert_weights_scale": 1.5,
        "expert_weights_norm": True,
        "expert_gating_func": 4,  # LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS
        "swiglu_clamp_exp": (10.0,) * n_layer,
        "swiglu_clamp_shexp": (10.0,) * n_layer,
        "attention.indexer.head_count": idx_heads,
        "attention.indexer.key_length": idx_dim,
        "attention.indexer.top_k": 512,
        "attention.output_group_count": o_groups,
        "attention.output_lora_rank": o_rank,
        "attention.compress_ratios": ratios,
        "attention.compress_rope_freq_base": 160000.0,
        "hyper_connection.count": 4,
        "hyper_connection.sinkhorn_iterations": 20,
        "hyper_connection.epsilon": 1e-6,
        "hash_layer_count": hash_layers,
    }


# DeepSeek V4 (deepseek4): 8 blocks, V4-Flash's pattern of ratios shortened (window-only 0-1, then CSA (4)
# and HCA (128) alternating), one 128-wide K/V head, 4 query heads in 2 output groups, a 2x64 lightning
# indexer; no hash-routed block (its I32 tid2eid table would need real expert ids to run)
SMALL_MODELS["deepseek4"] = ModelSpec(
    name="synth-deepseek4",
    arch="deepseek4",
    n_layer=8,
    n_embd=256,
    n_head=4,
    n_head_kv=1,
    head_dim_k=128,
    head_dim_v=128,
    n_rot=64,
    n_expert=4,
    n_expert_used=2,
    n_expert_shared=1,
    n_ff_exp=128,
    q_lora_rank=256,
    sliding_window=128,
    n_ctx_train=8192,
    rope_freq_base=10000.0,
    rms_eps=1e-6,
    tokenizer=_bpe(1024, "joyai-llm", 1000),
    quant=Q4_K_M,
    extra_kv=_dsv4_kv((0, 0, 4, 128, 4, 128, 4, 128), 8, o_groups=2, o_rank=256, idx_heads=2,
                      idx_dim=64, hash_layers=0),
)
# ... with its MTP block (block_count 5, nextn_predict_layers 1: blocks 0-3 the trunk, 4 the NextN block
# with its own ratio 0, as V4-Flash's last compress_ratios entry): --spec-type draft-mtp
SMALL_MODELS["deepseek4-mtp"] = replace(
    SMALL_MODELS["deepseek4"], name="synth-deepseek4-mtp", n_layer=5, n_nextn=1, nextn_embed_head=False,
    extra_kv=_dsv4_kv((0, 4, 128, 4, 0), 5, o_groups=2, o_rank=256, idx_heads=2, idx_dim=64, hash_layers=0),
)

# --- real shapes, header-only ----------------------------------------------------------------

_DEEPSEEK_V3 = ModelSpec(
    name="DeepSeek V3",
    arch="deepseek2",
    n_layer=61,
    n_embd=7168,
    n_head=128,
    n_head_kv=1,
    head_dim_k=576,
    head_dim_v=512,
    n_rot=64,
    n_ff=18432,
    n_expert=256,
    n_expert_used=8,
    n_expert_shared=1,
    n_ff_exp=2048,
    n_layer_dense_lead=3,
    q_lora_rank=1536,
    kv_lora_rank=512,
    key_length_mla=192,
    value_length_mla=128,
    n_ctx_train=163840,
    rope_freq_base=10000.0,
    rope_scaling=RopeScaling("yarn", 40.0, 4096, 0.1),
    rms_eps=1e-6,
    tokenizer=_bpe(129280, "deepseek-v3", 127741, n_special=818),
    quant=Q4_K_M,
    extra_kv={
        "expert_weights_scale": 2.5,
        "expert_weights_norm": True,
        "expert_gating_func": 2,
        "expert_group_count": 8,
        "expert_group_used_count": 4,
    },
)



def _qwen3moe(name: str, n_layer: int, n_embd: int, n_head: int, n_ff: int, n_ff_exp: int) -> ModelSpec:
    """Qwen3 MoE: 128 experts / 8 used, GQA with 4 KV heads of 128 dims, q/k norms, untied."""
    return ModelSpec(
        name=name,
        arch="qwen3moe",
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=4,
        head_dim_k=128,
        head_dim_v=128,
        n_ff=n_ff,
        n_expert=128,
        n_expert_used=8,
        n_ff_exp=n_ff_exp,
        n_ctx_train=40960,
        rope_freq_base=1000000.0,
        qk_norm=True,
        tokenizer=_bpe(151936, "qwen2", 151387, n_special=293),
        quant=Q4_K_M,
    )


# DeepSeek V4 Flash (284B): https://huggingface.co/deepseek-ai/DeepSeek-V4-Flash/blob/main/config.json
# (hidden 4096, 43 layers, 64 heads of 512 with 1 KV head, rope 64, q_lora 1024, o_groups 8 x o_lora 1024,
# 256 experts of 2048 (6 used) + 1 shared, 3 hash layers, window 128, indexer 64 x 128, compress_ratios
# below: 43 blocks + the MTP block's 0, which the converter writes too; yarn 16 over 65536, vocab 129280,
# context 1048576).  The MTP block's tensors are not written.  tokenizer.ggml.pre "joyai-llm" as the
# published GGUFs carry it (github.com/antirez/llama.cpp-deepseek-v4-flash issue 11's log); the merges and
# special-token counts only size the header and are V3's (same 129280 vocabulary), not read from a V4 file.
_DSV4_FLASH_RATIOS = (0, 0, *((4, 128) * 20), 4, 0)
_DEEPSEEK_V4_FLASH = ModelSpec(
    name="DeepSeek V4 Flash",
    arch="deepseek4",
    n_layer=43,
    n_embd=4096,
    n_head=64,
    n_head_kv=1,
    head_dim_k=512,
    head_dim_v=512,
    n_rot=64,
    n_expert=256,
    n_expert_used=6,
    n_expert_shared=1,
    n_ff_exp=2048,
    q_lora_rank=1024,
    sliding_window=128,
    n_ctx_train=1048576,
    rope_freq_base=10000.0,
    rope_scaling=RopeScaling("yarn", 16.0, 65536),
    rms_eps=1e-6,
    tokenizer=_bpe(129280, "joyai-llm", 127741, n_special=818),
    quant=Q4_K_M,
    extra_kv=_dsv4_kv(_DSV4_FLASH_RATIOS, 43, o_groups=8, o_rank=1024, idx_heads=64, idx_dim=128,
                      hash_layers=3),
)

BIG_MODELS: dict[str, ModelSpec] = {
    "DeepSeek-V4-Flash-Q4_K_M": _DEEPSEEK_V4_FLASH,
    # 61 layers (3 dense), 256 experts / 8 used / 1 shared, MLA with split k_b/v_b: 1086 tensors
    "DeepSeek-V3-Q4_K_M": _DEEPSEEK_V3,
    "Qwen3-235B-A22B-Q4_K_M": _qwen3moe("Qwen3 235B A22B", 94, 4096, 64, 12288, 1536),
    "Qwen3-30B-A3B-Q4_K_M": _qwen3moe("Qwen3 30B A3B", 48, 2048, 32, 6144, 768),
    # 46 trunk layers + 1 NextN block (block_count 47), 1 dense lead layer: 803 tensors
    "GLM-4.5-Air-Q4_K_M": ModelSpec(
        name="GLM 4.5 Air",
        arch="glm4moe",
        n_layer=47,
        n_nextn=1,
        n_embd=4096,
        n_head=96,
        n_head_kv=8,
        head_dim_k=128,
        head_dim_v=128,
        n_rot=64,
        n_ff=10944,
        n_expert=128,
        n_expert_used=8,
        n_expert_shared=1,
        n_ff_exp=1408,
        n_layer_dense_lead=1,
        n_ctx_train=131072,
        rope_freq_base=1000000.0,
        rms_eps=1e-5,
        attn_bias=True,
        tokenizer=_bpe(151552, "glm4", 318088, n_special=223),
        quant=Q4_K_M,
        extra_kv={
            "expert_weights_scale": 1.0,
            "expert_weights_norm": True,
            "expert_gating_func": 2,
        },
    ),
    # 36 layers, 128 experts / 4 used, MXFP4 experts, q8_0 elsewhere: 687 tensors
    "gpt-oss-120b-MXFP4": ModelSpec(
        name="gpt-oss-120b",
        arch="gpt-oss",
        n_layer=36,
        n_embd=2880,
        n_head=64,
        n_head_kv=8,
        head_dim_k=64,
        head_dim_v=64,
        n_rot=64,
        n_ff=2880,
        n_expert=128,
        n_expert_used=4,
        n_ff_exp=2880,
        sliding_window=128,
        n_ctx_train=131072,
        rope_freq_base=150000.0,
        rope_scaling=RopeScaling("yarn", 32.0, 4096),
        rms_eps=1e-5,
        attn_bias=True,
        tokenizer=_bpe(201088, "gpt-4o", 446189, n_special=1088),
        quant=MXFP4_MOE,
    ),
    # 80 layers, GQA 64/8, rope_freqs: 724 tensors
    "Llama-3.1-70B-Q4_K_M": ModelSpec(
        name="Llama 3.1 70B",
        arch="llama",
        n_layer=80,
        n_embd=8192,
        n_head=64,
        n_head_kv=8,
        n_rot=128,
        n_ff=28672,
        n_ctx_train=131072,
        rope_freq_base=500000.0,
        rope_freqs=True,
        rms_eps=1e-5,
        tokenizer=_bpe(128256, "llama-bpe", 280147, n_special=256),
        quant=Q4_K_M_70B,
    ),
    # meta-llama/Llama-3.2-3B config.json: hidden_size 3072, 28 layers, 24 heads / 8 KV heads,
    # intermediate_size 8192, vocab 128256, tie_word_embeddings true, rope_theta 500000 with llama3
    # rope scaling (rope_freqs), rms_norm_eps 1e-5, max_position_embeddings 131072; llama.cpp names its
    # 28-layer llama "3B" (src/models/llama.cpp: "case 28: type = LLM_TYPE_3B; break; // Llama 3.2 3B")
    "Llama-3.2-3B-Q4_K_M": ModelSpec(
        name="Llama 3.2 3B",
        arch="llama",
        n_layer=28,
        n_embd=3072,
        n_head=24,
        n_head_kv=8,
        n_rot=128,
        n_ff=8192,
        n_ctx_train=131072,
        rope_freq_base=500000.0,
        rope_freqs=True,
        rms_eps=1e-5,
        tied_embeddings=True,
        tokenizer=_bpe(128256, "llama-bpe", 280147, n_special=256),
        quant=Q4_K_M,
    ),
    # mistral-community/Mixtral-8x22B-v0.1 config.json (WizardLM-2-8x22B is a fine-tune of it): hidden_size
    # 6144, 56 layers, 48 heads / 8 KV heads, 8 local experts / 2 per token of intermediate_size 16384,
    # vocab 32000, rope_theta 1e6, rms_norm_eps 1e-5, max_position_embeddings 65536, untied.  llama.cpp
    # converts Mixtral to arch llama, the experts sized by feed_forward_length (src/models/llama.cpp:
    # ffn_gate_exps {n_embd, n_ff, n_expert})
    "Mixtral-8x22B-Q4_K_M": ModelSpec(
        name="Mixtral 8x22B",
        arch="llama",
        n_layer=56,
        n_embd=6144,
        n_head=48,
        n_head_kv=8,
        n_rot=128,
        n_ff=16384,
        n_expert=8,
        n_expert_used=2,
        n_ff_exp=16384,
        n_ctx_train=65536,
        rope_freq_base=1000000.0,
        rms_eps=1e-5,
        tokenizer=TokenizerSpec(TokenizerKind.SPM, 32000, n_special=3),
        quant=Q4_K_M,
    ),
    # deepseek-ai/DeepSeek-V2-Lite config.json: hidden_size 2048, 27 layers (first_k_dense_replace 1),
    # 16 heads, intermediate_size 10944, 64 routed experts / 6 per token / 2 shared of
    # moe_intermediate_size 1408, q_lora_rank null, kv_lora_rank 512, qk_nope 128 + qk_rope 64, v_head 128,
    # vocab 102400, softmax gating, routed_scaling_factor 1.0; GGUF keys as llama.cpp issue 7652 prints them
    # ("deepseek2.expert_feed_forward_length u32 = 1408", "expert_count u32 = 64", "expert_shared_count
    # u32 = 2", "expert_weights_scale f32 = 1.000000", "rope.scaling.factor f32 = 40.000000",
    # "yarn_log_multiplier f32 = 0.070700").  MLA written as the current convert does (the V3 entry's
    # layout: split attn_k_b/attn_v_b, one 576-wide KV head).  The merges and control-token counts are not
    # from a source (they size only the header)
    "DeepSeek-V2-Lite-Q4_K_M": replace(
        _DEEPSEEK_V3,
        name="DeepSeek V2 Lite",
        n_layer=27,
        n_embd=2048,
        n_head=16,
        n_ff=10944,
        n_expert=64,
        n_expert_used=6,
        n_expert_shared=2,
        n_ff_exp=1408,
        n_layer_dense_lead=1,
        q_lora_rank=0,
        rope_scaling=RopeScaling("yarn", 40.0, 4096, 0.0707),
        tokenizer=_bpe(102400, "deepseek-llm", 99757, n_special=15),
        extra_kv={"expert_weights_scale": 1.0, "expert_gating_func": 1},
    ),
    # Qwen3-Next-80B-A3B, from its GGUF's keys as llama.cpp issue 17578 prints them
    # (https://github.com/ggml-org/llama.cpp/issues/17578: embedding_length 2048, feed_forward_length 5120,
    # head_count 16, head_count_kv 2, rope.freq_base 10000000, layer_norm_rms_epsilon 1e-6,
    # expert_used_count 10, key_length/value_length 256, expert_count 512, expert_feed_forward_length 512,
    # expert_shared_feed_forward_length 512, ssm.conv_kernel 4) and issue 19345
    # (https://github.com/ggml-org/llama.cpp/issues/19345: ssm.state_size 128, group_count 16,
    # time_step_rank 32, inner_size 4096, rope.dimension_count 64); print_info in PR 16095
    # (https://github.com/ggml-org/llama.cpp/pull/16095): n_layer 48, n_ctx_train 262144; config.json
    # (Qwen/Qwen3-Next-80B-A3B-Instruct): full_attention_interval 4 (no key in the GGUF: llama.cpp's
    # default 4).  843 tensors as current converts write them (attn_qkv + attn_gate; ik_llama.cpp PR 1251's
    # log of a 48-layer Qwen3-Next file: "843 tensors").  The vocabulary is Qwen3's (151936, as the
    # Qwen3 entries here; its merges and control-token counts size only the header)
    "Qwen3-Next-80B-A3B-Q4_K_M": ModelSpec(
        name="Qwen3 Next 80B A3B",
        arch="qwen3next",
        n_layer=48,
        n_embd=2048,
        n_head=16,
        n_head_kv=2,
        head_dim_k=256,
        head_dim_v=256,
        n_rot=64,
        n_ff=5120,
        n_expert=512,
        n_expert_used=10,
        n_ff_exp=512,
        n_ff_shexp=512,
        n_ctx_train=262144,
        rope_freq_base=10000000.0,
        full_attention_interval=4,
        ssm_d_conv=4,
        ssm_d_state=128,
        ssm_n_group=16,
        ssm_dt_rank=32,
        tokenizer=_bpe(151936, "qwen2", 151387, n_special=293),
        quant=Q4_K_M,
    ),
    # Qwen3.5-397B-A17B text_config (config.json as ai-dynamo/aiconfigurator keeps it:
    # https://github.com/ai-dynamo/aiconfigurator/blob/87fe4b0c7ef0004cbd45263de0be8aa89be5ebad/src/aiconfigurator/model_configs/Qwen--Qwen3.5-397B-A17B_config.json):
    # hidden_size 4096, 60 layers (full_attention every 4th), 32 heads / 2 KV heads of head_dim 256,
    # 512 experts / 10 per token of moe_intermediate_size 1024, shared expert 1024, linear attention 16
    # key heads / 64 value heads of 128 dims, conv kernel 4, vocab 248320, max_position_embeddings 262144,
    # rms_norm_eps 1e-6, untied; its GGUF keys as llama.cpp PR 22616 prints them
    # (https://github.com/ggml-org/llama.cpp/pull/22616: ssm.time_step_rank 64, inner_size 8192,
    # full_attention_interval 4, rope.dimension_count 64) and the Qwen3.5 GGUFs' rope.dimension_sections
    # [11, 11, 10, 0], rope.freq_base 10000000 (ik_llama.cpp issue 1432).  Written without its MTP block
    # (block_count 60).  The merges and control-token counts are not from a source (they size only the header)
    "Qwen3.5-397B-A17B-Q4_K_M": ModelSpec(
        name="Qwen3.5 397B A17B",
        arch="qwen35moe",
        n_layer=60,
        n_embd=4096,
        n_head=32,
        n_head_kv=2,
        head_dim_k=256,
        head_dim_v=256,
        n_rot=64,
        n_expert=512,
        n_expert_used=10,
        n_ff_exp=1024,
        n_ff_shexp=1024,
        n_ctx_train=262144,
        rope_freq_base=10000000.0,
        full_attention_interval=4,
        write_attention_interval=True,
        ssm_d_conv=4,
        ssm_d_state=128,
        ssm_n_group=16,
        ssm_dt_rank=64,
        tokenizer=_bpe(248320, "qwen35", 247587, n_special=733),
        quant=Q4_K_M,
        extra_kv={"rope.dimension_sections": (11, 11, 10, 0)},
    ),
    # NVIDIA Nemotron 3 Nano 30B-A3B: config.json of nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16
    # (https://huggingface.co/nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16/blob/main/config.json, as public code
    # quotes it): hidden_size 2688, 52 layers of hybrid_override_pattern
    # "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME", 32 heads / 2 KV heads of 128, 128 routed
    # experts / 6 per token of 1856 and a shared expert of 3712, mamba 64 heads x 64 (inner 4096), 8 groups,
    # state 128, conv 4, vocab 131072, max_position_embeddings 262144, untied; its GGUF keys as llama.cpp
    # issue 20570 prints them (https://github.com/ggml-org/llama.cpp/issues/20570: feed_forward_length
    # arr[52] = [0, 1856, 0, 1856, 0, 0, 1856, ...], head_count_kv arr[52] = [0, 0, 0, 0, 0, 2, ...],
    # layer_norm(_rms)_epsilon 1e-5, expert_group_count 1, rope.dimension_count 84, ssm.time_step_rank
    # 64) and lmstudio-bug-tracker issue 1365 (expert_weights_norm true).  The merges and control-token
    # counts are not from a source (they size only the header)
    "Nemotron-3-Nano-30B-A3B-Q4_K_M": ModelSpec(
        name="Nemotron 3 Nano 30B A3B",
        arch="nemotron_h_moe",
        n_layer=52,
        layer_pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
        n_embd=2688,
        n_head=32,
        n_head_kv=2,
        head_dim_k=128,
        head_dim_v=128,
        n_rot=84,
        n_expert=128,
        n_expert_used=6,
        n_ff_exp=1856,
        n_ff_shexp=3712,
        n_ctx_train=262144,
        ssm_d_conv=4,
        ssm_d_state=128,
        ssm_n_group=8,
        ssm_dt_rank=64,
        ssm_inner=4096,
        rms_eps=1e-5,
        tokenizer=_bpe(131072, "default", 269443, n_special=1000),
        quant=Q4_K_M,
        extra_kv={"attention.layer_norm_epsilon": 1e-5, "expert_group_count": 1,
                  "expert_group_used_count": 1, "expert_shared_count": 1, "expert_weights_norm": True,
                  "expert_weights_scale": 2.5},
    ),
}

# DeepSeek-V3.2 (arch deepseek32) as convert_hf_to_gguf --outtype q8_0 writes it: DeepSeek-V3's shapes
# (its config, above; V3.2 keeps them: https://huggingface.co/deepseek-ai/DeepSeek-V3.2-Exp/blob/main/
# inference/config_671B_v3.2.json, mirrored at github.com/awesome-mini-project/DeepSeek-V3.2-Exp: dim 7168,
# 61 layers, 3 dense, 128 heads, q/kv lora 1536/512, 256 experts / 8 used / 1 shared, vocab 129280) plus
# the indexer (index_n_heads 64, index_head_dim 128, index_topk 2048, same file) and the NextN block the
# converter appends (DeepseekV32Model: block_count = 61 + num_nextn_predict_layers) with its own
# embed_tokens / shared_head_head.  Checked against llama-bench's line for DeepSeek-V3.2-Q8_0.gguf in
# https://github.com/ggml-org/llama.cpp/pull/23346 ("deepseek32 685B.A37B Q8_0 | 678.56 GiB | 685.36 B"):
# this spec has 685,355,329,792 parameters and 678.557 GiB of tensors (indexer.proj F32, as converted).
# The tokenizer is V3's (the V3.2 merge count is not published in a source at hand; header bytes only).
_Q8_0 = replace(MXFP4_MOE, name="Q8_0", ftype=FTYPE_Q8_0, exps=Q.Q8_0, exps_down=Q.Q8_0)
BIG_MODELS["DeepSeek-V3.2-Q8_0"] = replace(
    _DEEPSEEK_V3, name="DeepSeek V3.2", arch="deepseek32", n_layer=62, n_nextn=1, quant=_Q8_0,
    extra_kv={**_DEEPSEEK_V3.extra_kv, "attention.indexer.head_count": 64,
              "attention.indexer.key_length": 128, "attention.indexer.top_k": 2048},
)

# GLM-5.1 (arch glm-dsa) as convert_hf_to_gguf --outtype q8_0 writes it. From the GGUF's metadata dump in
# https://github.com/ikawrakow/ik_llama.cpp/issues/1616: block_count 79 (78 + 1 NextN), context 202752,
# embedding 6144, feed_forward 12288, 64 heads, head_count_kv 1, rope base 1e6 over 64 dims, rms eps 1e-5,
# value_length_mla 256, 256 experts of 2048 / 1 shared, weights scale 2.5 (normed), indexer 32 heads x 128,
# top-k 2048 (under 1M trained context: every layer has a full indexer, glm-dsa.cpp); the rest from the
# GLM-5 config as https://github.com/jd-opensource/xllm (xllm/models/llm/glm5.h) quotes it, which agrees
# with the dump on every figure both give: q_lora_rank 2048, kv_lora_rank 512, qk_nope 192 + rope 64
# (key_length_mla 256), 3 dense layers, 8 experts used.  Vocabulary 154880 tokens / 321649 merges: the
# GLM-5.2 dump of https://github.com/ikawrakow/ik_llama.cpp/issues/2032 (the same tokenizer); the
# control-token count (n_special) is not published there: GLM-4.5-Air's is used (header bytes only).
# The layout (indexer on every block, NextN block without embed_tokens / shared_head_head) gives 1809
# tensors: the count of that GLM-5.2 BF16 file.
BIG_MODELS["GLM-5.1-Q8_0"] = ModelSpec(
    name="GLM 5.1",
    arch="glm-dsa",
    n_layer=79,
    n_nextn=1,
    nextn_embed_head=False,
    n_embd=6144,
    n_head=64,
    n_head_kv=1,
    head_dim_k=512 + 64,
    head_dim_v=512,
    n_rot=64,
    n_ff=12288,
    n_expert=256,
    n_expert_used=8,
    n_expert_shared=1,
    n_ff_exp=2048,
    n_layer_dense_lead=3,
    q_lora_rank=2048,
    kv_lora_rank=512,
    key_length_mla=256,
    value_length_mla=256,
    n_ctx_train=202752,
    rope_freq_base=1000000.0,
    rms_eps=1e-5,
    tokenizer=_bpe(154880, "glm4", 321649, n_special=223),
    quant=_Q8_0,
    extra_kv={
        "expert_weights_scale": 2.5,
        "expert_weights_norm": True,
        "expert_gating_func": 2,
        "attention.indexer.head_count": 32,
        "attention.indexer.key_length": 128,
        "attention.indexer.top_k": 2048,
    },
)

# Complete models for speed measurements (bench/speed_measured.py): large enough (over 2 GB) that
# token generation on this machine's CPU is bound by memory bandwidth, small enough to write and
# load in seconds.  Written complete and filled with random weights (core/synth/random_fill.py).
BENCH_MODELS: dict[str, ModelSpec] = {
    # dense, Llama-2-7B-wide layers: every token reads every weight
    "bench-llama-2g": ModelSpec(
        name="bench-llama-2g",
        arch="llama",
        n_layer=20,
        n_embd=4096,
        n_head=32,
        n_head_kv=8,
        n_ff=11008,
        n_ctx_train=8192,
        rope_freq_base=500000.0,
        rms_eps=1e-5,
        tokenizer=_bpe(32000, "llama-bpe", 30000),
        quant=Q4_K_M,
    ),
    # Qwen3-style MoE, 64 experts / 8 used: a token reads attention and 1/8 of the experts
    "bench-qwen3moe-2g": ModelSpec(
        name="bench-qwen3moe-2g",
        arch="qwen3moe",
        n_layer=20,
        n_embd=2048,
        n_head=32,
        n_head_kv=4,
        head_dim_k=128,
        head_dim_v=128,
        n_ff=6144,
        n_expert=64,
        n_expert_used=8,
        n_ff_exp=512,
        n_ctx_train=8192,
        rope_freq_base=1000000.0,
        qk_norm=True,
        tokenizer=_bpe(32000, "qwen2", 30000),
        quant=Q4_K_M,
    ),
    # Qwen3-Next-style hybrid with Qwen3-Next-80B's gated-delta-net heads (16 key / 32 value heads of
    # 128: a 2 MiB f32 state per recurrent layer and sequence, which every token reads and writes) and
    # full attention every 4th layer; 40 experts / 8 used
    "bench-qwen3next-2g": ModelSpec(
        name="bench-qwen3next-2g",
        arch="qwen3next",
        n_layer=24,
        n_embd=2048,
        n_head=16,
        n_head_kv=2,
        head_dim_k=256,
        head_dim_v=256,
        n_rot=64,
        n_ff=5120,
        n_expert=40,
        n_expert_used=8,
        n_ff_exp=512,
        n_ff_shexp=512,
        n_ctx_train=8192,
        rope_freq_base=10000000.0,
        full_attention_interval=4,
        ssm_d_conv=4,
        ssm_d_state=128,
        ssm_n_group=16,
        ssm_dt_rank=32,
        tokenizer=_bpe(32000, "qwen2", 30000),
        quant=Q4_K_M,
    ),
}

# The header-only demo models shipped in resources/.
DEMO_MODELS: tuple[str, ...] = ("DeepSeek-V3-Q4_K_M", "Qwen3-30B-A3B-Q4_K_M")


def all_models() -> dict[str, ModelSpec]:
    return {**SMALL_MODELS, **BIG_MODELS}
