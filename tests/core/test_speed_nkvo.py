"""The speed estimate with the KV cache on the host (-nkvo / --no-kv-offload).

Without flash attention llama.cpp pins each layer's attention output to the CPU backend when
``offload_kqv`` is off (llama-graph.cpp ``build_attn_mha``) and its scheduler runs everything from
the KV store to that output on the CPU: a GPU layer splits the graph twice (Q, K, V down; the
attention output back), the KV cache is read from RAM at the host's bandwidth and the attention
FLOPs are the CPU's, per token in generation and per micro-batch in prompt processing.  With flash
attention only the KV store runs on the CPU; the attention op stays on the layer's GPU and the host
cache's K/V views are copied to it (ik_llama.cpp the same).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.compute import simulate
from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import resolve_context
from offload_planner.core.model import Model
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.speed.bottleneck import HOST_KV_PART
from offload_planner.core.speed.efficiency import DEFAULT
from offload_planner.core.speed.estimate import estimate, tg_tps
from offload_planner.core.speed.hardware import hardware_for
from offload_planner.core.speed.nkvo import host_kv_layers
from offload_planner.core.speed.rates import _bandwidth
from offload_planner.core.speed.reads import kv_bytes_at
from offload_planner.core.speed.report import speed_lines
from offload_planner.core.synth import BIG_MODELS, write_model

RES = Path(__file__).resolve().parents[2] / "resources"


@pytest.fixture(scope="module")
def qwen() -> Model:
    return open_model(str(RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf"))


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Model:
    """A dense model written by the synth (header only): Llama-3.1-70B's shape."""
    spec = BIG_MODELS["Llama-3.1-70B-Q4_K_M"]
    [path] = write_model(spec, tmp_path_factory.mktemp("nkvo") / "llama70b.gguf", header_only=True)
    return open_model(str(path))


def devices(*decls: str) -> DeviceSet:
    return DeviceSet(parse_device_decl("CPU=512GiB,ram=8xDDR5-4800,cores=16"),
                     tuple(parse_device_decl(d) for d in decls))


def plan(model: Model, ds: DeviceSet, args: str) -> Plan:
    return plan_from_args(model, ds, parse_server_args(args.split()))


def test_nkvo_adds_two_splits_per_gpu_layer_as_the_scheduler_does(qwen: Model, llama: Model) -> None:
    """Two graph splits a token for every layer whose attention weights are on a GPU, none for a
    CPU layer; as many as -nkvo adds in the engine's scheduler simulation of the one-token graph."""
    for m, ds in ((qwen, devices("CUDA0=rtx3090", "CUDA1=rtx3090")), (llama, devices("CUDA0=h100-pcie"))):
        n = m.summary.n_layer - m.summary.n_nextn
        for args, gpu_layers in (("-ngl 999", n), ("-ngl 20", 19), ("-ngl 999 -ot exps=CPU", n)):
            base = plan(m, ds, f"{args} -c 4096")
            host = plan(m, ds, f"{args} -nkvo -c 4096")
            hw = hardware_for(ds)
            e0, e1 = estimate(base, hw), estimate(host, hw)
            assert len(host_kv_layers(host, host.placement())) == gpu_layers, args
            assert e1.host_kv_layers == gpu_layers
            assert e1.n_splits == e0.n_splits + 2 * gpu_layers, (m.arch, args)
            sims = []
            for p in (base, host):
                ctx = resolve_context(p.context, m.summary.n_ctx_train, m.summary.n_swa)
                sim = simulate(m, ds, p.placement(), ctx, p.context)
                assert sim is not None
                sims.append(sim.reserves[-1].n_splits)  # the one-token graph (tg)
            assert sims[1] - sims[0] == 2 * gpu_layers, (m.arch, args, sims)


