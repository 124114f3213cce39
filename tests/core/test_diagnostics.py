"""Plan warnings: rules that match nothing or are shadowed, and -ot syntax std::regex reads otherwise."""

from __future__ import annotations

from pathlib import Path

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
