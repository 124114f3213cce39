"""A plan with a draft model or the MTP context: the projection counts the extra context on its
devices (what the memory bars and ``--fit`` read), the exported command keeps its flags, a saved plan
keeps it, ``plan`` prints it.  The per-buffer sizes themselves are checked against llama-server in
``tests/integration/test_speculative_vs_llama.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.device_figures import DeviceFigures
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.extra_context import DRAFT, MTP
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_command, plan_from_args
from offload_planner.core.plan_file import PlanFile, load_plan, save_plan

GiB = 1024**3


def _devices() -> DeviceSet:
    return DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB),
                     (Device("CUDA0", DeviceKind.CUDA, 8 * GiB, 8 * GiB),))


def _plan(model: Path, argv: list[str]):  # type: ignore[no-untyped-def]
    return plan_from_args(open_model(model), _devices(), parse_server_args(argv))


def test_mtp_context_counts_on_its_devices(small_models: dict[str, Path]) -> None:
    plain = _plan(small_models["glm4moe"], ["-c", "2048"]).projection()
    proj = _plan(small_models["glm4moe"], ["-c", "2048", "--spec-type", "draft-mtp"]).projection()
    assert [e.key for e in plain.extras] == [] and [e.key for e in proj.extras] == [MTP]
    mtp = proj.extras[0]
    assert mtp.shares_model and mtp.total("model") == 0  # the NextN weights are the main model's
    assert mtp.total("kv") > 0 and mtp.total("compute") > 0 and mtp.total("output") > 0
    gpu = proj.device("CUDA0")
    assert gpu.total() == sum(b.bytes for b in gpu.buffers if not b.owner) + mtp.by_device()["CUDA0"]
    # the bars (DeviceFigures) count it; the NextN weights are loaded with MTP only
    bar, plain_bar = DeviceFigures.of(gpu).used, DeviceFigures.of(plain.device("CUDA0")).used
    assert bar > plain_bar + mtp.by_device()["CUDA0"]
    assert gpu.weights > plain.device("CUDA0").weights


def test_draft_model_counts_and_is_exported(small_models: dict[str, Path]) -> None:
    draft = str(small_models["llama-draft"])
    argv = ["-c", "2048", "-md", draft, "-ngld", "1", "-ctkd", "q8_0", "--spec-type", "draft-simple"]
    plan = _plan(small_models["llama"], argv)
    proj = plan.projection()
    assert [e.key for e in proj.extras] == [DRAFT]
    d = proj.extras[0]
    assert d.by_device("model").keys() == {"CUDA0", "CPU"}  # -ngld 1: one layer (the output) offloaded
    cmd = plan_command(plan)
    for flag in ("-md", draft, "-ngld", "1", "-ctkd", "q8_0", "--spec-type", "draft-simple"):
        assert flag in cmd


def test_saved_plan_keeps_the_draft(small_models: dict[str, Path], tmp_path: Path) -> None:
    draft = tmp_path / "draft.gguf"
    draft.write_bytes(small_models["llama-draft"].read_bytes())
    plan = _plan(small_models["llama"], ["-c", "2048", "-md", str(draft)])
    path = tmp_path / "p.plan.json"
    save_plan(path, PlanFile.of(plan))
    again, notes = load_plan(path).to_plan(plan.model)
    assert notes == [] and [e.key for e in again.projection().extras] == [DRAFT]
    assert again.projection().device("CUDA0").total() == plan.projection().device("CUDA0").total()
    draft.unlink()
    gone, notes = load_plan(path).to_plan(plan.model)
    assert gone.projection().extras == []
    assert len(notes) == 1 and notes[0].startswith("draft model not projected: ") and str(draft) in notes[0]


def test_missing_draft_file_is_one_clear_error(small_models: dict[str, Path], tmp_path: Path) -> None:
    from offload_planner.core.errors import PlannerError

    with pytest.raises(PlannerError, match=r"nope\.gguf"):
        _plan(small_models["llama"], ["-md", str(tmp_path / "nope.gguf")])


@pytest.mark.parametrize(("model", "args", "label"), [
    ("glm4moe", ["--spec-type", "draft-mtp"], "+ MTP context (1 NextN layer): CUDA0 "),
    ("llama", ["-md", "DRAFT"], "+ draft model llama-draft.gguf: CUDA0 "),
])
def test_plan_prints_the_extra_context(model: str, args: list[str], label: str,
                                       small_models: dict[str, Path]) -> None:
    args = [str(small_models["llama-draft"]) if a == "DRAFT" else a for a in args]
    base = [sys.executable, "-m", "offload_planner", "plan", "--no-detect", "--device", "CUDA0=8G"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    text = subprocess.run([*base, str(small_models[model]), "--", "-c", "2048", *args], capture_output=True,
                          text=True, timeout=300, env=env, check=True).stdout
    assert any(line.startswith(label) for line in text.splitlines()), text
    out = json.loads(subprocess.run([*base, "--json", str(small_models[model]), "--", "-c", "2048", *args],
                                    capture_output=True, text=True, timeout=300, env=env, check=True).stdout)
    (extra,) = out["extras"]
    owned = [b for d in out["devices"] for b in d["buffers"] if b.get("owner") == extra["key"]]
    assert sum(b["bytes"] for b in owned) == sum(sum(k.values()) for k in extra["devices"].values())


def test_saved_ik_plan_keeps_a_draft_params_model(small_models: dict[str, Path], tmp_path: Path) -> None:
    """ik's ``-draft "-m FILE"`` (no -md) is the draft the plan projects; a saved plan reopens it with the
    main command line ik copies for the draft (its -c), not from the kept flags alone (the draft then
    took its trained context: 24.6 MiB on CUDA0 and CPU together where the plan had 19.1)."""
    from offload_planner.core.dialects import Dialect

    ik = Dialect("ik_llama.cpp")
    argv = ["-c", "2048", "--spec-type", "draft", "-draft", f"-m {small_models['llama-draft']} -ngl 0"]
    parsed = parse_server_args(argv, dialect=ik)
    plan = plan_from_args(open_model(small_models["llama"]), _devices(), parsed, ik)
    assert [e.key for e in plan.projection().extras] == [DRAFT]
    path = tmp_path / "p.plan.json"
    save_plan(path, PlanFile.of(plan))
    again, notes = load_plan(path).to_plan(plan.model)
    assert notes == [] and plan_command(again) == plan_command(plan)
    for dm in plan.projection().devices:
        assert again.projection().device(dm.device.name).total() == dm.total(), dm.device.name
