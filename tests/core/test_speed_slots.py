"""Every -np slot generating at once: llama-server decodes one batch with a token of each busy slot
(tools/server/server-context.cpp ``update_slots``), so a step reads the weights once, the routed experts
any token routes to, and each slot's KV.

Expected figures come from the GGUF's own tensor list and the declared CPU bandwidth (a CPU whose
compute is declared far beyond its bandwidth: each pass costs its bytes), not from the estimator.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.core.test_speed_speculative import EFF_BW, _bytes, _hw, _plan

from offload_planner.core.speed.efficiency import DEFAULT
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.report import speed_json, speed_lines
from offload_planner.core.speed.slots import with_slots


def test_dense_total_grows_up_to_n_times_one_request(small_models: dict[str, Path]) -> None:
    plan = _plan(small_models["llama"], ["-c", "1024", "-np", "4"])
    m = plan.model
    names = [t.name for t in m.tensors]
    one_s, step_s = _bytes(m, names, 1, 1.0) / EFF_BW, _bytes(m, names, 4, 1.0) / EFF_BW
    est = with_slots(estimate(plan, _hw(), eff=DEFAULT), plan, _hw(), DEFAULT)
    sl = est.slots
    assert sl is not None and sl.n_slots == 4 and sl.experts_read is None
    assert est.tg_tps == pytest.approx(1 / one_s, rel=1e-9)
    assert est.tg_tps < sl.tg_tps_total <= 4 * est.tg_tps  # memory-bound: the weights read once a step
    assert sl.tg_tps_each == pytest.approx(1 / step_s, rel=1e-9)
    assert sl.tg_tps_total == pytest.approx(4 / step_s, rel=1e-9)
    # the 1024-cell cache (unified, the server's -np 4 default here too) shared: 256 cells each
    assert sl.cells == 1024 and sl.depth_at_ctx == 256
    assert sl.tg_tps_total_at_ctx < sl.tg_tps_total  # each slot reads its own KV


def test_moe_reads_the_union_of_the_experts(small_models: dict[str, Path]) -> None:
    plan = _plan(small_models["glm4moe"], ["-c", "2048", "-np", "3"])
    m = plan.model
    k, e = m.summary.n_expert_used, m.summary.n_expert
    trunk = [t.name for t in m.tensors if not t.name.startswith("blk.4.")]  # blk.4: the NextN block
    est = with_slots(estimate(plan, _hw(), eff=DEFAULT), plan, _hw(), DEFAULT)
    sl = est.slots
    assert sl is not None and sl.experts_read == pytest.approx(1 - (1 - k / e) ** 3, abs=1e-4)
    assert sl.tg_tps_each == pytest.approx(EFF_BW / _bytes(m, trunk, 3, k / e), rel=1e-9)
    assert sl.tg_tps_total < 3 * est.tg_tps  # three tokens route to more experts than one


def test_one_slot_has_no_line(small_models: dict[str, Path]) -> None:
    plan = _plan(small_models["llama"], ["-c", "1024", "-np", "1"])
    base = estimate(plan, _hw(), eff=DEFAULT)
    assert with_slots(base, plan, _hw(), DEFAULT) is base
    assert "slots" not in speed_json(base)
    assert not any("slots generating" in line for line in speed_lines(base))


def test_drafting_plan_says_the_figure_is_without_it(small_models: dict[str, Path]) -> None:
    plan = _plan(small_models["glm4moe"], ["-c", "2048", "-np", "2", "--spec-type", "draft-mtp"])
    from offload_planner.core.speed.speculation import with_speculation

    est = with_speculation(estimate(plan, _hw(), eff=DEFAULT), plan, _hw(), DEFAULT)
    est = with_slots(est, plan, _hw(), DEFAULT)
    assert est.spec is not None and est.slots is not None and est.slots.drafting
    assert any("all 2 slots generating" in ln and "(without drafting)" in ln for ln in speed_lines(est))


def test_plan_cli_prints_and_carries_it(small_models: dict[str, Path],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from offload_planner.cli import main

    common = ["plan", str(small_models["llama"]), "--no-detect", "--device", "CPU=64GiB,bw=100GB/s"]
    assert main([*common, "--json", "--", "-c", "2048", "-np", "2"]) == 0
    speed = json.loads(capsys.readouterr().out)["speed"]
    sl = speed["slots"]
    assert sl["n"] == 2 and sl["depth_at_ctx"] == 1024 and sl["cells"] == 2048 and sl["drafting"] is False
    assert speed["tg_tps"] < sl["tg_tps_total"] <= 2 * speed["tg_tps"]
    assert sl["tg_tps_total_at_ctx"] <= sl["tg_tps_total"]
    assert sl["tg_tps_each"] <= speed["tg_tps"]
    assert main([*common, "--", "-c", "2048"]) == 0  # the server's default: auto, 4 slots
    out = capsys.readouterr().out
    assert "  all 4 slots generating: " in out
    assert "t/s in total at 512 tokens each (the 2048-token cache shared)" in out
    assert main([*common, "--json", "--", "-c", "2048", "-np", "1"]) == 0
    assert "slots" not in json.loads(capsys.readouterr().out)["speed"]
