"""Prompt processing after ``--depth`` tokens of context: each micro-batch's attention computes over
the cells before it and reads their KV.  Expected figures are computed here from the GGUF's tensor
list (shapes, byte counts), its attention shape and the KV row size of an f16 cache, on a CPU-only
plan whose compute or bandwidth is declared out of the way in turn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.speed.efficiency import DEFAULT
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import DeviceSpeed, Figure, Hardware, Source

GiB = 1024**3
PROMPT, DEPTH = 512, 4096
ARGS = ["-c", "8192", "-np", "1", "-ub", "512", "-b", "512"]


def _hw(bw: float, tflops: float) -> Hardware:
    b = Figure(bw, "GB/s", Source.DECLARED, "test")
    compute = Figure(tflops, "TFLOPS", Source.DECLARED, "test")
    return Hardware({"CPU": DeviceSpeed("CPU", DeviceKind.CPU, b, compute, b)})


def _plan(model: Path) -> Plan:
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), ())
    return plan_from_args(open_model(model), devices, parse_server_args(ARGS))


def _matrices(m: Model) -> tuple[int, int, int, int]:
    """(bytes, elements) of the trunk's matrices that are not routed experts, then of the experts
    (the embedding is a row lookup; the NextN block does not run without MTP; the output matrix and
    the last trunk layer's FFN multiply a prompt's output rows alone: core.speed.pp.output_rows_only)."""
    db = de = eb = ee = 0
    for t in m.tensors:
        if len(t.shape) < 2 or t.name in ("token_embd.weight", "output.weight") or t.name.startswith(
                ("blk.4.", "blk.3.ffn_")):
            continue
        if "_exps" in t.name:
            eb, ee = eb + t.nbytes, ee + t.n_elements
        else:
            db, de = db + t.nbytes, de + t.n_elements
    return db, de, eb, ee


def _attn(start: int) -> float:
    """FLOPs of the micro-batch's attention over the cells before it (4 layers x 4 heads x (64 + 64)
    x 2 FLOPs a cell, each token over ``start + PROMPT / 2`` cells on average)."""
    return 4 * 2.0 * 4 * (64 + 64) * PROMPT * (start + PROMPT / 2)


def test_pp_after_depth_reads_the_cache(small_models: dict[str, Path]) -> None:
    """Bandwidth-bound: one micro-batch reads the weights (every expert some token routes to) and
    the KV of ``depth + prompt`` cells (on a CPU its compute, here all but free, adds to the reads)."""
    plan = _plan(small_models["glm4moe"])
    m = plan.model
    db, de, eb, ee = _matrices(m)
    kv_cell = 4 * 2 * (2 * 64 * 2)  # 4 trunk layers x (K + V) x 2 KV heads x 64 x f16
    hit = 1 - (1 - 2 / 8) ** PROMPT
    bw = 10.0 * DEFAULT.cpu_bandwidth.value * 1e9
    flops = 1e6 * DEFAULT.cpu_compute.value * 1e12
    weights = 2.0 * PROMPT * (de + ee * 2 / 8)
    est = estimate(plan, _hw(10.0, 1e6), eff=DEFAULT, prompt=PROMPT, depth=DEPTH)
    assert est.pp_tps == pytest.approx(
        PROMPT / ((db + eb * hit + kv_cell * PROMPT) / bw + (weights + _attn(0)) / flops), rel=1e-9)
    at_depth = (db + eb * hit + kv_cell * (DEPTH + PROMPT)) / bw + (weights + _attn(DEPTH)) / flops
    assert est.pp_tps_at_depth == pytest.approx(PROMPT / at_depth, rel=1e-9)


def test_pp_after_depth_computes_attention_over_it(small_models: dict[str, Path]) -> None:
    """Compute-bound: 2 x active params per token, plus attention of each token over the cells
    before it (4 layers x 4 heads x (64 + 64) x 2 FLOPs a cell); the reads, here all but free, add."""
    plan = _plan(small_models["glm4moe"])
    db, de, eb, ee = _matrices(m := plan.model)
    assert m.summary.n_head == 4
    flops = DEFAULT.cpu_compute.value * 1e12
    weights = 2.0 * PROMPT * (de + ee * 2 / 8)
    kv_cell = 4 * 2 * (2 * 64 * 2)
    hit = 1 - (1 - 2 / 8) ** PROMPT
    bw = 1e6 * DEFAULT.cpu_bandwidth.value * 1e9

    def reads(start: int) -> float:
        return (db + eb * hit + kv_cell * (start + PROMPT)) / bw

    est = estimate(plan, _hw(1e6, 1.0), eff=DEFAULT, prompt=PROMPT, depth=DEPTH)
    assert est.pp_tps == pytest.approx(PROMPT / ((weights + _attn(0)) / flops + reads(0)), rel=1e-9)
    assert est.pp_tps_at_depth == pytest.approx(PROMPT / ((weights + _attn(DEPTH)) / flops + reads(DEPTH)),
                                                rel=1e-9)
    assert est.pp_tps_at_depth < est.pp_tps
    assert estimate(plan, _hw(1e6, 1.0), eff=DEFAULT, prompt=PROMPT).pp_tps_at_depth is None


def test_plan_depth_flag(small_models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    from offload_planner.cli import main

    common = ["plan", str(small_models["glm4moe"]), "--no-detect", "--device", "CPU=64GiB,bw=100GB/s"]
    assert main([*common, "--json", "--depth", str(DEPTH), "--prompt", str(PROMPT), "--", *ARGS]) == 0
    speed = json.loads(capsys.readouterr().out)["speed"]
    assert speed["depth"] == DEPTH and speed["pp_tps_at_depth"] < speed["pp_tps"]
    assert speed["tg_tps_at_ctx"] < speed["tg_tps_at_depth"] < speed["tg_tps"]  # 4096 of 8192 cells
    assert main([*common, "--depth", "8000", "--", *ARGS]) == 0
    out = capsys.readouterr().out
    assert "after 8000 tokens of context (--depth): pp" in out
    assert "--depth 8000 + --prompt 4096 tokens exceed the context of 8192" in out
    with pytest.raises(SystemExit):
        main([*common, "--depth", "-5", "--", *ARGS])
    assert "--depth '-5'" in capsys.readouterr().err


def test_a_cpu_micro_batch_adds_its_reads_to_its_compute(small_models: dict[str, Path]) -> None:
    """A CPU's threads both stream the weights and multiply them: a micro-batch's time is its
    compute plus its reads (a GPU's is the larger of the two), so the prompt's time with both finite
    is the sum of the times with either one out of the way."""
    plan = _plan(small_models["glm4moe"])

    def seconds(bw: float, tflops: float) -> float:
        return PROMPT / estimate(plan, _hw(bw, tflops), eff=DEFAULT, prompt=PROMPT).pp_tps

    both, reads, compute = seconds(10.0, 10.0), seconds(10.0, 1e9), seconds(1e9, 10.0)
    assert min(reads, compute) > 0.2 * max(reads, compute)  # neither negligible
    assert both == pytest.approx(reads + compute, rel=1e-6)
