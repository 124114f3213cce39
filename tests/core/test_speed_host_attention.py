"""A prompt's attention of the layers left on the CPU, when op offload takes the micro-batch to a GPU.

llama.cpp's scheduler gives a CPU layer's output projection (a host weight) to the op-offload GPU once a
micro-batch reaches the offload batch (pass 1, ``1.off``); the attention op has no weight and "expand gpu
up" from that projection gives it the GPU too (ggml-backend.cpp pass 2).  The host cache's K/V views are
then copied to the GPU every micro-batch, and the CPU's own attention kernels (the one-query-row kernel of
a quantized cache with flash attention) do not run.  The project's scheduler replica (core.compute, checked
against llama.cpp's compute buffers) copies those views in the prompt's graph; the estimate prices the
attention there.
"""

from __future__ import annotations

import pytest

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.compute import simulate
from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import resolve_context
from offload_planner.core.model import Model
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import hardware_for
from offload_planner.core.synth import BIG_MODELS, write_model

NGL = 14  # of Llama 3.2 3B's 28 layers
CTX = 16384
PROMPT = 8192
DEVICES = DeviceSet(parse_device_decl("CPU=64GiB,bw=60GB/s,cores=8,isa=avx2"),
                    (parse_device_decl("CUDA0=rtx3090"),))


@pytest.fixture(scope="module")
def llama3b(tmp_path_factory: pytest.TempPathFactory) -> Model:
    [path] = write_model(BIG_MODELS["Llama-3.2-3B-Q4_K_M"], tmp_path_factory.mktemp("m") / "l.gguf",
                         header_only=True)
    return open_model(str(path))


def _plan(model: Model, cache: str, *extra: str) -> Plan:
    args = f"-ngl {NGL} -fa on -c {CTX} -ctk {cache} -ctv {cache} -np 1 -t 8".split() + list(extra)
    return plan_from_args(model, DEVICES, parse_server_args(args))


def _kv_view_copies(model: Model, p: Plan) -> int:
    """Bytes the scheduler replica copies to the GPU in the prompt's graph besides host weights."""
    ctx = resolve_context(p.context, model.summary.n_ctx_train, model.summary.n_swa)
    sim = simulate(model, DEVICES, p.placement(), ctx, p.context)
    assert sim is not None
    pp = sim.reserves[0]
    gpu = [b.name for b in sim.backends].index("CUDA0")
    return pp.copies_bytes[gpu] - pp.weight_copies_bytes[gpu]


def test_the_replica_copies_the_host_cache_views_to_the_offload_gpu(llama3b: Model) -> None:
    """The prompt graph's copies to the GPU hold every CPU layer's K/V views (8 KV heads x 128 x 2, q8_0,
    over the whole cache of the reserve) with op offload, and none without it."""
    s = llama3b.summary
    views = (s.n_layer - NGL) * CTX * 2 * 8 * 128 * 34 // 32
    assert _kv_view_copies(llama3b, _plan(llama3b, "q8_0")) >= views
    assert _kv_view_copies(llama3b, _plan(llama3b, "q8_0", "--no-op-offload")) < views / 10


def test_cpu_layers_prompt_attention_follows_op_offload(llama3b: Model) -> None:
    """With op offload the CPU layers' prompt attention runs on the GPU: a q8_0 cache costs the prompt
    about what an F16 one does (its views are half the copy).  Without op offload it stays on the CPU,
    whose flash attention over a quantized cache is the one-query-row kernel: the q8_0 prompt is slower
    there.  Generation (one token, below the offload batch) is unchanged by the rule."""
    hw = hardware_for(DEVICES)
    q8 = estimate(_plan(llama3b, "q8_0"), hw, prompt=PROMPT)
    f16 = estimate(_plan(llama3b, "f16"), hw, prompt=PROMPT)
    assert q8.pp_tps == pytest.approx(f16.pp_tps, rel=0.1)
    q8_cpu = estimate(_plan(llama3b, "q8_0", "--no-op-offload"), hw, prompt=PROMPT)
    f16_cpu = estimate(_plan(llama3b, "f16", "--no-op-offload"), hw, prompt=PROMPT)
    assert q8_cpu.pp_tps < 0.8 * f16_cpu.pp_tps
    assert q8.pp_tps > 1.5 * q8_cpu.pp_tps
    assert q8.tg_tps == q8_cpu.tg_tps


def test_the_cache_views_cost_the_link(llama3b: Model) -> None:
    """The host cache's views cross the GPU's host link each micro-batch: the prompt's copy time grows
    with the cache's bytes (F16 views twice q8_0's)."""
    hw = hardware_for(DEVICES)
    q8 = estimate(_plan(llama3b, "q8_0"), hw, prompt=PROMPT)
    f16 = estimate(_plan(llama3b, "f16"), hw, prompt=PROMPT)
    assert f16.pp_transfer_ms > q8.pp_transfer_ms


def test_a_cache_type_cuda_flash_attention_refuses_keeps_the_cpu(llama3b: Model) -> None:
    """CUDA's flash attention takes F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 caches (fattn.cu
    ``ggml_cuda_fattn_kv_type_supported``); with an IQ4_NL cache the op is unsupported on the GPU and the
    CPU layers' prompt attention stays on the CPU, as without op offload."""
    hw = hardware_for(DEVICES)
    iq4 = estimate(_plan(llama3b, "iq4_nl"), hw, prompt=PROMPT)
    q4 = estimate(_plan(llama3b, "q4_0"), hw, prompt=PROMPT)
    iq4_cpu = estimate(_plan(llama3b, "iq4_nl", "--no-op-offload"), hw, prompt=PROMPT)
    assert iq4.pp_tps < 0.5 * q4.pp_tps
    assert iq4.pp_tps > iq4_cpu.pp_tps  # the weights' matrices still go to the GPU
