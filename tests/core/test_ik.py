"""core.ik on real GGUF bytes: which ik_llama.cpp rules apply to which file (the sizes themselves are
measured against ik's libllama in tests/integration/test_ik_memory.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from offload_planner.cli import demo_model_path
from offload_planner.core import ik
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.synth import SMALL_MODELS, write_model


def test_mla_mode_applies_to_deepseek_only(small_models: dict[str, Path]) -> None:
    ds = open_model(demo_model_path())
    assert ik.mla_mode(ds, None) == 3 and ik.mla_mode(ds, 1) == 1
    for name in ("llama", "qwen3moe", "glm4moe", "gpt-oss", "gemma3"):
        m = open_model(small_models[name])
        assert not ik.uses_mla(m) and ik.mla_mode(m, 2) == 0 and ik.computed_tensors(m, 3) == []


def test_deepseek_v3_gets_q8_0_attn_kv_b_unless_mla_1() -> None:
    ds = open_model(demo_model_path())
    three = ik.computed_tensors(ds, 3)
    assert [c.name for c in three] == [f"blk.{il}.attn_kv_b.weight" for il in range(61)]
    assert {(c.shape, c.type.name) for c in three} == {((512, 128 * (128 + 128)), "q8_0")}
    assert three[0].source == "blk.0.attn_k_b.weight"
    assert ik.computed_tensors(ds, 1) == []
    assert ik.computed_tensors(ds, 0) == three  # the standard cache needs attn_kv_b too
    assert ik.model_errors(ds) == []


def test_older_layout_gets_k_b_and_v_b(tmp_path: Path) -> None:
    spec = replace(SMALL_MODELS["deepseek2"], n_head_kv=None, head_dim_k=192, head_dim_v=128, n_rot=64,
                   kv_lora_rank=512, key_length_mla=0, value_length_mla=0)
    m = open_model(write_model(spec, tmp_path / "old.gguf")[0])
    assert ik.computed_tensors(m, 0) == []
    got = {(c.name.split(".")[2], c.shape) for c in ik.computed_tensors(m, 2)}
    assert got == {("attn_k_b", (128, 512, 4)), ("attn_v_b", (512, 128, 4))}


def test_refusal_names_the_shapes(small_models: dict[str, Path]) -> None:
    (msg,) = ik.model_errors(open_model(small_models["deepseek2"]))
    assert "Detected incompatible DeepSeek model" in msg and "288, 256, 32" in msg


def test_graph_split_warnings(small_models: dict[str, Path]) -> None:
    qwen = open_model(small_models["qwen3moe"])
    ds = open_model(demo_model_path())
    assert ik.split_mode_warnings(qwen, "graph", 1) == []
    assert ik.split_mode_warnings(qwen, "layer", 2) == []
    assert "not modelled" in ik.split_mode_warnings(qwen, "graph", 2)[0]
    # deepseek2 is split since ik's 2026-05-19 commit c07a052315 (is_model_split_supported); gemma3 is not
    assert "not modelled" in ik.split_mode_warnings(ds, "attn", 2)[0]
    gemma = open_model(small_models["gemma3"])
    assert "changes the split mode to 'layer'" in ik.split_mode_warnings(gemma, "attn", 2)[0]


def test_ik_offloads_moe_ops_only_for_batches_that_keep_every_expert_busy() -> None:
    """ik's ggml_backend_cuda_offload_op: a MoE op with host weights goes to the GPU only when
    batch * active >= 32 * experts (DeepSeek-V3: 1024 tokens), unlike mainline's 32 tokens."""
    from offload_planner.core.compute import F32, T
    from offload_planner.core.compute_ik import IkBackend
    from offload_planner.core.ggml_types import type_by_name

    gpu = IkBackend("CUDA0", "CUDA0", 256, True, 32, None)
    q4k, i32 = type_by_name("q4_K"), type_by_name("i32")
    for n_tok, expected in ((512, False), (1023, False), (1024, True), (4096, True)):
        up = T(q4k, (7168, 2048, 256), name="up")
        gate = T(q4k, (7168, 2048, 256), name="gate")
        x = T(F32, (7168, 1, n_tok), name="x")
        ids = T(i32, (8, n_tok), name="ids")
        fused = T(F32, (2048, 8, n_tok), op="MOE_FUSED_UP_GATE", src=(up, gate, x, ids))
        mmid = T(F32, (2048, 8, n_tok), op="MUL_MAT_ID", src=(up, x, ids))
        assert gpu.offloads(fused) is expected and gpu.offloads(mmid) is expected, n_tok
    w, y = T(q4k, (7168, 2048), name="w"), T(F32, (7168, 32), name="y")
    dense = T(F32, (2048, 32), op="MUL_MAT", src=(w, y))
    assert gpu.offloads(dense)
    assert not IkBackend("RPC0", "RPC0", 32, False, None, None).offloads(dense)


def test_run_time_repack_turns_mmap_off(small_models: dict[str, Path]) -> None:
    """ik's -rtr sets use_mmap = false: the CPU weights are one plain CPU buffer (+32 B), not the
    file map, and the exported command keeps both flags."""
    from offload_planner.core.analysis import analyse_command
    from offload_planner.core.cmdline import parse_server_args
    from offload_planner.core.devices import Device, DeviceKind, DeviceSet
    from offload_planner.core.engine import IK_LLAMA_CPP
    from offload_planner.core.plan import plan_command, plan_from_args
    from offload_planner.core.units import GiB

    model = open_model(small_models["qwen3moe"])
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 24 * GiB, 20 * GiB), ())
    mapped = analyse_command(model, devices, parse_server_args(["-c", "1024"], dialect=IK_LLAMA_CPP),
                             IK_LLAMA_CPP)
    parsed = parse_server_args(["-c", "1024", "-rtr"], dialect=IK_LLAMA_CPP)
    repacked = analyse_command(model, devices, parsed, IK_LLAMA_CPP)
    names = {b.name for b in repacked.projection.buffers() if b.kind == "model"}
    assert names == {"CPU"} and not repacked.plan.placement_options.use_mmap
    assert repacked.projection.device("CPU").weights == model.total_bytes + 32
    assert mapped.plan.placement_options.use_mmap
    assert "-rtr" in plan_command(plan_from_args(model, devices, parsed, IK_LLAMA_CPP))
