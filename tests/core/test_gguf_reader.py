"""Our header reader against the gguf package's reader on real GGUF bytes written by GGUFWriter."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from offload_planner.core.errors import GGUFError
from offload_planner.core.gguf_reader import LazyArray, open_model

N_TOKENS = 6000


def _write(path: Path, *, alignment: int | None = None) -> Path:
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_block_count(2)
    w.add_embedding_length(256)
    w.add_head_count(8)
    w.add_head_count_kv([2, 4])
    w.add_expert_count(4)
    w.add_expert_used_count(2)
    w.add_context_length(4096)
    w.add_uint8("test.u8", 7)
    w.add_int8("test.i8", -7)
    w.add_uint16("test.u16", 65535)
    w.add_int16("test.i16", -300)
    w.add_int32("test.i32", -70000)
    w.add_int64("test.i64", -(2**40))
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_float32("test.f32", 0.5)
    w.add_float64("test.f64", 1e-300)
    w.add_bool("test.bool", True)
    w.add_string("test.str", "héllo wörld")
    w.add_array("test.floats", [0.25] * 5000)
    w.add_token_list([f"tok{i}" for i in range(N_TOKENS)])
    w.add_token_scores([float(i) for i in range(N_TOKENS)])
    w.add_tensor("token_embd.weight", np.zeros((64, 256), dtype=np.float16))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((256, 256), dtype=np.float32))
    q8 = np.zeros((8, 256 // 32 * 34), dtype=np.uint8)
    w.add_tensor("blk.0.ffn_gate_inp.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    q4k = np.zeros((4, 16, 256 // 256 * 144), dtype=np.uint8)
    w.add_tensor(
        "blk.1.ffn_up_exps.weight", q4k, raw_dtype=gguf.GGMLQuantizationType.Q4_K
    )
    w.add_tensor("output_norm.weight", np.ones(256, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("gguf") / "m.gguf")


def _reference_metadata(path: Path) -> dict[str, object]:
    r = gguf.GGUFReader(str(path))
    out: dict[str, object] = {}
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue
        out[f.name] = f.contents()
    return out


def _plain(v: object) -> object:
    if isinstance(v, LazyArray):
        return v.values()
    return v


def test_metadata_equals_gguf_reference(model_file: Path) -> None:
    ours = open_model(model_file).metadata
    ref = _reference_metadata(model_file)
    assert set(ours) == set(ref)
    for key, want in ref.items():
        got = _plain(ours[key])
        if isinstance(want, float):
            assert got == pytest.approx(want), key
        elif isinstance(want, list) and want and isinstance(want[0], float):
            assert got == pytest.approx(want), key
        else:
            assert got == want, key


def test_tensors_equal_gguf_reference(model_file: Path) -> None:
    m = open_model(model_file)
    ref = gguf.GGUFReader(str(model_file))
    assert [t.name for t in m.tensors] == [t.name for t in ref.tensors]
    for ours, theirs in zip(m.tensors, ref.tensors, strict=True):
        assert list(ours.shape) == [int(x) for x in theirs.shape]
        assert ours.type.id == int(theirs.tensor_type)
        assert ours.nbytes == int(theirs.n_bytes)
        assert ours.offset == int(theirs.data_offset)
    assert m.shards[0].data_offset == ref.data_offset


def test_big_arrays_stay_lazy_and_decode_on_request(model_file: Path) -> None:
    md = open_model(model_file).metadata
    tokens = md["tokenizer.ggml.tokens"]
    assert isinstance(tokens, LazyArray)
    assert len(tokens) == N_TOKENS and tokens.type_name == "string"
    assert tokens.values()[:3] == ["tok0", "tok1", "tok2"]
    assert tokens.values()[-1] == f"tok{N_TOKENS - 1}"
    scores = md["tokenizer.ggml.scores"]
    assert isinstance(scores, LazyArray) and scores.values()[10] == 10.0
    assert md["qwen3moe.attention.head_count_kv"] == [2, 4]  # small arrays are plain lists


def test_complete_file_data_matches_file_size(model_file: Path) -> None:
    m = open_model(model_file)
    sh = m.shards[0]
    assert not m.header_only
    assert sh.data_offset + sh.data_bytes <= sh.file_size < sh.data_offset + sh.data_bytes + 32
    assert m.total_bytes == sum(t.nbytes for t in m.tensors)
    # ggml row sizes: q8_0 34 B per 32, q4_K 144 B per 256
    assert m.tensor("blk.0.ffn_gate_inp.weight").nbytes == 8 * 8 * 34
    assert m.tensor("blk.1.ffn_up_exps.weight").nbytes == 4 * 16 * 144


def test_header_only_file_opens_and_is_marked(model_file: Path, tmp_path: Path) -> None:
    full = open_model(model_file)
    cut = tmp_path / "h.gguf"
    with open(model_file, "rb") as f:
        cut.write_bytes(f.read(full.shards[0].data_offset))
    m = open_model(cut)
    assert m.header_only and m.summary.header_only
    assert [(t.name, t.nbytes, t.offset) for t in m.tensors] == [
        (t.name, t.nbytes, t.offset) for t in full.tensors
    ]
    assert m.total_bytes == full.total_bytes


def test_version_2_reads_the_same(model_file: Path, tmp_path: Path) -> None:
    v2 = tmp_path / "v2.gguf"
    shutil.copy(model_file, v2)
    with open(v2, "r+b") as f:
        f.seek(4)
        f.write(struct.pack("<I", 2))
    a, b = open_model(model_file), open_model(v2)
    assert b.shards[0].version == 2
    assert [t.offset for t in a.tensors] == [t.offset for t in b.tensors]


def test_custom_alignment(tmp_path: Path) -> None:
    m = open_model(_write(tmp_path / "a64.gguf", alignment=64))
    assert m.shards[0].alignment == 64
    assert m.shards[0].data_offset % 64 == 0
    assert all((t.offset - m.shards[0].data_offset) % 64 == 0 for t in m.tensors)


def test_summary_reads_hparams(model_file: Path) -> None:
    s = open_model(model_file).summary
    assert (s.arch, s.n_layer, s.n_embd, s.n_head, s.n_head_kv) == ("qwen3moe", 2, 256, 8, [2, 4])
    assert (s.n_expert, s.n_expert_used, s.n_vocab, s.n_ctx_train) == (4, 2, N_TOKENS, 4096)
    assert s.head_dim_k == 32 and s.tied_embeddings


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match=r"nope\.gguf"):
        open_model(tmp_path / "nope.gguf")