def test_nkvo_slows_generation_by_its_round_trips_and_the_host_kv_read(llama: Model) -> None:
    """At depth 0 -nkvo costs each GPU layer its round trip to the CPU; at the full context (-fa off) the
    extra time is the KV cache read from RAM at the host's bandwidth (or the CPU's attention FLOPs,
    where slower), and it grows with the context."""
    ds = devices("CUDA0=h100-pcie")
    hw = hardware_for(ds)
    base = plan(llama, ds, "-ngl 999 -c 32768")
    host = plan(llama, ds, "-ngl 999 -nkvo -fa off -c 32768")
    e0, e1 = estimate(base, hw), estimate(host, hw)
    n = llama.summary.n_layer
    rt = n * (2 * DEFAULT.split_latency_us.value + DEFAULT.host_attention_us.value) * 1e-6
    assert 1 / e1.tg_tps - 1 / e0.tg_tps == pytest.approx(rt, rel=0.05)
    assert tg_tps(host, hw) == pytest.approx(e1.tg_tps)
    assert e1.host_kv_ms == pytest.approx(1e3 * rt, rel=0.05)
    # at the full context: the whole cache read from RAM (on the CPU, none on the GPU)
    assert e1.device("CPU").kv_bytes_at_ctx > 0
    assert all(d.kv_bytes_at_ctx == 0 for d in e1.devices if d.name != "CPU")
    s = llama.summary
    ctx = resolve_context(host.context, s.n_ctx_train, s.n_swa)
    kv = kv_bytes_at(llama, host.placement(), host.context, ctx, host, ctx.n_ctx_seq)["CPU"]
    bw, _ = _bandwidth(hw["CPU"], DEFAULT)
    extra = 1 / e1.tg_tps_at_ctx - 1 / e1.tg_tps
    assert extra >= kv / (bw * 1e9) * (1 - 1e-9)
    # much slower than the GPU reading the same cache
    assert extra > 5 * (1 / e0.tg_tps_at_ctx - 1 / e0.tg_tps)


def test_nkvo_prompt_attention_runs_on_the_cpu(llama: Model) -> None:
    """Prompt processing with -nkvo -fa off: the attention of every micro-batch on the CPU, so pp falls
    with the prompt's length far faster than with the cache on the GPU; the bottleneck says so."""
    ds = devices("CUDA0=h100-pcie")
    hw = hardware_for(ds)
    base = plan(llama, ds, "-ngl 999 -fa off -c 32768")
    host = plan(llama, ds, "-ngl 999 -nkvo -fa off -c 32768")
    short = estimate(host, hw, prompt=512), estimate(base, hw, prompt=512)
    long = estimate(host, hw, prompt=16384), estimate(base, hw, prompt=16384)
    assert short[0].pp_tps < short[1].pp_tps
    assert long[0].pp_tps / long[1].pp_tps < 0.5 * short[0].pp_tps / short[1].pp_tps
    assert long[0].device("CPU").pp_ms > 10 * short[0].device("CPU").pp_ms
    assert long[0].pp_bottleneck.startswith(HOST_KV_PART)
    assert not long[1].pp_bottleneck.startswith(HOST_KV_PART)


def test_nkvo_bottleneck_and_report_name_the_host_kv_attention(llama: Model, qwen: Model) -> None:
    ds = devices("CUDA0=h100-pcie")
    hw = hardware_for(ds)
    est = estimate(plan(llama, ds, "-ngl 999 -nkvo -c 8192"), hw)
    # at depth 0 the 70B's weights on the GPU still dominate; at 8192 tokens the cache read from RAM
    assert est.bottleneck.startswith("CUDA0 memory bandwidth")
    assert est.bottleneck_at_ctx.startswith(HOST_KV_PART)
    # a model whose GPU reads are small: the round trips dominate already at depth 0
    qwen_est = estimate(plan(qwen, ds, "-ngl 999 -nkvo -c 8192"), hw)
    assert qwen_est.bottleneck.startswith(HOST_KV_PART)
    assert not estimate(plan(qwen, ds, "-ngl 999 -c 8192"), hw).bottleneck.startswith(HOST_KV_PART)
    text = "\n".join(speed_lines(est))
    assert f"tg bottleneck at 8192 tokens: {HOST_KV_PART}" in text
    assert f"-nkvo: {llama.summary.n_layer} GPU layers" in text
    assert "the CPU's round trip of a GPU layer" in text  # the assumption, with its source
    plain = estimate(plan(llama, ds, "-ngl 999 -c 8192"), hw)
    assert "-nkvo" not in "\n".join(speed_lines(plain))
    assert math.isfinite(est.tg_tps)


