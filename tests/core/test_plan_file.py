"""Plan files (Qt-free): versioned JSON round trip, atomic writes, the model fingerprint; every
corruption refused with one error naming the file and the JSON path of the bad field; saving keeps
the file's mode and a symlink, cleans what a killed save left and never writes a secret."""

from __future__ import annotations

import argparse
import copy
import json
import os
import stat
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from offload_planner.core.devices import Device, DeviceKind, DeviceSet, parse_device_decl
from offload_planner.core.dialects.base import Dialect
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.placement import Override
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.plan_edits import with_dialect
from offload_planner.core.plan_file import (
    MAX_FILE_BYTES,
    VERSION,
    PlanFile,
    PlanFileError,
    fingerprint,
    load_plan,
    plan_json,
    require_regular_file,
    save_plan,
)
from offload_planner.core.synth import SMALL_MODELS, write_model


@pytest.fixture(scope="module")
def qwen3moe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(SMALL_MODELS["qwen3moe"], tmp_path_factory.mktemp("plan_file") / "qwen3moe.gguf")[0]


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

    monkeypatch.setattr("offload_planner.core.plan_file.os.replace", boom)
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
    with pytest.raises(PlanFileError, match=r"\$\.devices: missing"):
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


# --- every corruption: one PlanFileError naming the file and the field ----------------------------


def _valid(qwen3moe_path: Path) -> dict[str, Any]:
    """A plan file with RPC0 (gpus[0], llama.cpp lists RPC servers first) and CUDA0 (gpus[1])."""
    plan = _plan(qwen3moe_path)
    data = plan_json(PlanFile.of(replace(plan, devices=DeviceSet(plan.devices.cpu, (
        *plan.devices.gpus, Device("RPC0", DeviceKind.RPC, 8 << 30, endpoint="127.0.0.1:50052"))))))
    return json.loads(json.dumps(data))


