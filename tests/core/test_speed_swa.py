"""KV bytes a generated token reads at a depth, on sliding-window models (the synth's gemma3: 5 SWA
layers then a full one; gpt-oss: SWA and full alternating; window 128), as the pinned llama.cpp
sizes and reads the SWA cache: a ring of ``n_swa x sequences + -ub`` cells padded to 256 whose
masked cells are overwritten only when reused, so once it wraps one token's attention spans the whole
ring; ggml-cpu's and Metal's flash attention skip masked cells, so there with ``-fa`` only the
window is read.  Expected bytes from the GGUF's own K/V projection widths (f16 cache: 2 bytes a value)."""

from __future__ import annotations

from pathlib import Path

import pytest

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import resolve_context
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import hardware_for
from offload_planner.core.speed.reads import kv_bytes_at

GiB = 1024**3
CPU_ONLY = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), ())
ONE_GPU = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), (parse_device_decl("CUDA0=24GiB"),))
WINDOW = 128
RING = 768  # -np 1: pad(128 x 1 + 512, 256)


def _plan(path: Path, devices: DeviceSet, *args: str) -> Plan:
    return plan_from_args(open_model(path), devices, parse_server_args(["-c", "4096", "-np", "1", *args]))


def _cell_bytes(plan: Plan, il: int) -> int:
    m = plan.model
    return 2 * (m.tensor(f"blk.{il}.attn_k.weight").shape[1] + m.tensor(f"blk.{il}.attn_v.weight").shape[1])


def _expected(plan: Plan, depth: int, swa_cells: int) -> int:
    s = plan.model.summary
    return sum(_cell_bytes(plan, il) * (min(depth, swa_cells) if s.swa_layers[il] else depth)
               for il in range(s.n_layer))


def _read(plan: Plan, depth: int) -> dict[str, int]:
    s = plan.model.summary
    ctx = resolve_context(plan.context, s.n_ctx_train, s.n_swa)
    return kv_bytes_at(plan.model, plan.placement(), plan.context, ctx, plan, depth)


@pytest.mark.parametrize(("name", "swa"), [("gemma3", (True,) * 5 + (False,)),
                                           ("gpt-oss", (True, False, True, False))])
def test_a_gpu_reads_the_whole_swa_ring_once_it_wraps(small_models: dict[str, Path], name: str,
                                                      swa: tuple[bool, ...]) -> None:
    plan = _plan(small_models[name], ONE_GPU, "-fa", "on")
    s = plan.model.summary
    assert s.swa_layers == swa and s.n_swa == WINDOW
    assert resolve_context(plan.context, s.n_ctx_train, s.n_swa).swa_cells == RING
    for depth in (64, 512, 1024, 4096):
        assert _read(plan, depth) == {"CUDA0": _expected(plan, depth, RING)}, depth
    # the estimate reads the same at the full context
    est = estimate(plan, hardware_for(ONE_GPU), depth=1024)
    assert est.device("CUDA0").kv_bytes_at_ctx == _expected(plan, 4096, RING)


@pytest.mark.parametrize("name", ["gemma3", "gpt-oss"])
def test_the_cpu_with_flash_attention_reads_the_window(small_models: dict[str, Path], name: str) -> None:
    plan = _plan(small_models[name], CPU_ONLY, "-fa", "on")
    for depth in (64, 512, 4096):
        assert _read(plan, depth) == {"CPU": _expected(plan, depth, WINDOW)}, depth
    # without flash attention the CPU multiplies the whole ring too
    plain = _plan(small_models[name], CPU_ONLY, "-fa", "off")
    assert _read(plain, 4096) == {"CPU": _expected(plain, 4096, RING)}


def test_a_full_size_swa_cache_is_read_to_the_depth(small_models: dict[str, Path]) -> None:
    plan = _plan(small_models["gemma3"], ONE_GPU, "-fa", "on", "--swa-full")
    assert _read(plan, 4096) == {"CUDA0": _expected(plan, 4096, 4096)}
    assert _read(plan, 1000) == {"CUDA0": _expected(plan, 1000, 1000)}


def test_metal_skips_masked_cells_and_vulkan_does_not(small_models: dict[str, Path]) -> None:
    for gpu, swa_cells in (("Metal0=m3max,128GiB", WINDOW), ("Vulkan0=24GiB", RING)):
        devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), (parse_device_decl(gpu),))
        plan = _plan(small_models["gpt-oss"], devices, "-fa", "on")
        name = devices.gpus[0].name
        assert _read(plan, 4096) == {name: _expected(plan, 4096, swa_cells)}, gpu