def test_nkvo_round_trips_are_in_the_speculative_verify_step(tmp_path: Path) -> None:
    """With a draft model the target's verify pass of n + 1 tokens makes -nkvo's round trips too."""
    from offload_planner.core.speed.speculation import speculation

    spec = BIG_MODELS["Llama-3.1-70B-Q4_K_M"]
    [path] = write_model(spec, tmp_path / "target.gguf", header_only=True)
    target = open_model(str(path))
    ds = devices("CUDA0=h100-pcie")
    hw = hardware_for(ds)
    draft = str(path)  # the model as its own draft: only the target's context differs below
    steps = []
    for extra in ("", " -nkvo"):
        p = plan(target, ds, f"-ngl 999 -c 4096 -md {draft} --spec-type draft-simple -ngld 999{extra}")
        sp = speculation(p, p.placement(), hw, DEFAULT, depth=0, target_kv={}, plain=(1.0, 1.0))
        assert sp is not None
        steps.append(sp.verify_ms)
    n = target.summary.n_layer
    rt_ms = n * (2 * DEFAULT.split_latency_us.value + DEFAULT.host_attention_us.value) * 1e-3
    assert steps[1] - steps[0] == pytest.approx(rt_ms, rel=0.05)


def _ik(model: Model, ds: DeviceSet, args: str) -> Plan:
    return plan_from_args(model, ds, parse_server_args(args.split(), dialect="ik_llama.cpp"), "ik_llama.cpp")


def test_flash_attention_keeps_the_attention_on_the_gpu_and_copies_the_cache(llama: Model) -> None:
    """With flash attention (mainline and ik_llama.cpp) only the KV store runs on the CPU: the
    attention op stays on the layer's GPU and the host cache's K/V views cross the link every token
    (the KV bytes at depth over the host link, none read by the CPU); with -fa off it runs on the CPU."""
    ds = devices("CUDA0=h100-pcie")
    hw = hardware_for(ds)
    n = llama.summary.n_layer
    link = hw["CUDA0"].link.value * DEFAULT.link.value * 1e9
    for make in (plan, _ik):
        fa = make(llama, ds, "-ngl 999 -nkvo -fa on -c 32768")
        nofa = make(llama, ds, "-ngl 999 -nkvo -fa off -c 32768")
        e_fa, e_nofa = estimate(fa, hw), estimate(nofa, hw)
        assert e_fa.n_splits == e_nofa.n_splits  # two a GPU layer either way
        assert e_fa.host_kv_layers == e_nofa.host_kv_layers == n
        # -fa on: the cache is read on the GPU after crossing the link; the CPU reads none of it
        kv = e_fa.device("CUDA0").kv_bytes_at_ctx
        assert kv > 0
        assert all(d.kv_bytes_at_ctx == 0 for d in e_fa.devices if d.name == "CPU")
        assert 1 / e_fa.tg_tps_at_ctx - 1 / e_fa.tg_tps >= kv / link
        assert e_fa.bottleneck_at_ctx.startswith(HOST_KV_PART)
        # -fa off: the CPU reads the cache
        assert e_nofa.device("CPU").kv_bytes_at_ctx > 0
        assert all(d.kv_bytes_at_ctx == 0 for d in e_nofa.devices if d.name != "CPU")
        # pp: -fa on computes the attention on the GPU (nothing on the CPU) and copies the cache per
        # micro-batch; -fa off computes it on the CPU
        long_fa, long_nofa = estimate(fa, hw, prompt=16384), estimate(nofa, hw, prompt=16384)
        assert all(d.pp_ms == 0 for d in long_fa.devices if d.name == "CPU")
        assert long_fa.pp_bottleneck.startswith(HOST_KV_PART) or long_fa.pp_bottleneck.startswith("CUDA0")
        assert long_nofa.device("CPU").pp_ms > 0
