"""DeepSeek Sparse Attention (core.dsa) on the synth's small deepseek32 / glm-dsa files: the indexer cache's
layers and bytes by hand from llama.cpp's source (src/llama-kv-cache-dsa.cpp, src/models/glm-dsa.cpp), and
ik_llama.cpp's refusal of deepseek32.  The real server's buffers: tests/integration/test_dsa_vs_llama.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.dialects.ik import IK
from offload_planner.core.dsa import indexer_layers
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import ContextParams, project
from offload_planner.core.placement import PlacementOptions, place
from offload_planner.core.roles import Role
from offload_planner.core.synth import SMALL_MODELS, all_models, write_model

CPU_ONLY = DeviceSet(Device("CPU", DeviceKind.CPU), ())


def _kv(path: Path, p: ContextParams) -> list[tuple[str, int]]:
    model = open_model(path)
    placement = place(model, CPU_ONLY, PlacementOptions(n_gpu_layers=0))
    proj = project(model, CPU_ONLY, placement, p)
    return [("indexer" if "lightning indexer" in b.why else "main", b.bytes)
            for dm in proj.devices for b in dm.buffers if b.kind == "kv"]


def test_deepseek32_caches_every_trunk_layer_s_indexer_keys(small_models: dict[str, Path]) -> None:
    # 4 trunk layers (+1 NextN, never cached), 2 streams of 1024 / 2 = 512 cells:
    # MLA rows 288 f16 = 576 B, indexer rows 64 f16 = 128 B (one key head, no V)
    kv = _kv(small_models["deepseek32"], ContextParams(1024, n_seq_max=2))
    assert kv == [("main", 4 * 576 * 512 * 2), ("indexer", 4 * 128 * 512 * 2)]


def test_the_indexer_cache_takes_type_k(small_models: dict[str, Path]) -> None:
    # q8_0: 34 B a block of 32 -> 288 -> 9 blocks = 306 B, 64 -> 2 blocks = 68 B
    kv = _kv(small_models["deepseek32"], ContextParams(1024, type_k="q8_0", type_v="q8_0"))
    assert kv == [("main", 4 * 306 * 1024), ("indexer", 4 * 68 * 1024)]


def test_glm_dsa_caches_the_full_indexer_layers_of_its_types(small_models: dict[str, Path]) -> None:
    model = open_model(small_models["glm-dsa"])
    assert model.metadata["glm-dsa.attention.indexer.types"] == [True, False, True, False]
    assert indexer_layers(model) == [0, 2]
    kv = _kv(small_models["glm-dsa"], ContextParams(1024))
    assert kv == [("main", 4 * 576 * 1024), ("indexer", 2 * 128 * 1024)]


def test_glm_dsa_without_types_follows_the_trained_context(tmp_path: Path) -> None:
    """glm-dsa.cpp: before GLM-5.2 (n_ctx_train < 1048576) every layer is full; from it the built-in
    GLM_5_2_DEFAULT_INDEXER_TYPES (1, 1, then 1, 0, 0, 0 repeated)."""
    base = SMALL_MODELS["glm-dsa"]
    kv = {k: v for k, v in base.extra_kv.items() if k != "attention.indexer.types"}
    old = replace(base, n_layer=11, n_nextn=1, extra_kv=kv)
    new = replace(old, n_ctx_train=1048576)
    [p_old] = write_model(old, tmp_path / "old.gguf")
    [p_new] = write_model(new, tmp_path / "new.gguf")
    assert indexer_layers(open_model(p_old)) == list(range(10))
    assert indexer_layers(open_model(p_new)) == [0, 1, 2, 6]


def test_the_nextn_block_s_expert_bias_is_loaded_without_mtp(small_models: dict[str, Path]) -> None:
    """deepseek32.cpp creates blk.<nextn>.exp_probs_b.bias without the block's skip flags: llama.cpp
    loads it (it is not among the "unused tensor" lines), so it is no NextN tensor to the planner."""
    model = open_model(small_models["deepseek32"])
    assert model.tensor("blk.4.exp_probs_b.bias").role is Role.ROUTER
    assert model.tensor("blk.4.ffn_norm.weight").role is Role.NEXTN
    assert open_model(small_models["deepseek2-mtp"]).tensor("blk.3.exp_probs_b.bias").role is Role.NEXTN


def test_ik_llama_cpp_cannot_load_deepseek32(small_models: dict[str, Path]) -> None:
    [err] = IK.model_errors(open_model(small_models["deepseek32"]))
    assert "unknown model architecture: 'deepseek32'" in err


def test_ik_llama_cpp_aborts_on_a_glm_dsa_file_it_cannot_map_back(small_models: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    """ik's GLM_DSA hparams abort a mainline MLA file unless n_head % 4 == 0, key_length 576,
    value_length 512 and n_rot 64 (src/llama-hparams.cpp 1946-1953 at 8337e4cd): the small glm-dsa has
    key_length 288; GLM-5.1's real shape passes."""
    [err] = IK.model_errors(open_model(small_models["glm-dsa"]))
    assert "Detected incompatible DeepSeek model" in err and "288" in err
    [path] = write_model(all_models()["GLM-5.1-Q8_0"], tmp_path / "glm51.gguf", header_only=True)
    assert IK.model_errors(open_model(path)) == []


