"""What a synthetic model is made of: hyper-parameters, tokenizer shape and quantization mix.

A :class:`ModelSpec` holds the values that llama.cpp reads from a GGUF header (``<arch>.*`` keys)
plus the choices a converter and ``llama-quantize`` would make (tied embeddings, tensor types).
The tensor list itself is derived from the spec by :mod:`offload_planner.core.synth.tensors`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gguf import GGMLQuantizationType as Q

from offload_planner.core.synth.ik_types import IkQ

# llama.cpp's ``llama_ftype`` values written as ``general.file_type``.
FTYPE_Q4_K_M = 15
FTYPE_Q8_0 = 7
FTYPE_MXFP4_MOE = 38

QType = Q | IkQ  # a mainline type (written through gguf-py) or an ik-only one

KvValue = int | float | bool | str | tuple[int, ...] | tuple[float, ...] | tuple[bool, ...]


class TokenizerKind(StrEnum):
    BPE = "gpt2"  # byte-level BPE with merges (Llama 3, Qwen, DeepSeek, GLM, gpt-oss)
    SPM = "llama"  # SentencePiece with scores and <0xXX> byte tokens (Gemma, Llama 2)


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """Shape of ``tokenizer.ggml.*``: sizes are real, token strings are synthetic but unique."""

    kind: TokenizerKind
    n_vocab: int
    pre: str = "default"  # tokenizer.ggml.pre (BPE only)
    n_merges: int = 0  # BPE: length of tokenizer.ggml.merges
    n_special: int = 8  # control tokens placed at the end of the vocabulary
    chat_template: str = ""


@dataclass(frozen=True, slots=True)
class RopeScaling:
    kind: str  # "yarn" | "linear" | "llama3" style is expressed with rope_freqs instead
    factor: float
    original_context_length: int
    yarn_log_multiplier: float | None = None


@dataclass(frozen=True, slots=True)
class QuantMix:
    """The ggml type of each tensor role, like a ``llama-quantize`` preset.

    ``more_bits`` replaces the type of ``attn_v``/``attn_kv_b`` and every ``ffn_down*`` tensor on
    the layers llama-quantize's ``use_more_bits`` picks (the Q4_K_M/Q5_K_M rule).  A type whose
    block size does not divide a tensor's ``ne0`` falls back as ``tensor_type_fallback`` does.
    """

    name: str
    ftype: int
    embd: QType
    output: QType
    attn: QType  # q/k/o projections, MLA q_a/q_b/kv_a_mqa/k_b/v_b
    attn_v: QType  # attn_v, attn_kv_b
    ffn: QType  # dense gate/up
    ffn_down: QType
    shexp: QType  # shared-expert gate/up
    shexp_down: QType
    exps: QType  # routed-expert gate/up
    exps_down: QType
    nextn: QType  # NextN/MTP projections (eh_proj, embed_tokens, shared_head_head)
    more_bits: QType | None = None
    router: QType = Q.F32  # ffn_gate_inp is never quantized
    small: QType = Q.F32  # 1-D tensors: norms, biases, sinks, exp_probs_b, rope_freqs
    ids: QType = Q.I32  # index tables (DeepSeek V4's hash routing ffn_gate_tid2eid)


@dataclass(frozen=True)
class ModelSpec:
    """Hyper-parameters of one model as its GGUF header states them.

    ``n_layer`` is ``<arch>.block_count`` and includes the ``n_nextn`` NextN/MTP blocks, which
    are the last blocks.  Head counts may be per-layer tuples of length ``n_layer``.
    """

    name: str  # general.name
    arch: str  # general.architecture
    n_layer: int
    n_embd: int
    n_head: int | tuple[int, ...]
    n_ctx_train: int
    tokenizer: TokenizerSpec
    quant: QuantMix
    n_head_kv: int | tuple[int, ...] | None = None  # None: same as n_head (key omitted)
    n_ff: int = 0  # dense feed_forward_length
    head_dim_k: int | None = None  # attention.key_length (None: n_embd / n_head)
    head_dim_v: int | None = None  # attention.value_length
    n_rot: int | None = None  # rope.dimension_count
    # mixture of experts
    n_expert: int = 0
    n_expert_used: int = 0
    n_expert_shared: int = 0
    n_ff_exp: int = 0
    n_layer_dense_lead: int = 0
    # multi-head latent attention (DeepSeek-V2/V3, Kimi-K2)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    key_length_mla: int = 0
    value_length_mla: int = 0
    # ik_llama.cpp's convert of 2025 (ubergarm's DeepSeek files): attn_kv_b and its split attn_k_b /
    # attn_v_b side by side, with the standard per-head key/value lengths (n_head_kv = n_head)
    kv_b_and_split: bool = False
    # sliding-window attention
    sliding_window: int = 0
    sliding_window_pattern: int | tuple[bool, ...] | None = None
    # NextN / multi-token-prediction blocks at the end of the trunk
    n_nextn: int = 0
    nextn_embed_head: bool = True  # NextN blocks carry embed_tokens + shared_head_head
    # hybrid attention + gated delta net (Qwen3-Next, Qwen3.5): every ``full_attention_interval``-th
    # trunk layer attends, the others are recurrent (llama.cpp ``is_recr_impl``, src/models/qwen3next.cpp)
    full_attention_interval: int = 0  # 0: no recurrent layers
    write_attention_interval: bool = False  # the ``full_attention_interval`` key (Qwen3.5 converts write it)
    ssm_d_conv: int = 0  # ssm.conv_kernel
    ssm_d_state: int = 0  # ssm.state_size: the head dimension of the delta net's keys and values
    ssm_n_group: int = 0  # ssm.group_count: key heads
    ssm_dt_rank: int = 0  # ssm.time_step_rank: value heads
    n_ff_shexp: int = 0  # expert_shared_feed_forward_length (0: key omitted)
    ssm_inner: int = 0  # ssm.inner_size when it is not value heads x state (Mamba2: heads x head_dim)
    # Nemotron-H: one character per trunk layer, as its config's hybrid_override_pattern: M Mamba2,
    # * attention, E MoE, - dense MLP; head_count_kv and feed_forward_length are written per layer from it
    layer_pattern: str = ""
    # misc
    rope_freq_base: float = 10000.0
    rope_scaling: RopeScaling | None = None
    rope_freqs: bool = False  # Llama-3.1 style per-dimension rope_freqs.weight
    rms_eps: float = 1e-6
    tied_embeddings: bool = False
    attn_bias: bool = False  # q/k/v biases (GLM-4.5, gpt-oss)
    qk_norm: bool = False  # attn_q_norm/attn_k_norm (Qwen3, Gemma 3)
    extra_kv: Mapping[str, KvValue] = field(default_factory=dict)  # "<arch>." is prepended
    # file order: output norm and output matrix before the token embedding (convert_hf_to_gguf keeps
    # the checkpoint's order, and many checkpoints list lm_head first)
    output_first: bool = False

    # --- derived values -------------------------------------------------------------------

    @property
    def n_layer_trunk(self) -> int:
        return self.n_layer - self.n_nextn

    def head_count(self, il: int) -> int:
        return self.n_head if isinstance(self.n_head, int) else self.n_head[il]

    def head_count_kv(self, il: int) -> int:
        h = self.n_head_kv if self.n_head_kv is not None else self.n_head
        return h if isinstance(h, int) else h[il]

    @property
    def key_length(self) -> int:
        return self.head_dim_k if self.head_dim_k else self.n_embd // self.head_count(0)

    @property
    def value_length(self) -> int:
        return self.head_dim_v if self.head_dim_v else self.n_embd // self.head_count(0)

    @property
    def rope_dim(self) -> int:
        return self.n_rot if self.n_rot else self.key_length

    @property
    def is_mla(self) -> bool:
        return self.key_length_mla > 0

    def is_recurrent(self, il: int) -> bool:
        """llama.cpp's default recurrent layers: ``(il + 1) % full_attention_interval != 0`` in the trunk."""
        return (self.full_attention_interval > 0 and il < self.n_layer_trunk
                and (il + 1) % self.full_attention_interval != 0)

    @property
    def ssm_d_inner(self) -> int:
        """ssm.inner_size: ``ssm_inner``, else as the Qwen converts write it: value heads x head dimension."""
        return self.ssm_inner or self.ssm_dt_rank * self.ssm_d_state

    def is_moe_layer(self, il: int) -> bool:
        return self.n_expert > 0 and il >= self.n_layer_dense_lead
