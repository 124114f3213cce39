"""Plan warnings: rules that match nothing or are shadowed, and -ot syntax std::regex reads otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.diagnostics import plan_warnings, rule_reports
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import ContextParams, project
from offload_planner.core.placement import Override, PlacementOptions, place


def test_rule_statuses_and_regex_warnings(small_models: dict[str, Path]) -> None:
    m = open_model(small_models["qwen3moe"])
    devices = DeviceSet(Device("CPU", DeviceKind.CPU), (Device("RPC0", DeviceKind.RPC),))
    ovs = (Override("exps", "CPU"), Override(r"ffn_up_exps", "RPC0"), Override(r"nothing\Z", "CPU"),
           Override("attn_q.weight++", "RPC0"))
    proj = project(m, devices, place(m, devices, PlacementOptions(n_gpu_layers=99, overrides=ovs)),
                   ContextParams(n_ctx=2048))
    assert [r.status for r in rule_reports(proj, ovs)] == ["ok", "shadowed", "matches nothing", "ok"]
    text = "\n".join(plan_warnings(proj, ovs))
    assert "ffn_up_exps=RPC0 is shadowed" in text and r"nothing\Z=CPU matches no tensor" in text
    assert r"'\Z' is a literal 'Z'" in text and "not possessive" in text


def test_rule_reports_per_pattern_equal_the_per_name_path(small_models: dict[str, Path],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule reports from each pattern's matches at once (and from the model's cached name index)
    equal those from every tensor's hits (the path for rules that must be budgeted): shadowed and
    unmatched rules, a catch-all, NextN blocks left unloaded."""
    from offload_planner.core import rule_match

    rules = (Override("exps", "CPU"), Override(r"blk\.1\.", "RPC0"), Override(r"ffn_(up|down)", "CPU"),
             Override("exps", "RPC0"), Override("nomatch_xyz", "CPU"), Override("attn", "CPU"),
             Override(".*", "RPC0"))
    devices = DeviceSet(Device("CPU", DeviceKind.CPU), (Device("RPC0", DeviceKind.RPC),))
    got = []
    for name in ("qwen3moe", "deepseek2-mtp", "gemma3"):
        m = open_model(small_models[name])
        for k in range(1, len(rules) + 1):
            ovs = rules[:k]
            proj = project(m, devices, place(m, devices, PlacementOptions(n_gpu_layers=99, overrides=ovs)),
                           ContextParams(n_ctx=2048))
            got.append((rule_reports(proj, ovs), rule_reports(proj, ovs, tensors=m.tensors), proj, ovs))
    monkeypatch.setattr(rule_match.RuleSet, "matches_of_all", lambda self, index: None)
    rule_match.rule_set.cache_clear()
    for bulk, cached, proj, ovs in got:
        per_name = rule_reports(proj, ovs)
        assert bulk == per_name and cached == per_name, ovs
    assert {r.status for b, _, _, _ in got for r in b} == {"ok", "shadowed", "matches nothing"}
