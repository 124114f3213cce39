"""llama_memory_hybrid_idx (qwen4exp, glm5-next): the indexer cache and qwen4exp's PLE row, worked out by
hand from the pinned llama.cpp source.

Sources: src/llama-memory-hybrid-idx.cpp 49-72 (the indexer cache: a ``llama_kv_cache`` of one key head,
``n_embd_head_k_full = indexer_head_size * (indexer_kpool > 0 ? indexer_kpool_row : 1)``, MLA-sized so no
V, ``type_k``, the attention cache's cells and streams, ``filter_idx``), src/llama-model.cpp 2457-2500 and
2705-2723 (the filters), src/models/qwen4exp.cpp 56-81 (``indexer_kpool`` the non-zero compress ratio,
``indexer_kpool_row = 2``), src/models/glm5-next.cpp 21-47 (recurrent where ``head_count_kv`` is 0,
``attention.indexer.kpool``, ``attention.indexer.types``; ``indexer_kpool_row`` keeps its default 3,
src/llama-hparams.h 289), src/llama-memory-recurrent.cpp 98-114 and src/llama-hparams.cpp
``ple_conv_state`` (qwen4exp's PLE layer: a third f32 row of ``(conv_kernel - 1) * ngram_size * hc *
n_embd`` elements).
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import Projection
from offload_planner.core.model import Model
from offload_planner.core.synth import SMALL_MODELS, write_model

CPU_ONLY = DeviceSet(Device("CPU", DeviceKind.CPU, 512 << 30, 512 << 30), ())


def _open(spec_name: str, root: Path, **extra: object) -> Model:
    spec = SMALL_MODELS[spec_name]
    if extra:
        spec = replace(spec, extra_kv={**spec.extra_kv, **extra})  # type: ignore[dict-item]
    return open_model(write_model(spec, root / f"{spec_name}.gguf", header_only=True)[0])


def _project(model: Model, args: str) -> Projection:
    parsed = parse_server_args(shlex.split(args))
    assert not parsed.errors, parsed.errors
    return analyse_command(model, CPU_ONLY, parsed).projection


def _bytes(p: Projection, kind: str) -> int:
    return sum(b.bytes for b in p.buffers() if b.kind == kind)


def test_qwen4exp_kv_has_the_indexer_keys_of_its_attention_layers(tmp_path: Path) -> None:
    p = _project(_open("qwen4exp", tmp_path), "-ngl 0 -c 4096 -np 2 -ctk q8_0")
    cells = 2 * 2048  # 2 streams of 2048 cells
    # attention layers 3 and 7: K 2 heads x 64 in q8_0 (4 blocks of 34 B = 136 B), V 2 x 64 f16 (256 B)
    attn = 2 * (136 + 256) * cells
    # their indexer keys: one head of 32 x kpool_row 2 = 64 wide, q8_0 (2 blocks = 68 B), no V
    idx = 2 * 68 * cells
    assert _bytes(p, "kv") == attn + idx == 3_211_264 + 557_056
    # recurrent layers 0-2, 4-6: R (4 - 1) x (128 + 2 x 2 x 32) = 768, S 32 x 128 = 4096 f32, 2 cells
    assert _bytes(p, "rs") == 6 * 2 * 4 * (768 + 4096)


def test_qwen4exp_without_compress_ratios_caches_bare_keys(tmp_path: Path) -> None:
    """No compress ratio (``indexer_kpool`` 0): the row is the key alone (32 wide, f16: 64 B)."""
    m = _open("qwen4exp", tmp_path, **{"attention.compress_ratios": (0,) * 8})
    p = _project(m, "-ngl 0 -c 4096")
    assert _bytes(p, "kv") == 2 * (128 * 2 + 128 * 2) * 4096 + 2 * 64 * 4096


def test_qwen4exp_ple_layer_keeps_its_own_conv_row(tmp_path: Path) -> None:
    """PLE on layer 1: n-gram 3, 2 heads a gram, conv kernel 4, 2 streams (hc) of 256: a third f32 row of
    (4 - 1) x 3 x 2 x 256 = 4608 elements per cell on that layer alone."""
    ple = {"ple.layers": (1,), "ple.ngram_size": 3, "ple.heads_per_ngram": 2, "ple.conv_kernel": 4}
    p = _project(_open("qwen4exp", tmp_path, **ple), "-ngl 0 -c 4096 -np 3")
    assert _bytes(p, "rs") == 3 * 4 * (6 * (768 + 4096) + 4608)


def _glm5_next(root: Path, **extra: object) -> Model:
    """kimi-k3's KDA/MLA layers (head_count_kv 0 on the KDA layers 0-2, 4-6) under glm5-next's name, with
    a k-pool indexer of 64-wide keys."""
    idx = {"attention.indexer.key_length": 64, "attention.indexer.kpool": 4,
           "attention.indexer.head_count": 2, "attention.indexer.top_k": 64}
    base = _open("kimi-k3", root, **idx, **extra)
    md = {("glm5-next." + k.removeprefix("kimi-k3.")) if k.startswith("kimi-k3.") else k: v
          for k, v in base.metadata.items()}
    md["general.architecture"] = "glm5-next"
    return replace(base, metadata=md, key_offsets={})


def _indexer_bytes(p: Projection) -> int:
    return sum(b.bytes for b in p.buffers() if b.kind == "kv" and "indexer keys" in b.why)


def test_glm5_next_indexer_rows_are_key_gate_pooled(tmp_path: Path) -> None:
    """The DSA layers 3 and 7: 64 x 3 (key | gate | pooled) in -ctk's type (f16: 384 B) per cell."""
    p = _project(_glm5_next(tmp_path), "-ngl 0 -c 4096 -np 2")
    assert _indexer_bytes(p) == 2 * 64 * 3 * 2 * 4096


def test_glm5_next_indexer_types_drop_the_shared_layers(tmp_path: Path) -> None:
    """``attention.indexer.types`` 0 on layer 7: its indexer is shared, only layer 3's keys are cached."""
    p = _project(_glm5_next(tmp_path, **{"attention.indexer.types": (1, 1, 1, 1, 1, 1, 1, 0)}),
                 "-ngl 0 -c 4096 -ctk q8_0")
    assert _indexer_bytes(p) == 1 * (6 * 34) * 4096


@pytest.mark.parametrize("arch", ["qwen4exp", "glm5-next"])
def test_no_unmodelled_note_for_the_idx_hybrids(arch: str, tmp_path: Path) -> None:
    from offload_planner.core.dialects import LLAMA_CPP
    from offload_planner.core.recurrent_state import memory_notes

    m = _open("qwen4exp", tmp_path) if arch == "qwen4exp" else _glm5_next(tmp_path)
    assert memory_notes(m, LLAMA_CPP) == []


def test_the_layer_map_names_the_indexer_keys_of_the_attention_layers(tmp_path: Path) -> None:
    from offload_planner.core.recurrent_state import layer_cache_note

    m = _open("qwen4exp", tmp_path)
    assert "indexer keys" in layer_cache_note(m, 3) and "indexer keys" in layer_cache_note(m, 7)
    assert layer_cache_note(m, 2).startswith("recurrent layer")
    shared = _glm5_next(tmp_path, **{"attention.indexer.types": (1, 1, 1, 1, 1, 1, 1, 0)})
    assert "indexer keys" in layer_cache_note(shared, 3) and "indexer keys" not in layer_cache_note(shared, 7)
