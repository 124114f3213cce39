"""DeepSeek V4's compressed KV cache (core/compressed_kv.py) on the real V4-Flash shapes, by hand
arithmetic from src/llama-kv-cache-dsv4.cpp (the small model is held to the real server in
tests/integration/test_dsv4_memory_vs_llama.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from offload_planner.backend.log_parser import parse_log
from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.dialects.base import Dialect
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import Projection, kv_buffers
from offload_planner.core.model import Model
from offload_planner.core.recurrent_state import layer_cache_note, memory_notes
from offload_planner.core.synth import BIG_MODELS, write_model

CPU_ONLY = DeviceSet(Device("CPU", DeviceKind.CPU), ())


@pytest.fixture(scope="module")
def flash(tmp_path_factory: pytest.TempPathFactory) -> Model:
    path = tmp_path_factory.mktemp("dsv4") / "flash.gguf"
    write_model(BIG_MODELS["DeepSeek-V4-Flash-Q4_K_M"], path, header_only=True)
    return open_model(path)


def _projection(model: Model, args: str) -> Projection:
    parsed = parse_server_args(shlex.split(args))
    assert not parsed.errors, parsed.errors
    return analyse_command(model, CPU_ONLY, parsed).projection


def test_flash_kv_and_states_by_hand(flash: Model) -> None:
    """The pinned llama-server, run once by hand on the complete (sparse) file of these shapes with the
    same arguments and --no-repack, printed the KV lines 32.25 + 168.00 + 5.00 + 42.00 MiB (= 259,260,416 B)
    and the state lines 1.31 + 10.00 + 0.33 MiB ("csa ratio = 4, state = 8 x 1024, streams = 1, rs_seq = 0,
    layers = 21"; hca 128 x 512, 20 layers; lid 8 x 256, 21 layers)."""
    cpu = _projection(flash, "-c 32768 -np 1").devices[0]
    # 43 blocks; compress_ratios 0, 0, then 4/128 alternating: 21 CSA (2, 4, ..., 42), 20 HCA (3, ..., 41).
    # K only, f16, 1 KV head of 512; the indexer 1 head of 128; one stream.
    raw = 43 * 512 * 2 * 768  # window: GGML_PAD(min(32768, 128 + 512), 256) = 768 cells
    csa = 21 * 512 * 2 * 8192  # GGML_PAD(ceil(32768 / 4), 256)
    hca = 20 * 512 * 2 * 256  # GGML_PAD(max(1, ceil(32768 / 128)), 256)
    lid = 21 * 128 * 2 * 8192
    assert cpu.total("kv") == raw + csa + hca + lid == 259_260_416
    # f32 kv + score per compressed trunk block, n_embd_state x state_size x 1 plane
    states = 21 * 2 * (2 * 512) * 8 * 4 + 20 * 2 * 512 * 128 * 4 + 21 * 2 * (2 * 128) * 8 * 4
    assert cpu.total("rs") == states == 12_206_080


def test_flash_streams_ignore_kv_unified_and_rollback_planes(flash: Model) -> None:
    cpu = _projection(flash, "-c 65536 -np 4 -kvu -ctk q8_0 -ctv q8_0").devices[0]
    # -kvu: n_ctx_seq = 65536, yet 4 streams (unified_raw / unified_compressed = false); q8_0: 34 B / 32
    row_k, row_i = 512 // 32 * 34, 128 // 32 * 34
    raw = 43 * row_k * 768 * 4  # GGML_PAD(min(65536, 128 + 512), 256): the window is per stream (x1)
    csa = 21 * row_k * 16384 * 4
    hca = 20 * row_k * 512 * 4
    lid = 21 * row_i * 16384 * 4
    assert cpu.total("kv") == raw + csa + hca + lid
    assert cpu.total("rs") == 4 * 12_206_080  # 4 planes (no draft: n_rs_seq 0)


def test_other_builds_say_not_modelled(flash: Model) -> None:
    assert memory_notes(flash, Dialect("llama.cpp")) == []
    ik = memory_notes(flash, Dialect("ik_llama.cpp"))
    assert len(ik) == 1 and "not modelled" in ik[0]


def test_log_parser_reads_compressor_states_as_rs(tmp_path: Path) -> None:
    lines = [
        "0.00.064.333 I llama_dsv4_comp_state: RPC0[127.0.0.1:34521] DSV4 csa state buffer size =  0.06 MiB",
        "0.00.065.686 I llama_dsv4_comp_state:        CPU DSV4 hca state buffer size =     1.00 MiB",
        "0.00.057.568 I llama_kv_cache:        CPU KV buffer size =     2.25 MiB",
    ]
    got = parse_log(lines).by_device({"127.0.0.1:34521": "RPC0"})
    assert got["RPC0"]["rs"] == 0.06
    assert got["CPU"]["rs"] == 1.00 and got["CPU"]["kv"] == 2.25


def test_layer_notes_follow_the_ratios(flash: Model) -> None:
    # compress_ratios 0, 0, 4, 128, ...: blocks 0-1 window only, 2 CSA, 3 HCA, 42 CSA
    assert layer_cache_note(flash, 0).startswith("window-only block: its last 128 tokens")
    csa, hca = layer_cache_note(flash, 2), layer_cache_note(flash, 3)
    assert csa.startswith("CSA block") and "lightning indexer" in csa
    assert hca.startswith("HCA block: ") and "per 128 tokens" in hca
    assert layer_cache_note(flash, 42).startswith("CSA block")


def test_per_block_figures_of_the_speed_model(flash: Model) -> None:
    """The speed model asks the KV of one block at a time (speed/layout.py, speed/reads.py): a CSA block
    keeps its window, compressed and indexer keys and its two states, not a plain K+V cache of the context."""
    parsed = parse_server_args(shlex.split("-c 32768 -np 1"))
    a = analyse_command(flash, CPU_ONLY, parsed)
    assert a.projection is not None
    pr, p = a.projection, a.plan.context
    block2 = kv_buffers(flash, pr.placement, pr.context, p, CPU_ONLY, cached=range(2, 3))
    assert sum(b.bytes for b in block2 if b.kind == "kv") == 512 * 2 * (768 + 8192) + 128 * 2 * 8192
    assert sum(b.bytes for b in block2 if b.kind == "rs") == 2 * 4 * 8 * (2 * 512 + 2 * 128)
    every = [kv_buffers(flash, pr.placement, pr.context, p, CPU_ONLY, cached=range(il, il + 1))
             for il in range(43)]
    assert sum(b.bytes for bufs in every for b in bufs) == 259_260_416 + 12_206_080
