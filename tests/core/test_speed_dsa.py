"""What one generated token of a DeepSeek Sparse Attention model (the synth's deepseek32: 4 trunk layers,
MLA with kv_lora_rank 256 + 32 rope dims, an indexer of 4 heads x 64, top-k 128) reads and computes at a
depth, as the pinned llama.cpp runs it: the top-k cells are unmasked in an all ``-inf`` mask and the MLA
attention runs over the whole cache with it (src/llama-graph.cpp 3125-3176), so only a kernel that skips
masked cells (ggml-cpu's one-token flash attention, ops.cpp 8968) reads ``min(depth, top_k)`` MLA cells;
the lightning indexer reads its key cache and scores every cell.  Expected figures from the GGUF's own
keys (f16 cache: 2 bytes a value)."""

from __future__ import annotations

from pathlib import Path

import pytest

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import resolve_context
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.speed.reads import kv_bytes_at
from offload_planner.core.speed.tg import attention_flops_at

GiB = 1024**3
CPU_ONLY = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), ())
ONE_GPU = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), (parse_device_decl("CUDA0=24GiB"),))
TRUNK = 4  # block_count 5, one NextN block
TOP_K = 128


def _plan(path: Path, devices: DeviceSet, *args: str) -> Plan:
    return plan_from_args(open_model(path), devices, parse_server_args(["-c", "4096", "-np", "1", *args]))


def _key(plan: Plan, name: str) -> int:
    value = plan.model.metadata[f"deepseek32.{name}"]
    assert isinstance(value, int)
    return value


def _rows(plan: Plan) -> tuple[int, int]:
    """Bytes a cell of one layer: the MLA cache's (K only: latent + rope dims) and the indexer's."""
    mla = 2 * (_key(plan, "attention.kv_lora_rank") + _key(plan, "rope.dimension_count"))
    return mla, 2 * _key(plan, "attention.indexer.key_length")


def _read(plan: Plan, depth: int) -> dict[str, int]:
    s = plan.model.summary
    ctx = resolve_context(plan.context, s.n_ctx_train, s.n_swa)
    return kv_bytes_at(plan.model, plan.placement(), plan.context, ctx, plan, depth)


def _flops(plan: Plan, depth: int) -> dict[str, float]:
    s = plan.model.summary
    ctx = resolve_context(plan.context, s.n_ctx_train, s.n_swa)
    return attention_flops_at(plan, plan.placement(), ctx, depth)


def test_the_model_is_what_the_figures_assume(small_models: dict[str, Path]) -> None:
    plan = _plan(small_models["deepseek32"], CPU_ONLY, "-fa", "on")
    assert plan.model.summary.n_layer_trunk == TRUNK
    assert _key(plan, "attention.indexer.top_k") == TOP_K
    assert _rows(plan) == (2 * (256 + 32), 2 * 64)


@pytest.mark.parametrize("depth", [1024, 4096])
def test_the_cpu_with_flash_attention_reads_the_top_k_mla_cells(small_models: dict[str, Path],
                                                               depth: int) -> None:
    plan = _plan(small_models["deepseek32"], CPU_ONLY, "-fa", "on")
    mla, idx = _rows(plan)
    assert _read(plan, depth) == {"CPU": TRUNK * (mla * TOP_K + idx * depth)}
    heads, head_dim = _key(plan, "attention.head_count"), 256 + 32
    per_layer = 2.0 * heads * (head_dim + 256) * TOP_K + 2.0 * 4 * 64 * depth
    assert _flops(plan, depth) == {"CPU": pytest.approx(TRUNK * per_layer)}


def test_within_the_top_k_every_cell_is_read(small_models: dict[str, Path]) -> None:
    plan = _plan(small_models["deepseek32"], CPU_ONLY, "-fa", "on")
    mla, idx = _rows(plan)
    assert _read(plan, 100) == {"CPU": TRUNK * (mla + idx) * 100}


def test_without_flash_attention_or_on_a_cuda_gpu_every_cell_is_read(small_models: dict[str, Path]) -> None:
    plain = _plan(small_models["deepseek32"], CPU_ONLY, "-fa", "off")
    mla, idx = _rows(plain)
    assert _read(plain, 1024) == {"CPU": TRUNK * (mla + idx) * 1024}
    gpu = _plan(small_models["deepseek32"], ONE_GPU, "-fa", "on", "-ngl", "999")
    assert _read(gpu, 1024) == {"CUDA0": TRUNK * (mla + idx) * 1024}
    heads = _key(gpu, "attention.head_count")
    per_layer = 2.0 * heads * (256 + 32 + 256) * 1024 + 2.0 * 4 * 64 * 1024
    assert _flops(gpu, 1024) == {"CUDA0": pytest.approx(TRUNK * per_layer)}
