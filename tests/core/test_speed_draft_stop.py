"""A draft that stops early: ``--spec-draft-p-min P`` (pinned mainline, default 0) and ik_llama.cpp's
defaults (``n_max`` 16, ``p_min`` 0.75, common/common.h 223 and 230) make the server stop drafting when
the draft's top probability falls below P (common/speculative.cpp ``cur_p->data[0].p < params.p_min``).
The estimate does not model how often that happens: it counts every draft at its maximum length and
says so in its assumptions (an upper bound on draft cost) whenever P > 0 (leftovers4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import offload_planner
from offload_planner.core.cmdline import Dialect, parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.speed.efficiency import DEFAULT
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import DeviceSpeed, Figure, Hardware, Source
from offload_planner.core.speed.result import Assumption, SpeedEstimate
from offload_planner.core.speed.speculation import with_speculation

GiB = 1024**3
PACKAGE_ROOT = str(Path(offload_planner.__file__).resolve().parents[1])
IK = Dialect("ik_llama.cpp")


def _hw() -> Hardware:
    d = Figure(100.0, "GB/s", Source.DECLARED, "test")
    compute = Figure(1e6, "TFLOPS", Source.DECLARED, "test")
    return Hardware({"CPU": DeviceSpeed("CPU", DeviceKind.CPU, d, compute, d)})


def _plan(models: dict[str, Path], argv: list[str], dialect: Dialect = Dialect.LLAMA_CPP) -> Plan:
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), ())
    parsed = parse_server_args(["-c", "1024", "-md", str(models["llama-draft"]), *argv], dialect=dialect)
    assert not parsed.errors, parsed.errors
    return plan_from_args(open_model(models["llama"]), devices, parsed, dialect=dialect)


def _estimate(plan: Plan) -> SpeedEstimate:
    return with_speculation(estimate(plan, _hw(), eff=DEFAULT), plan, _hw(), DEFAULT)


def _length(est: SpeedEstimate) -> list[Assumption]:
    return [a for a in est.assumptions if a.what.endswith(": draft length")]


def test_a_declared_p_min_is_said_with_the_draft_counted_at_its_maximum(
        small_models: dict[str, Path]) -> None:
    est = _estimate(_plan(small_models, ["--spec-type", "draft-simple", "--spec-draft-n-max", "5",
                                         "--spec-draft-p-min", "0.5"]))
    assert est.spec is not None and est.spec.n_draft == 5
    (a,) = _length(est)
    assert a.what == "draft model llama-draft.gguf: draft length"
    assert (a.figure.value, a.figure.source) == (5, Source.DECLARED)
    assert a.figure.note.startswith("--spec-draft-p-min 0.5: the server stops a draft early when the "
                                    "draft's probability falls below 0.5 (not modelled)")
    assert "the draft length counted as the maximum; the estimate is then an upper bound on draft cost" \
        in a.figure.note


@pytest.mark.parametrize("extra", [[], ["--spec-draft-p-min", "0"]])
def test_p_min_0_never_stops_a_draft_and_adds_nothing(small_models: dict[str, Path],
                                                       extra: list[str]) -> None:
    est = _estimate(_plan(small_models, ["--spec-type", "draft-simple", *extra]))
    assert est.spec is not None and est.spec.n_draft == 3 and _length(est) == []


def test_the_p_min_does_not_change_the_figures(small_models: dict[str, Path]) -> None:
    """Not modelled: the step is the same with and without it, only the assumption differs."""
    plain = _estimate(_plan(small_models, ["--spec-type", "draft-simple"]))
    stopped = _estimate(_plan(small_models, ["--spec-type", "draft-simple", "--spec-draft-p-min", "0.9"]))
    assert stopped.tg_tps == plain.tg_tps and stopped.spec == plain.spec


def test_ik_llama_cpp_defaults_are_said(small_models: dict[str, Path]) -> None:
    est = _estimate(_plan(small_models, ["--spec-type", "draft"], IK))
    assert est.spec is not None and est.spec.n_draft == 16
    (a,) = _length(est)
    assert (a.figure.value, a.figure.source) == (16, Source.DEFAULT)
    assert a.figure.note.startswith("ik_llama.cpp's defaults n_max 16 and p_min 0.75 (common/common.h): "
                                    "the server stops a draft early when the draft's probability falls "
                                    "below 0.75")
    assert a.figure.note.endswith("the estimate is then an upper bound on draft cost")


def test_ik_stage_settings_are_read(small_models: dict[str, Path]) -> None:
    est = _estimate(_plan(small_models, ["--spec-type", "draft:n_max=4,p_min=0.3"], IK))
    assert est.spec is not None and est.spec.n_draft == 4
    (a,) = _length(est)
    assert a.figure.source is Source.DECLARED
    assert a.figure.note.startswith("--spec-type draft:p_min=0.3: the server stops a draft early")
    n_only = _estimate(_plan(small_models, ["--spec-type", "draft:n_max=4"], IK))
    assert _length(n_only)[0].figure.note.startswith("ik_llama.cpp's default p_min 0.75 (common/common.h)")
    never = _estimate(_plan(small_models, ["--spec-type", "draft:p_min=0"], IK))
    assert never.spec is not None and never.spec.n_draft == 16 and _length(never) == []


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT}
    return subprocess.run([sys.executable, "-m", "offload_planner", *args], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, env=env)


def test_plan_prints_and_carries_it(small_models: dict[str, Path]) -> None:
    common = ["plan", str(small_models["llama"]), "--no-detect", "--device", "CPU=64GiB,bw=100GB/s"]
    spec = ["--", "-c", "1024", "-md", str(small_models["llama-draft"]), "--spec-type", "draft-simple",
            "--spec-draft-p-min", "0.6"]
    r = _cli(*common, *spec)
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(x for x in r.stdout.splitlines() if ": draft length:" in x)
    assert line.strip().startswith("draft model llama-draft.gguf: draft length: 3 tokens a step (declared: "
                                   "--spec-draft-p-min 0.6: the server stops a draft early")
    r = _cli(*common, "--json", *spec)
    assert r.returncode == 0, r.stderr[-2000:]
    got = [a for a in json.loads(r.stdout)["speed"]["assumptions"] if a["what"].endswith("draft length")]
    assert [(a["value"], a["source"]) for a in got] == [(3, "declared")]


def test_ik_mtp_stage_settings_are_read(small_models: dict[str, Path]) -> None:
    """ik's ``mtp`` stage takes its own ``n_max=``/``p_min=`` (common_speculative_get_runtime_params);
    they were read from a ``draft`` stage the command did not have (16 drafted, p_min 0.75)."""
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), ())

    def est(stage: str) -> SpeedEstimate:
        parsed = parse_server_args(["-c", "1024", "--spec-type", stage], dialect=IK)
        assert not parsed.errors, parsed.errors
        return _estimate(plan_from_args(open_model(small_models["glm4moe"]), devices, parsed, dialect=IK))

    short = est("mtp:n_max=2")
    assert short.spec is not None and short.spec.kind.startswith("MTP") and short.spec.n_draft == 2
    assert _length(short)[0].figure.note.startswith("ik_llama.cpp's default p_min 0.75 (common/common.h)")
    never = est("mtp:p_min=0")
    assert never.spec is not None and never.spec.n_draft == 16 and _length(never) == []
    default = est("mtp")
    assert _length(default)[0].figure.note.startswith("ik_llama.cpp's defaults n_max 16 and p_min 0.75")


@pytest.mark.parametrize("dialect", [Dialect.LLAMA_CPP_2025, Dialect("llama.cpp-2025-early")])
def test_2025_mainline_builds_draft_16_with_p_min_075(small_models: dict[str, Path],
                                                      dialect: Dialect) -> None:
    """2025 builds draft with ``-md`` alone, at their ``common_params_speculative`` defaults: n_max 16 and
    p_min 0.75 (common/common.h of those builds); the estimate drafted 3, the pinned build's default."""
    est = _estimate(_plan(small_models, [], dialect))
    assert est.spec is not None and est.spec.n_draft == 16
    (a,) = _length(est)
    assert (a.figure.value, a.figure.source) == (16, Source.DEFAULT)
    assert a.figure.note.startswith("the 2025 builds' defaults n_max 16 and p_min 0.75 (common/common.h): "
                                    "the server stops a draft early")
    given = _estimate(_plan(small_models, ["--draft-max", "4", "--draft-p-min", "0"], dialect))
    assert given.spec is not None and given.spec.n_draft == 4 and _length(given) == []
