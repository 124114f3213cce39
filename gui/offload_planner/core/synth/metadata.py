"""GGUF key/value pairs of a :class:`ModelSpec`, typed the way ``convert_hf_to_gguf.py`` writes them."""

from __future__ import annotations

from typing import Any

from gguf import GGUFValueType

from offload_planner.core.synth.spec import KvValue, ModelSpec, TokenizerKind
from offload_planner.core.synth.tensors import LAYERNORM_ARCHS
from offload_planner.core.synth.vocab import Vocab

#: array keys convert_hf_to_gguf writes as uint64 (qwen4exp's PLE hash constants: the loader reads them
#: into uint64 arrays and refuses another element type)
UINT64_ARRAYS = frozenset({"ple.layer_multipliers", "ple.head_offsets", "ple.head_vocab_sizes"})


def _put(writer: Any, key: str, value: KvValue) -> None:
    """Scalars: bool -> bool, int -> uint32, float -> float32, str -> string; tuples -> arrays."""
    if isinstance(value, tuple) and key.split(".", 1)[-1] in UINT64_ARRAYS:
        writer.add_key_value(key, list(value), GGUFValueType.ARRAY, GGUFValueType.UINT64)
    elif isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        writer.add_array(key, list(value))


def _hparams(spec: ModelSpec) -> dict[str, KvValue]:
    kv: dict[str, KvValue] = {
        "block_count": spec.n_layer,
        "context_length": spec.n_ctx_train,
        "embedding_length": spec.n_embd,
    }
    if spec.n_ff:
        kv["feed_forward_length"] = spec.n_ff
    kv["attention.head_count"] = spec.n_head
    if spec.layer_pattern:  # Nemotron-H: per layer, 0 where the layer has no attention / no FFN
        kv["attention.head_count_kv"] = tuple(spec.head_count_kv(il) if c == "*" else 0
                                              for il, c in enumerate(spec.layer_pattern))
        kv["feed_forward_length"] = tuple({"E": spec.n_ff_exp, "-": spec.n_ff}.get(c, 0)
                                          for c in spec.layer_pattern)
    elif spec.n_head_kv is not None:
        kv["attention.head_count_kv"] = spec.n_head_kv
    kv["rope.freq_base"] = spec.rope_freq_base
    eps_key = "layer_norm_epsilon" if spec.arch in LAYERNORM_ARCHS else "layer_norm_rms_epsilon"
    kv[f"attention.{eps_key}"] = spec.rms_eps
    if spec.head_dim_k:
        kv["attention.key_length"] = spec.head_dim_k
    if spec.head_dim_v:
        kv["attention.value_length"] = spec.head_dim_v
    if spec.n_rot:
        kv["rope.dimension_count"] = spec.n_rot
    kv["vocab_size"] = spec.tokenizer.n_vocab
    if spec.n_expert:
        kv["expert_count"] = spec.n_expert
        kv["expert_used_count"] = spec.n_expert_used
        kv["expert_feed_forward_length"] = spec.n_ff_exp
    if spec.n_expert_shared:
        kv["expert_shared_count"] = spec.n_expert_shared
    if spec.n_ff_shexp:
        kv["expert_shared_feed_forward_length"] = spec.n_ff_shexp
    if spec.ssm_d_state:
        kv["ssm.conv_kernel"] = spec.ssm_d_conv
        kv["ssm.state_size"] = spec.ssm_d_state
        kv["ssm.group_count"] = spec.ssm_n_group
        kv["ssm.time_step_rank"] = spec.ssm_dt_rank
        kv["ssm.inner_size"] = spec.ssm_d_inner
    if spec.write_attention_interval:
        kv["full_attention_interval"] = spec.full_attention_interval
    if spec.n_layer_dense_lead:
        kv["leading_dense_block_count"] = spec.n_layer_dense_lead
    if spec.q_lora_rank:
        kv["attention.q_lora_rank"] = spec.q_lora_rank
    if spec.kv_lora_rank:
        kv["attention.kv_lora_rank"] = spec.kv_lora_rank
    if spec.key_length_mla:
        kv["attention.key_length_mla"] = spec.key_length_mla
        kv["attention.value_length_mla"] = spec.value_length_mla
    if spec.sliding_window:
        kv["attention.sliding_window"] = spec.sliding_window
    if spec.sliding_window_pattern is not None:
        kv["attention.sliding_window_pattern"] = spec.sliding_window_pattern
    if spec.n_nextn:
        kv["nextn_predict_layers"] = spec.n_nextn
    if spec.rope_scaling is not None:
        rs = spec.rope_scaling
        kv["rope.scaling.type"] = rs.kind
        kv["rope.scaling.factor"] = rs.factor
        kv["rope.scaling.original_context_length"] = rs.original_context_length
        if rs.yarn_log_multiplier is not None:
            kv["rope.scaling.yarn_log_multiplier"] = rs.yarn_log_multiplier
    kv.update(spec.extra_kv)
    return kv


def _tokenizer(writer: Any, spec: ModelSpec, vocab: Vocab) -> None:
    tok = spec.tokenizer
    writer.add_string("tokenizer.ggml.model", tok.kind.value)
    if tok.kind is TokenizerKind.BPE:
        writer.add_string("tokenizer.ggml.pre", tok.pre)
    writer.add_array("tokenizer.ggml.tokens", vocab.tokens)
    if vocab.scores:
        writer.add_array("tokenizer.ggml.scores", vocab.scores)
    writer.add_key_value(
        "tokenizer.ggml.token_type", vocab.types, GGUFValueType.ARRAY, GGUFValueType.INT32
    )
    if vocab.merges:
        writer.add_array("tokenizer.ggml.merges", vocab.merges)
    writer.add_uint32("tokenizer.ggml.bos_token_id", vocab.bos_id)
    writer.add_uint32("tokenizer.ggml.eos_token_id", vocab.eos_id)
    if vocab.unk_id is not None:
        writer.add_uint32("tokenizer.ggml.unknown_token_id", vocab.unk_id)
    writer.add_uint32("tokenizer.ggml.padding_token_id", vocab.pad_id)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_bool("tokenizer.ggml.add_eos_token", False)
    if tok.chat_template:
        writer.add_string("tokenizer.chat_template", tok.chat_template)


def write_metadata(writer: Any, spec: ModelSpec, vocab: Vocab) -> None:
    """Add every key of ``spec`` to a ``gguf.GGUFWriter`` (general.architecture is already set)."""
    writer.add_string("general.type", "model")
    writer.add_string("general.name", spec.name)
    for key, value in _hparams(spec).items():
        _put(writer, f"{spec.arch}.{key}", value)
    writer.add_uint32("general.file_type", spec.quant.ftype)
    writer.add_uint32("general.quantization_version", 2)
    _tokenizer(writer, spec, vocab)
