"""Plan files (Qt-free): versioned JSON round trip, atomic writes, the model fingerprint."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest

from offload_planner.core.devices import Device, DeviceKind, DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.placement import Override
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.synth import SMALL_MODELS, write_model
from offload_planner.ui.plan_io import (
    VERSION,
    PlanFile,
    PlanFileError,
    fingerprint,
    load_plan,
    plan_json,
    save_plan,
)


def _plan(path: Path) -> Plan:
    model = open_model(path)
    cpu = Device("CPU", DeviceKind.CPU, 64 << 30, 60 << 30, margin=2 << 30)
    devices = DeviceSet(cpu, (replace(parse_device_decl("CUDA0=24GiB"), margin=1 << 30),))
    plan = plan_from_args(model, devices, argparse.Namespace(ctx_size=4096, cache_type_k="q8_0"))
    popts = replace(plan.placement_options, overrides=(Override(r"blk\.1\.", "CPU", "-ot"),))
    return replace(
        plan,
        placement_options=popts,
        moves={"blk.2.ffn_up_exps.weight": "CPU"},
        extra_args=["--port", "8080"],
    )


def test_round_trip_keeps_everything(tmp_path: Path, qwen3moe_path: Path) -> None:
    plan = _plan(qwen3moe_path)
    target = tmp_path / "my.plan.json"
    save_plan(target, PlanFile.of(plan, {"path": "/opt/llama/llama-server"}))
    data = json.loads(target.read_text())
    assert data["format"] == "offload-planner-plan" and data["version"] == VERSION
    assert data["model"]["fingerprint"]["n_tensors"] == len(plan.model.tensors)
    pf = load_plan(target)
    again, notes = pf.to_plan(plan.model)
    assert notes == [] and pf.model_changes(plan.model) == []
    assert again.devices == plan.devices
    assert again.placement_options == plan.placement_options
    assert again.context == plan.context
    assert again.moves == plan.moves and again.extra_args == plan.extra_args
    assert pf.backend == {"path": "/opt/llama/llama-server"}
    assert [p.device for p in again.placement().items] == [p.device for p in plan.placement().items]


def test_write_is_atomic(tmp_path: Path, qwen3moe_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan(qwen3moe_path)
    target = tmp_path / "p.plan.json"
    save_plan(target, PlanFile.of(plan))
    before = target.read_bytes()

    def boom(*_a: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("offload_planner.ui.plan_io.os.replace", boom)
    with pytest.raises(PlanFileError, match="No space left"):
        save_plan(target, PlanFile.of(replace(plan, moves={})))
    assert target.read_bytes() == before, "the old file is untouched"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.plan.json"], "no temp file is left behind"


def test_changed_model_is_detected(tmp_path: Path) -> None:
    a = write_model(SMALL_MODELS["qwen3moe"], tmp_path / "m.gguf")[0]
    plan = _plan(a)
    pf = PlanFile.of(plan)
    bigger = replace(SMALL_MODELS["qwen3moe"], n_ff_exp=512)
    write_model(bigger, a)  # same path, different tensors
    changed = open_model(a)
    diffs = pf.model_changes(changed)
    assert diffs and any("size" in d for d in diffs) and any("tensor table" in d for d in diffs)
    assert fingerprint(changed) != pf.fingerprint


def test_moves_of_missing_tensors_are_dropped_with_a_note(qwen3moe_path: Path) -> None:
    plan = _plan(qwen3moe_path)
    pf = PlanFile.of(replace(plan, moves={**plan.moves, "blk.99.ffn_up_exps.weight": "CPU"}))
    again, notes = pf.to_plan(plan.model)
    assert "blk.99.ffn_up_exps.weight" not in again.moves
    assert notes and "not in the model" in notes[0]


def test_bad_files_are_refused(tmp_path: Path, qwen3moe_path: Path) -> None:
    p = tmp_path / "x.json"
    p.write_text("{not json")
    with pytest.raises(PlanFileError, match="not JSON"):
        load_plan(p)
    p.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(PlanFileError, match="not an offload-planner plan"):
        load_plan(p)
    data = plan_json(PlanFile.of(_plan(qwen3moe_path)))
    p.write_text(json.dumps({**data, "version": VERSION + 1}))
    with pytest.raises(PlanFileError, match="newer"):
        load_plan(p)
    del data["devices"]
    p.write_text(json.dumps(data))
    with pytest.raises(PlanFileError, match="missing or bad field"):
        load_plan(p)
    with pytest.raises(PlanFileError, match="cannot read"):
        load_plan(tmp_path / "absent.json")


def test_unknown_fields_from_newer_writers_are_ignored(tmp_path: Path, qwen3moe_path: Path) -> None:
    data = plan_json(PlanFile.of(_plan(qwen3moe_path)))
    data["context"]["future_knob"] = 3
    data["devices"]["gpus"][0]["future_field"] = "x"
    p = tmp_path / "x.plan.json"
    p.write_text(json.dumps(data))
    pf = load_plan(p)
    assert pf.devices.gpus[0].name == "CUDA0" and pf.context.n_ctx == 4096
