"""The GGUF model factory: tensor sets, types, vocabularies, header-only and split files.

Files are checked with the ``gguf`` package's own reader (small files only); that llama.cpp
loads them is checked in ``tests/integration/test_small_models_load.py``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType

from offload_planner.core.synth import (
    BIG_MODELS,
    DEMO_MODELS,
    SMALL_MODELS,
    ModelSpec,
    count_tensors,
    tensor_defs,
    total_tensor_bytes,
    write_model,
)
from offload_planner.core.synth.__main__ import main as synth_main
from offload_planner.core.synth.quant import block_size, pick_type, use_more_bits
from offload_planner.core.synth.vocab import make_vocab

RESOURCES = Path(__file__).resolve().parents[2] / "resources"
ALIGN = 32


def _pad(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _field(r: GGUFReader, key: str) -> object:
    f = r.fields[key]
    return f.contents()


def _type_counts(spec: ModelSpec) -> Counter[str]:
    return Counter(pick_type(spec, td).name for td in tensor_defs(spec))


# --- tensor sets of the real models ----------------------------------------------------------

# Tensor counts of the published GGUFs (llama.cpp's "loaded meta data with .. and N tensors").
PUBLISHED_TENSOR_COUNTS = {
    "DeepSeek-V3-Q4_K_M": 1086,  # split attn_k_b/attn_v_b (1025 with the legacy attn_kv_b)
    "Qwen3-235B-A22B-Q4_K_M": 1131,
    "Qwen3-30B-A3B-Q4_K_M": 579,
    "GLM-4.5-Air-Q4_K_M": 803,  # 46 layers + NextN block with embed_tokens/shared_head_head
    "gpt-oss-120b-MXFP4": 687,
    "Llama-3.1-70B-Q4_K_M": 724,  # incl. rope_freqs.weight
    # 48 layers (36 delta-net + 12 attention, attn_qkv + attn_gate): ik_llama.cpp PR 1251's log of a
    # 48-layer Qwen3-Next file, "843 tensors" (lmstudio's older file with the fused ssm_in: 807 = 843 - 36)
    "Qwen3-Next-80B-A3B-Q4_K_M": 843,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_TENSOR_COUNTS))
def test_big_model_tensor_counts_match_published_ggufs(name: str) -> None:
    assert count_tensors(BIG_MODELS[name]) == PUBLISHED_TENSOR_COUNTS[name]


def test_deepseek_v3_legacy_kv_b_layout_has_1025_tensors() -> None:
    legacy = replace(BIG_MODELS["DeepSeek-V3-Q4_K_M"], key_length_mla=0, value_length_mla=0)
    names = {td.name for td in tensor_defs(legacy)}
    assert len(names) == 1025
    assert "blk.0.attn_kv_b.weight" in names and "blk.0.attn_k_b.weight" not in names


def test_deepseek_v3_shapes() -> None:
    defs = {td.name: td for td in tensor_defs(BIG_MODELS["DeepSeek-V3-Q4_K_M"])}
    assert defs["blk.0.ffn_down.weight"].shape == (18432, 7168)
    assert "blk.2.ffn_down.weight" in defs and "blk.3.ffn_down.weight" not in defs
    assert defs["blk.3.ffn_down_exps.weight"].shape == (2048, 7168, 256)
    assert defs["blk.3.ffn_gate_shexp.weight"].shape == (7168, 2048)
    assert defs["blk.60.attn_k_b.weight"].shape == (128, 512, 128)
    assert defs["blk.60.attn_v_b.weight"].shape == (512, 128, 128)
    assert defs["blk.0.attn_kv_a_mqa.weight"].shape == (7168, 576)
    assert defs["blk.0.attn_q_b.weight"].shape == (1536, 128 * 192)
    assert defs["blk.5.exp_probs_b.bias"].shape == (256,)
    assert defs["token_embd.weight"].shape == (7168, 129280)


def test_gpt_oss_type_mix_matches_published_mxfp4_gguf() -> None:
    spec = BIG_MODELS["gpt-oss-120b-MXFP4"]
    # llama.cpp on ggml-org's gpt-oss-120b: f32 433, q8_0 146, mxfp4 108; "file size = 59.02 GiB"
    assert _type_counts(spec) == Counter({"F32": 433, "Q8_0": 146, "MXFP4": 108})
    assert f"{total_tensor_bytes(spec) / 2**30:.2f}" == "59.02"


def test_glm_air_nextn_block_is_the_last_block() -> None:
    spec = BIG_MODELS["GLM-4.5-Air-Q4_K_M"]
    assert (spec.n_layer, spec.n_nextn, spec.n_layer_trunk) == (47, 1, 46)
    nextn = [td.name for td in tensor_defs(spec) if ".nextn." in td.name]
    assert {n.split(".")[1] for n in nextn} == {"46"}
    assert len(nextn) == 6


# --- quantization rules ----------------------------------------------------------------------


def test_use_more_bits_matches_llama_quantize() -> None:
    # n=61 (DeepSeek-V3): first 7, last 8 (53..60), and every third layer in between
    chosen = [i for i in range(61) if use_more_bits(i, 61)]
    assert chosen[:9] == [0, 1, 2, 3, 4, 5, 6, 9, 12]
    assert chosen[-8:] == list(range(53, 61))


def test_k_quant_falls_back_when_row_length_is_not_a_multiple_of_256() -> None:
    spec = BIG_MODELS["GLM-4.5-Air-Q4_K_M"]  # n_ff_exp 1408, n_ff 10944: not multiples of 256
    defs = {td.name: td for td in tensor_defs(spec)}
    assert pick_type(spec, defs["blk.1.ffn_down_exps.weight"]) == Q.Q8_0  # q6_K -> q8_0
    assert pick_type(spec, defs["blk.8.ffn_down_exps.weight"]) == Q.Q5_0  # q4_K -> q5_0
    assert pick_type(spec, defs["blk.8.ffn_up_exps.weight"]) == Q.Q4_K
    for td in tensor_defs(spec):
        assert td.shape[0] % block_size(pick_type(spec, td)) == 0, td.name


def test_tied_embeddings_use_the_output_type() -> None:
    spec = SMALL_MODELS["gemma3"]
    assert spec.tied_embeddings
    embd = next(td for td in tensor_defs(spec) if td.name == "token_embd.weight")
    assert pick_type(spec, embd) == spec.quant.output
    assert not any(td.name == "output.weight" for td in tensor_defs(spec))


# --- vocabularies ----------------------------------------------------------------------------


def test_bpe_vocab_is_unique_with_real_merges() -> None:
    tok = SMALL_MODELS["deepseek2"].tokenizer
    v = make_vocab(tok)
    assert len(v.tokens) == tok.n_vocab == len(set(v.tokens)) == len(v.types)
    assert len(v.merges) == tok.n_merges == len(set(v.merges))
    vocab = set(v.tokens)
    for rule in v.merges:
        left, right = rule.split(" ")
        assert left in vocab and right in vocab and left + right in vocab
    assert "Ċ" in vocab  # GPT-2 byte char of "\n": llama.cpp tokenizes it at load


def test_bpe_vocab_can_have_more_merges_than_tokens() -> None:
    tok = replace(SMALL_MODELS["llama"].tokenizer, n_merges=2500)
    v = make_vocab(tok)
    assert len(v.merges) == len(set(v.merges)) == 2500
    assert all(" " in m and not m.startswith(" ") for m in v.merges)


def test_spm_vocab_has_byte_tokens_and_scores() -> None:
    tok = SMALL_MODELS["gemma3"].tokenizer
    v = make_vocab(tok)
    assert len(v.tokens) == tok.n_vocab == len(set(v.tokens)) == len(v.scores)
    assert "<0x0A>" in v.tokens and v.tokens[v.bos_id] == "<bos>" and v.tokens[v.eos_id] == "<eos>"


# --- files -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SMALL_MODELS))
def test_small_model_file_is_complete(name: str, small_models: dict[str, Path]) -> None:
    spec = SMALL_MODELS[name]
    path = small_models[name]
    r = GGUFReader(path)
    assert len(r.tensors) == count_tensors(spec)
    assert [t.name for t in r.tensors] == [td.name for td in tensor_defs(spec)]
    assert _field(r, "general.architecture") == spec.arch
    assert _field(r, f"{spec.arch}.block_count") == spec.n_layer
    assert r.data_offset % ALIGN == 0
    data = sum(_pad(int(t.n_bytes)) for t in r.tensors)
    assert path.stat().st_size == r.data_offset + data
    assert sum(int(t.n_bytes) for t in r.tensors) == total_tensor_bytes(spec)
    assert path.stat().st_size < 8 * 2**20  # "a few MB"


def test_gemma3_writes_head_count_kv_as_per_layer_array(small_models: dict[str, Path]) -> None:
    r = GGUFReader(small_models["gemma3"])
    f = r.fields["gemma3.attention.head_count_kv"]
    assert f.types == [GGUFValueType.ARRAY, GGUFValueType.INT32]
    assert f.contents() == [1] * 6


def test_header_only_file_is_the_complete_files_header(
    tmp_path: Path, small_models: dict[str, Path]
) -> None:
    [header] = write_model(SMALL_MODELS["glm4moe"], tmp_path / "glm.header.gguf", header_only=True)
    full = small_models["glm4moe"].read_bytes()
    data_offset = GGUFReader(small_models["glm4moe"]).data_offset
    head = header.read_bytes()
    assert len(head) == data_offset  # KV + tensor infos, padded to the alignment, no data
    assert full[: len(head)] == head


def test_split_shards_carry_gguf_split_keys(tmp_path: Path) -> None:
    spec = SMALL_MODELS["qwen3moe"]  # 50 tensors -> 20 + 20 + 10
    paths = write_model(spec, tmp_path / "qwen.gguf", split_max_tensors=20)
    assert [p.name for p in paths] == [f"qwen-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert not (tmp_path / "qwen.gguf").exists()
    n_tensors = []
    for i, p in enumerate(paths):
        r = GGUFReader(p)
        assert r.fields["split.no"].types == [GGUFValueType.UINT16]
        assert r.fields["split.count"].types == [GGUFValueType.UINT16]
        assert r.fields["split.tensors.count"].types == [GGUFValueType.INT32]
        assert (_field(r, "split.no"), _field(r, "split.count")) == (i, 3)
        assert _field(r, "split.tensors.count") == 50
        keys = [k for k in r.fields if not k.startswith("GGUF.")]
        if i > 0:  # as llama-gguf-split writes them: only the first shard has the model's keys
            assert keys == ["split.no", "split.tensors.count", "split.count"]
        n_tensors.append(len(r.tensors))
        assert p.stat().st_size == r.data_offset + sum(_pad(int(t.n_bytes)) for t in r.tensors)
    assert n_tensors == [20, 20, 10]


def test_complete_big_model_is_sparse(tmp_path: Path) -> None:
    spec = BIG_MODELS["Qwen3-30B-A3B-Q4_K_M"]
    [full] = write_model(spec, tmp_path / "q.gguf")
    [head] = write_model(spec, tmp_path / "q.header.gguf", header_only=True)
    st = full.stat()
    assert st.st_size == head.stat().st_size + sum(
        _pad(n) for n in _tensor_nbytes(spec)
    )
    assert st.st_blocks * 512 < 64 * 2**20  # the 18 GB of zeros are a hole
    with full.open("rb") as f:
        assert f.read(head.stat().st_size) == head.read_bytes()


def _tensor_nbytes(spec: ModelSpec) -> list[int]:
    from offload_planner.core.synth.quant import tensor_nbytes

    return [tensor_nbytes(pick_type(spec, td), td.shape) for td in tensor_defs(spec)]


@pytest.mark.parametrize("name", DEMO_MODELS)
def test_shipped_demo_headers_are_current(name: str, tmp_path: Path) -> None:
    shipped = RESOURCES / f"{name}.header.gguf"
    assert shipped.is_file(), "regenerate: python -m offload_planner.core.synth resources --only ..."
    assert shipped.stat().st_size < 12 * 2**20
    [fresh] = write_model(BIG_MODELS[name], tmp_path / shipped.name, header_only=True)
    assert fresh.read_bytes() == shipped.read_bytes()


def test_cli_writes_small_complete_and_big_header_only(tmp_path: Path) -> None:
    assert synth_main([str(tmp_path), "--only", "llama", "Llama-3.1-70B-Q4_K_M"]) == 0
    assert (tmp_path / "llama.gguf").stat().st_size > 1_000_000
    big = tmp_path / "Llama-3.1-70B-Q4_K_M.header.gguf"
    assert 1_000_000 < big.stat().st_size < 12 * 2**20
    assert synth_main([str(tmp_path), "--only", "nope"]) == 2
