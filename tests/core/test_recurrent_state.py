"""The memory of the big hybrid models (header-only files of their real shapes), worked out by hand from
the pinned llama.cpp source.

Sources: src/llama-model.cpp ``create_memory`` (hybrid: a KV cache with ``filter_attn = il < n_layer()
&& !is_recr(il)`` and a ``llama_memory_recurrent`` with ``filter_recr``, f32 R and S, ``max(1,
n_seq_max)`` cells), src/llama-memory-recurrent.cpp 77-126 (per layer an R tensor of ``n_embd_r()`` and
an S tensor of ``n_embd_s()`` elements per row, ``mem_size * (1 + n_rs_seq)`` rows), src/llama-hparams.cpp
208-258 (``n_embd_r = (d_conv - 1) * (d_inner + 2 * n_group * d_state)``, ``n_embd_s = d_state *
d_inner``), src/models/qwen3next.cpp 16-23 (layer il is recurrent unless ``(il + 1) % 4 == 0``).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import Projection
from offload_planner.core.model import Model
from offload_planner.core.recurrent_state import recurrent_layers
from offload_planner.core.synth import BIG_MODELS, SMALL_MODELS, write_model
from offload_planner.core.units import MiB

CPU_ONLY = DeviceSet(Device("CPU", DeviceKind.CPU, 512 << 30, 512 << 30), ())


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Model]:
    root = tmp_path_factory.mktemp("hybrid")
    names = ("Qwen3-Next-80B-A3B-Q4_K_M", "Qwen3.5-397B-A17B-Q4_K_M", "Nemotron-3-Nano-30B-A3B-Q4_K_M")
    out = {n: open_model(write_model(BIG_MODELS[n], root / f"{n}.gguf", header_only=True)[0]) for n in names}
    out["llama"] = open_model(write_model(SMALL_MODELS["llama"], root / "llama.gguf", header_only=True)[0])
    return out


def _project(model: Model, args: str) -> Projection:
    parsed = parse_server_args(shlex.split(args))
    assert not parsed.errors, parsed.errors
    return analyse_command(model, CPU_ONLY, parsed).projection


def _bytes(p: Projection, kind: str) -> int:
    return sum(b.bytes for b in p.buffers() if b.kind == kind)


def test_qwen3next_recurrent_layers_are_three_of_every_four(models: dict[str, Model]) -> None:
    flags = recurrent_layers(models["Qwen3-Next-80B-A3B-Q4_K_M"])
    assert [il for il, r in enumerate(flags) if not r] == [3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47]


def test_qwen3next_80b_kv_of_12_attention_layers_and_its_recurrent_state(models: dict[str, Model]) -> None:
    p = _project(models["Qwen3-Next-80B-A3B-Q4_K_M"], "-ngl 0 -c 32768 -np 2")
    # KV: 2 streams of 16384 cells; a layer's K: 2 KV heads x 256 x 2 B (f16) x 16384 x 2 = 32 MiB, V
    # the same: 64 MiB x 12 attention layers (not 48)
    assert _bytes(p, "kv") == 12 * 2 * (2 * 256 * 2 * 16384 * 2) == 768 * MiB
    # RS: d_inner 4096, d_state 128, n_group 16, d_conv 4: R 3 * (4096 + 2*16*128) = 24576, S 128 * 4096
    # = 524288 f32 per cell; 2 cells (-np 2), 36 recurrent layers
    assert _bytes(p, "rs") == 36 * 2 * (24576 + 524288) * 4 == 158_072_832
    [rs] = [b for b in p.buffers() if b.kind == "rs"]
    assert (rs.device, rs.name) == ("CPU", "CPU") and "recurrent state" in rs.why


def test_qwen35_397b_kv_of_15_attention_layers_and_its_recurrent_state(models: dict[str, Model]) -> None:
    p = _project(models["Qwen3.5-397B-A17B-Q4_K_M"], "-ngl 0 -c 65536 -np 1")
    # KV: 15 attention layers x (K + V) x 2 KV heads x 256 x 2 B x 65536 cells = 15 x 128 MiB
    assert _bytes(p, "kv") == 15 * 2 * (2 * 256 * 2 * 65536) == 1920 * MiB
    # RS: d_inner 8192 (64 value heads x 128): R 3 * (8192 + 2*16*128) = 36864, S 128 * 8192 = 1048576
    assert _bytes(p, "rs") == 45 * 1 * (36864 + 1048576) * 4 == 195_379_200


def test_nemotron_3_nano_kv_of_6_attention_blocks_and_23_mamba_states(models: dict[str, Model]) -> None:
    """Nemotron-H (src/models/nemotron-h.cpp 12-16, create_memory): a block is recurrent iff its
    head_count_kv and feed_forward_length are 0 (the 23 'M' of its pattern); the KV cache holds the blocks
    that are neither recurrent nor FFN (the 6 '*'), the 23 MoE blocks ('E') hold nothing."""
    model = models["Nemotron-3-Nano-30B-A3B-Q4_K_M"]
    assert [il for il, r in enumerate(recurrent_layers(model)) if r] == [
        i for i, c in enumerate("MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME") if c == "M"]
    p = _project(model, "-ngl 0 -c 65536 -np 1")
    # KV: 6 x (K + V) x 2 KV heads x 128 x 2 B x 65536 cells = 6 x 64 MiB
    assert _bytes(p, "kv") == 6 * 2 * (2 * 128 * 2 * 65536) == 384 * MiB
    # RS: d_inner 4096, 8 groups, state 128, conv 4: R 3 * (4096 + 2*8*128) = 18432, S 128 * 4096 = 524288
    assert _bytes(p, "rs") == 23 * 1 * (18432 + 524288) * 4 == 49_930_240


def test_cache_types_touch_the_kv_only(models: dict[str, Model]) -> None:
    """-ctk/-ctv q8_0: a KV row of 512 elements is 16 blocks of 34 B; the R and S stay f32."""
    p = _project(models["Qwen3-Next-80B-A3B-Q4_K_M"], "-ngl 0 -c 32768 -np 2 -ctk q8_0 -ctv q8_0")
    assert _bytes(p, "kv") == 12 * 2 * (16 * 34 * 16384 * 2)
    assert _bytes(p, "rs") == 36 * 2 * (24576 + 524288) * 4


def test_a_model_without_recurrent_layers_has_no_recurrent_state(models: dict[str, Model]) -> None:
    p = _project(models["llama"], "-ngl 0 -c 4096")
    assert _bytes(p, "rs") == 0 and not any(b.kind == "rs" for b in p.buffers())


def test_written_layer_flags_decide_over_the_interval(tmp_path: Path) -> None:
    """``attention.recurrent_layers`` (get_key_or_arr, read first) names the recurrent layers itself."""
    from dataclasses import replace

    flags = (True, False, True, True, False, True, True, True)
    spec = replace(SMALL_MODELS["qwen3next"], extra_kv={"attention.recurrent_layers": flags})
    spec = replace(spec, full_attention_interval=0)  # the tensors: written below for these flags
    model = open_model(write_model(spec, tmp_path / "m.gguf", header_only=True)[0])
    assert recurrent_layers(model) == flags


def test_ik_keeps_the_state_in_its_kv_buffer(models: dict[str, Model]) -> None:
    """ik_llama.cpp (src/llama.cpp llama_kv_cache_init): one stream of -c cells for the 12 attention
    layers' K and V, and per delta-net layer a ``cache_s_l`` tensor of n_embd_v_s() = 3 * (2*128*16 +
    4096) + (4096/32)^2 * 32 = 548864 f32 by min(max(1, -np), kv_size) = 2 slots, in the same buffer;
    its CPU buffer type allocates 32 B more (ggml_backend_cpu_buffer_type_alloc_buffer)."""
    from offload_planner.core.dialects import IK

    parsed = parse_server_args(shlex.split("-ngl 0 -c 32768 -np 2"), dialect=IK)
    p = analyse_command(models["Qwen3-Next-80B-A3B-Q4_K_M"], CPU_ONLY, parsed, IK).projection
    assert _bytes(p, "rs") == 0
    kv = 12 * 2 * (2 * 256 * 2 * 32768) + 36 * 548864 * 4 * 2
    assert _bytes(p, "kv") == kv + 32


def test_an_unmodelled_hybrid_architecture_is_said_to_be_unmodelled(models: dict[str, Model]) -> None:
    """bailingmoe3 is hybrid in the pinned build (llm_arch_is_hybrid) but not modelled here: the plan
    says so instead of showing a silent KV figure for every layer."""
    from dataclasses import replace

    from offload_planner.core.dialects import LLAMA_CPP
    from offload_planner.core.recurrent_state import memory_notes

    base = models["llama"]
    md = {("bailingmoe3." + k.removeprefix("llama.")) if k.startswith("llama.") else k: v
          for k, v in base.metadata.items()}
    md["general.architecture"] = "bailingmoe3"
    renamed = replace(base, metadata=md, key_offsets={})
    [note] = memory_notes(renamed, LLAMA_CPP)
    assert "bailingmoe3" in note and "not modelled" in note
    assert memory_notes(base, LLAMA_CPP) == []
    assert memory_notes(models["Qwen3-Next-80B-A3B-Q4_K_M"], LLAMA_CPP) == []  # modelled