def test_ik_caches_glm_5_1_as_mla_plus_its_own_indexer_layers(tmp_path: Path) -> None:
    """ik_llama.cpp on GLM-5.1 (8337e4cd source, by hand): -mla 3 with flash attention caches c^KV only,
    (512 + 64) f16 a cell for each of the 78 trunk layers; the indexer keys (cache_kr_l) 128 f16 a cell
    on ik's full-indexer layers 0, 1, 2, 6, ..., 74 (21 of them, whatever the file says), one stream of
    the 8192 cells, all in CUDA0's KV buffer.  llm_prepare_mla computes attn_kv_b for every block of a
    file with split attn_k_b / attn_v_b (-mla 3): those buffers exist too."""
    from offload_planner.core.analysis import analyse_command
    from offload_planner.core.cmdline import parse_server_args
    from offload_planner.core.units import GiB

    [path] = write_model(all_models()["GLM-5.1-Q8_0"], tmp_path / "glm51.gguf", header_only=True)
    model = open_model(path)
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 1024 * GiB, 1024 * GiB),
                        (Device("CUDA0", DeviceKind.CUDA, 1024 * GiB, 1024 * GiB),))
    args = parse_server_args(["-c", "8192", "-ngl", "99", "-fa", "on"], dialect=IK)
    proj = analyse_command(model, devices, args, IK).projection
    assert proj is not None
    kv = [b for b in proj.buffers() if b.kind == "kv"]
    assert [(b.device, b.bytes) for b in kv] == [("CUDA0", 8192 * (78 * 1152 + 21 * 256))]
    assert "DSA indexer" in kv[0].why
    assert any(b.kind == "model" and "attn_kv_b" in b.why for b in proj.buffers())
    # -mla 0: ik's standard cache (K and V 64 x 256 f16 a cell), no indexer keys (the MLA branch has them)
    args = parse_server_args(["-c", "8192", "-ngl", "99", "-fa", "on", "-mla", "0"], dialect=IK)
    proj = analyse_command(model, devices, args, IK).projection
    assert proj is not None
    assert [b.bytes for b in proj.buffers() if b.kind == "kv"] == [8192 * 78 * 2 * (64 * 256 * 2)]


def test_ik_builds_of_2025_cannot_load_glm_dsa(tmp_path: Path) -> None:
    """glm-dsa came to ik_llama.cpp with GLM-5 support (PR 1268, 2026-02-15): the 2025 dialects refuse it."""
    from offload_planner.core.dialects.ik_2025 import IK_2025

    [path] = write_model(all_models()["GLM-5.1-Q8_0"], tmp_path / "glm51.gguf", header_only=True)
    [err] = IK_2025.model_errors(open_model(path))
    assert "unknown model architecture: 'glm-dsa'" in err
