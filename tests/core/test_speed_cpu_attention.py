"""One generated token's attention on the CPU at a depth: mainline llama.cpp's kernel runs far below
the peak (a public sweep's figure), ik_llama.cpp's keeps its own; expected times worked out here from
the model's shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.dialects.base import Dialect
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.speed.efficiency import DEFAULT, defaults_for
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import hardware_for
from offload_planner.core.speed.pp import pp_time

GiB = 1024**3


@pytest.mark.parametrize(("dialect", "figure"), [("llama.cpp", 0.032), ("ik_llama.cpp", 0.65)])
def test_a_cpu_tokens_attention_at_depth_runs_at_mainlines_measured_rate(small_models: dict[str, Path],
                                                                         dialect: str, figure: float) -> None:
    """A generated token after ``depth`` cells on the CPU adds its attention: the reads of the cells, or
    where slower 2 x heads x (K + V dims) FLOPs a cell a layer at 0.032 of the CPU's peak with mainline
    (ik_llama.cpp PR 518's mainline sweep, 3.6 µs a token per cell for LLaMA-3.1-8B on a Ryzen-7950X),
    which is slower here; ik_llama.cpp's own kernels keep 0.65 (its PR 612): the reads are slower."""
    model = open_model(small_models["llama"])
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB, hardware=(("bw", "40"),)), ())
    args = parse_server_args(["-c", "4096", "-t", "2"], dialect=dialect)
    plan = plan_from_args(model, devices, args, dialect)
    hw = hardware_for(devices, threads=2)
    depth = 3000
    est = estimate(plan, hw, eff=DEFAULT if dialect == "llama.cpp" else None, depth=depth)
    s = model.summary
    head = s.n_embd // s.n_head
    compute = 2.0 * s.n_head * 2 * head * depth * s.n_layer / (hw["CPU"].tflops.value * 1e12 * figure)
    reads = 2 * s.n_layer * s.n_head_kv * head * 2 * depth / 20e9  # f16 K and V; -t 2 x 10 GB/s a thread
    assert est.tg_tps_at_depth is not None
    added = 1.0 / est.tg_tps_at_depth - 1.0 / est.tg_tps
    assert added == pytest.approx(max(compute, reads), rel=1e-6)
    assert (compute > reads) is (dialect == "llama.cpp")


def test_a_measurement_at_a_depth_calibrates_the_bandwidth_net_of_the_attention(
        small_models: dict[str, Path]) -> None:
    """``launch --bench`` times tokens generated after its prompt: compared with the estimate at their
    depth, a measurement that matches it leaves the CPU's bandwidth as it is (against tg at depth 0,
    the attention's time was read as slower reads: probe_bandwidth 0.9 -> lower)."""
    from offload_planner.core.speed.calibrate import calibrate
    from offload_planner.core.speed.hardware import Figure, Source

    model = open_model(small_models["llama"])
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), ())
    plan = plan_from_args(model, devices, parse_server_args(["-c", "4096", "-t", "8"]))
    hw = hardware_for(devices, threads=8, probe=Figure(40.0, "GB/s", Source.MEASURED, "pinned"))
    est = estimate(plan, hw, eff=DEFAULT, depth=3000)
    assert est.tg_tps_at_depth is not None and est.tg_tps_at_depth < 0.9 * est.tg_tps
    cal = calibrate(est, hw, DEFAULT, tg_tps=est.tg_tps_at_depth)
    assert cal.values == {"probe_bandwidth": pytest.approx(0.9, rel=1e-3)}


@pytest.mark.parametrize(("dialect", "ctk", "ctv", "per_query"), [
    ("llama.cpp", "q8_0", "q8_0", True),  # a quantized cache: the one-query kernel
    ("llama.cpp", "q8_0", "f16", True),  # K and V of different types: the same
    ("llama.cpp", "f32", "f32", False),  # ggml-cpu's tiled flash attention, as over F16
    ("ik_llama.cpp", "q8_0", "q8_0", False),  # ik_llama.cpp's own CPU kernels
])
def test_a_prompts_cpu_flash_attention_over_a_quantized_cache_runs_one_query_at_a_time(
        small_models: dict[str, Path], dialect: str, ctk: str, ctv: str, per_query: bool) -> None:
    """Mainline's CPU flash attention takes its tiled kernel only for an F16/F32 cache whose K and V share
    a type (ops.cpp ``kv_is_f32_or_f16``, ``k->type == v->type``); otherwise a prompt's batch runs a
    generated token's kernel, one query at a time: its attention costs ``cpu_compute / cpu_attention``
    (0.5 / 0.032) of the F16 cache's (pp.cpu_attention_cost)."""
    model = open_model(small_models["llama"])
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB, hardware=(("bw", "40"),)), ())

    def attn_s(k: str, v: str) -> float:
        argv = ["-c", "4096", "-t", "2", "-fa", "on", "-ctk", k, "-ctv", v]
        args = parse_server_args(argv, dialect=dialect)
        plan = plan_from_args(model, devices, args, dialect)
        assert plan.context.flash_attn
        return pp_time(plan, plan.placement(), hardware_for(devices, threads=2), defaults_for(plan.dialect),
                       2048, 512).attn_s["CPU"]

    eff = defaults_for(Dialect(dialect))
    expected = eff.cpu_compute.value / eff.cpu_attention.value if per_query else 1.0
    assert attn_s(ctk, ctv) / attn_s("f16", "f16") == pytest.approx(expected, rel=1e-9)