def _set(data: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    """``data`` with the value at a dotted path (``devices.gpus.0.total``) replaced."""
    out = copy.deepcopy(data)
    node: Any = out
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last = keys[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return out


BAD_FIELDS = [
    ("version", 0, "$.version", "out of range"),
    ("version", True, "$.version", "expected an integer"),
    ("version", "1", "$.version", "expected an integer"),
    ("dialect", "vllm", "$.dialect", "not one of"),
    ("model.path", "", "$.model.path", "empty"),
    ("model.path", 7, "$.model.path", "expected a string"),
    ("model.path", "ftp://example.com/m.gguf", "$.model.path", "only local paths and http(s) URLs"),
    ("model.path", "/models/m\u0000.gguf", "$.model.path", "NUL"),
    ("model.path", "/models/\ud800.gguf", "$.model.path", "lone surrogate"),
    ("moves", {"blk.\udc00": "CPU"}, '$.moves["blk.\\udc00"]', "lone surrogate"),
    ("model.fingerprint.file_bytes", -1, "$.model.fingerprint.file_bytes", "out of range"),
    ("model.fingerprint.tensor_table_sha256", "zz", "$.model.fingerprint.tensor_table_sha256", "SHA-256"),
    ("devices.cpu.kind", "CUDA", "$.devices.cpu.kind", "does not match"),
    ("devices.gpus.1.name", "GPU0", "$.devices.gpus[1].name", "not a device name"),
    ("devices.gpus.1.name", "CPU", "$.devices.gpus[1].kind", "CUDA does not match the device name CPU"),
    ("devices.gpus.1", {"name": "CPU", "kind": "CPU"}, "$.devices.gpus[1].name", "CPU cannot be a GPU"),
    ("devices.gpus.1.total", -5, "$.devices.gpus[1].total", "out of range"),
    ("devices.gpus.1.total", 1.5, "$.devices.gpus[1].total", "expected an integer"),
    ("devices.gpus.1.margin", None, "$.devices.gpus[1].margin", "expected an integer"),
    ("devices.gpus.1.bandwidth_gbs", "fast", "$.devices.gpus[1].bandwidth_gbs", "expected a number"),
    ("devices.gpus.0.endpoint", "127.0.0.1:99999", "$.devices.gpus[0].endpoint", "HOST:PORT"),
    ("devices.gpus.0.endpoint", "a,b:1", "$.devices.gpus[0].endpoint", "HOST:PORT"),
    ("devices.gpus.0.endpoint", " 127.0.0.1:50052", "$.devices.gpus[0].endpoint", "HOST:PORT"),
    ("devices.gpus.0.endpoint", "127.0.0.1:x50052", "$.devices.gpus[0].endpoint", "HOST:PORT"),
    ("devices.gpus.0.name", "CUDA0", "$.devices.gpus[0].kind", "RPC does not match the device name CUDA0"),
    ("devices.gpus.0", {"name": "CUDA0", "kind": "CUDA"}, "$.devices.gpus[1].name", "CUDA0 appears twice"),
    ("placement_options.n_gpu_layers", -1, "$.placement_options.n_gpu_layers", "out of range"),
    ("placement_options.tensor_split", [1, "x"], "$.placement_options.tensor_split[1]", "expected a number"),
    ("placement_options.tensor_split", [-1.0], "$.placement_options.tensor_split[0]", "out of range"),
    ("placement_options.split_mode", "graph", "$.placement_options.split_mode", "not one of"),
    ("placement_options.main_gpu", 7, "$.placement_options.main_gpu", "out of range"),
    ("placement_options.use_mmap", 1, "$.placement_options.use_mmap", "expected true or false"),
    ("placement_options.cpu_profile", "risc", "$.placement_options.cpu_profile", "not one of"),
    ("placement_options.overrides.0.pattern", "blk\\.(", "$.placement_options.overrides[0].pattern",
     "-ot pattern"),
    ("placement_options.overrides.0.buft", "CUDA7", "$.placement_options.overrides[0].buft", "not a device"),
    ("context.n_ctx", "4096", "$.context.n_ctx", "expected an integer"),
    ("context.n_seq_max", 0, "$.context.n_seq_max", "out of range"),
    ("context.n_batch", 2**31, "$.context.n_batch", "out of range"),
    ("context.type_k", "q9_9", "$.context.type_k", "not one of"),
    ("context.mla", 9, "$.context.mla", "out of range"),
    ("context.mla", 2, "$.context.mla", "an ik_llama.cpp setting"),
    ("context.dialect", "ik_llama.cpp", "$.context.dialect", "differs from the plan's dialect"),
    ("placement_options.output_first", False, "$.placement_options.output_first", "must be true"),
    ("moves", {"blk.0.attn_q.weight": "CUDA3"}, '$.moves["blk.0.attn_q.weight"]',
     "not a device of this plan"),
    ("moves", [], "$.moves", "expected an object"),
    ("extra_args", ["--port", 8080], "$.extra_args[1]", "expected a string"),
    ("extra_args", "--port 8080", "$.extra_args", "expected a list"),
    ("backend", {"path": None}, '$.backend["path"]', "expected a string"),
]


@pytest.mark.parametrize(("where", "value", "path", "why"), BAD_FIELDS,
                         ids=[f"{b[0]}={b[1]!r}"[:60] for b in BAD_FIELDS])
def test_a_bad_field_is_named_with_its_json_path(
    tmp_path: Path, qwen3moe_path: Path, where: str, value: object, path: str, why: str
) -> None:
    p = tmp_path / "bad.plan.json"
    p.write_text(json.dumps(_set(_valid(qwen3moe_path), where, value)))
    with pytest.raises(PlanFileError) as ei:
        load_plan(p)
    msg = str(ei.value)
    assert str(p) in msg and path in msg and why in msg, msg


@pytest.mark.parametrize("endpoint", ["127.0.0.1:50052x", "127.0.0.1:50052:7", "127.0.0.1: 50052"])
def test_an_endpoint_llama_server_takes_loads(tmp_path: Path, qwen3moe_path: Path, endpoint: str) -> None:
    """Entries the pinned llama-server reads as port 50052 of 127.0.0.1 (std::stoi after the first ':',
    tests/test_cli_rpc_endpoints.py runs them): a plan with such an RPC device opens again; the file
    refused them (its own HOST:PORT pattern), so a plan saved with one could not be reopened."""
    p = tmp_path / "rpc.plan.json"
    p.write_text(json.dumps(_set(_valid(qwen3moe_path), "devices.gpus.0.endpoint", endpoint)))
    plan, _ = load_plan(p).to_plan(open_model(qwen3moe_path))
    assert plan.devices.gpus[0].endpoint == endpoint


def test_the_valid_file_of_these_cases_loads(tmp_path: Path, qwen3moe_path: Path) -> None:
    """The cases above change one field of this file, which loads and projects."""
    p = tmp_path / "good.plan.json"
    p.write_text(json.dumps(_valid(qwen3moe_path)))
    plan, _ = load_plan(p).to_plan(open_model(qwen3moe_path))
    # llama.cpp's order: RPC servers before CUDA devices
    assert plan.projection().devices and plan.devices.gpus[0].endpoint == "127.0.0.1:50052"


RAW_CORRUPTIONS = [
    (b'{"format": "offload-planner-plan", "version": 1, "model": {"path": "\xff\xfe"}}', "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    (b'{"format": "offload-planner-plan", "version": 1' + b', "x": ' + b"[" * 50 + b"]" * 50 + b"}",
     "nested more than"),
    (b'{"format": "offload-planner-plan", "version": ' + b"9" * 5000 + b"}", "not JSON"),
    (b'{"format": "offload-planner-plan", "version": NaN}', "not JSON"),
    (b'{"format": "offload-planner-plan", "version": 1e999}', "not JSON"),
    (b"", "not JSON"),
    (b"[]", "not an offload-planner plan"),
]


@pytest.mark.parametrize(("raw", "why"), RAW_CORRUPTIONS,
                         ids=["utf8", "deep", "nested", "huge-int", "nan", "inf", "empty", "list"])
def test_raw_corruptions_are_plan_file_errors(tmp_path: Path, raw: bytes, why: str) -> None:
    p = tmp_path / "raw.plan.json"
    p.write_bytes(raw)
    with pytest.raises(PlanFileError, match=why) as ei:
        load_plan(p)
    assert str(p) in str(ei.value)


def test_a_huge_integer_field_is_named(tmp_path: Path, qwen3moe_path: Path) -> None:
    text = json.dumps(_set(_valid(qwen3moe_path), "context.n_ctx", 12345)).replace("12345", "9" * 4000)
    p = tmp_path / "big.plan.json"
    p.write_text(text)
    with pytest.raises(PlanFileError, match=r"\$\.context\.n_ctx: an integer of 4000 digits is out of range"):
        load_plan(p)


def test_a_file_too_big_to_be_a_plan_is_refused_without_reading_it(tmp_path: Path) -> None:
    p = tmp_path / "huge.plan.json"
    with p.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(PlanFileError, match="at most"):
        load_plan(p)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_or_a_folder_as_plan_file_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.plan.json"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(PlanFileError, match="not a regular file \\(a FIFO\\)") as ei:
        load_plan(fifo)
    assert time.monotonic() - t0 < 2 and str(fifo) in str(ei.value)
    with pytest.raises(PlanFileError, match="a folder"):
        load_plan(tmp_path)
    with pytest.raises(PlanFileError, match="a FIFO"):
        require_regular_file(fifo, "the plan's model")


# --- saving -----------------------------------------------------------------------------------------


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes and symlinks")
def test_saving_over_a_file_keeps_its_mode_and_a_symlink(tmp_path: Path, qwen3moe_path: Path) -> None:
    plan = _plan(qwen3moe_path)
    real_dir = tmp_path / "shared"
    real_dir.mkdir()
    real = real_dir / "team.plan.json"
    save_plan(real, PlanFile.of(plan))
    os.chmod(real, 0o640)
    link = tmp_path / "mine.plan.json"
    link.symlink_to(real)
    save_plan(link, PlanFile.of(replace(plan, moves={})))
    assert link.is_symlink() and os.readlink(link) == str(real), "the link stays a link to the same file"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert load_plan(link).moves == {}
    assert sorted(p.name for p in real_dir.iterdir()) == ["team.plan.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.plan.json", "shared"]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes")
def test_a_new_plan_file_gets_the_usual_mode(tmp_path: Path, qwen3moe_path: Path) -> None:
    old = os.umask(0o022)
    try:
        save_plan(tmp_path / "new.plan.json", PlanFile.of(_plan(qwen3moe_path)))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.plan.json").stat().st_mode) == 0o644


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.skipif(sys.platform == "win32", reason="process ids are checked on POSIX")
def test_a_temp_file_left_by_a_killed_save_is_removed(tmp_path: Path, qwen3moe_path: Path) -> None:
    target = tmp_path / "p.plan.json"
    save_plan(target, PlanFile.of(_plan(qwen3moe_path)))
    left = tmp_path / f".p.plan.json.tmp-{_dead_pid()}-0badc0de"
    left.write_text("{half a plan")
    busy = tmp_path / ".p.plan.json.tmp-1-feedf00d"  # pid 1 is alive: a save in progress
    busy.write_text("{")
    other = tmp_path / ".other.plan.json.tmp-1-00"
    other.write_text("{")
    load_plan(target)
    assert not left.exists() and busy.exists() and other.exists()
    left.write_text("{half a plan")
    save_plan(target, PlanFile.of(_plan(qwen3moe_path)))
    assert not left.exists() and busy.exists()


def test_secrets_are_never_written(tmp_path: Path, qwen3moe_path: Path) -> None:
    plan = replace(_plan(qwen3moe_path), extra_args=[
        "--alias", "--api-key", "--api-key", "sk-live-123", "-hft", "hf_abc", "--hf_token", "hf_def",
        "--api-key=sk-eq", "--threads", "8", "--api-key-file", "/etc/keys"])
    target = tmp_path / "s.plan.json"
    notes = save_plan(target, PlanFile.of(plan))
    text = target.read_text()
    for secret in ("sk-live-123", "hf_abc", "hf_def", "sk-eq"):
        assert secret not in text
    assert load_plan(target).extra_args == [
        "--alias", "--api-key", "--threads", "8", "--api-key-file", "/etc/keys"], \
        "an --alias whose value looks like a flag keeps it; key files (paths) are kept"
    assert len(notes) == 4 and all("secret" in n and "s.plan.json" in n for n in notes)
    assert notes[0].startswith("--api-key:") and notes[1].startswith("-hft:")


def test_a_path_with_a_nul_is_a_plan_file_error(tmp_path: Path, qwen3moe_path: Path) -> None:
    with pytest.raises(PlanFileError, match="cannot read"):
        load_plan(str(tmp_path / "a\0b.plan.json"))
    with pytest.raises(PlanFileError, match="cannot write"):
        save_plan(str(tmp_path / "a\0b.plan.json"), PlanFile.of(_plan(qwen3moe_path)))


def test_a_plan_file_naming_metal0_loads_as_mtl0(tmp_path: Path, qwen3moe_path: Path) -> None:
    """Plan files written before the planner named Metal devices as the pinned build does (``MTL0``:
    ggml/src/ggml-metal/ggml-metal-device.m:1301) call it Metal0 in the device list, the -ot rules and
    the moves: it loads as MTL0, so its command names a device that build has."""
    plan = _plan(qwen3moe_path)
    metal = parse_device_decl("MTL0=m3max,64GiB")
    popts = replace(plan.placement_options, overrides=(Override(r"blk\.1\.", "MTL0", "-ot"),))
    plan = replace(plan, devices=DeviceSet(plan.devices.cpu, (metal,)), placement_options=popts,
                   moves={"blk.2.ffn_up_exps.weight": "MTL0"})
    old = json.dumps(plan_json(PlanFile.of(plan))).replace('"MTL0"', '"Metal0"')
    assert '"MTL0"' not in old and old.count('"Metal0"') == 3
    target = tmp_path / "old.plan.json"
    target.write_text(old)
    loaded = load_plan(target)
    assert loaded.devices.names == ["MTL0", "CPU"]
    assert loaded.devices.gpus[0].kind is DeviceKind.METAL
    assert [o.buft for o in loaded.placement_options.overrides] == ["MTL0"]
    assert loaded.moves == {"blk.2.ffn_up_exps.weight": "MTL0"}


def test_slots_past_llama_max_seq_reopen_where_the_build_takes_them(
    tmp_path: Path, qwen3moe_path: Path
) -> None:
    """-np 300: ik_llama.cpp has no LLAMA_MAX_SEQ (its context takes any n_seq_max), so its plan saves and
    opens again; the pinned build refuses more than 256 ("n_seq_max must be <= 256"), and so does its
    plan file.  The file capped every dialect at 256, so an ik plan with -np 300 could not be reopened."""
    plan = with_dialect(_plan(qwen3moe_path), Dialect.IK)
    plan = replace(plan, context=replace(plan.context, n_seq_max=300))
    target = tmp_path / "ik.plan.json"
    save_plan(target, PlanFile.of(plan, {}))
    again, _ = load_plan(target).to_plan(plan.model)
    assert again.context.n_seq_max == 300 and again.dialect == Dialect.IK
    pinned = tmp_path / "pinned.plan.json"
    pinned.write_text(json.dumps(_set(_valid(qwen3moe_path), "context.n_seq_max", 300)))
    with pytest.raises(PlanFileError, match=r"\$\.context\.n_seq_max.*out of range"):
        load_plan(pinned)
