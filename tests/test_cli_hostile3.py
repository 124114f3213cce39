"""Hostile input against this session's new surface: fit's user -ts (the -nkvo search and the packed
layouts keep it), the speed text of absurd declared figures, the empty --device field: one clear line
naming the flag, an exit code, never a traceback or a hang."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from tests.support.cli import run_cli
from tests.support.refusals import refused

from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.plan_file import PlanFile, plan_json
from offload_planner.core.synth import SMALL_MODELS, write_model

QWEN = str(Path(__file__).resolve().parents[1] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
DEEPSEEK = str(Path(__file__).resolve().parents[1] / "resources" / "DeepSeek-V3-Q4_K_M.header.gguf")
TWO_GPUS = ["--no-detect", "--device", "CUDA0=24GiB", "--device", "CUDA1=12GiB"]


run = run_cli


@pytest.mark.parametrize(("ts", "named"), [("nan,1", "a NaN or infinite proportion"),
                                           ("inf,1", "a NaN or infinite proportion"),
                                           ("-1,1", "a negative proportion")])
@pytest.mark.parametrize("nkvo", [[], ["--allow-nkvo"]])
def test_fit_refuses_the_split_plan_refuses(ts: str, named: str, nkvo: list[str]) -> None:
    """fit kept a -ts that llama.cpp cannot load with: exit 0 and a plan of the fit's own split (its
    baselines keep the user's), and with --allow-nkvo -ts nan,1 a ValueError traceback (NaN is not
    equal to itself, so the -nkvo plans found no compute buffers of their split)."""
    r = run("fit", QWEN, *TWO_GPUS, *nkvo, "--", "-ts", ts)
    refused(r, 2, f"-ts {ts}", named)
    assert r.stdout == ""


ZEROS_318 = "0." + "0" * 318 + "1"  # a positive float: 1e-319, subnormal


@pytest.mark.parametrize(("decl", "named"), [
    ("CUDA1=24GiB,tflops=4e-324", "not a TFLOPS figure from 1e-12"),
    (f"CUDA1=24GiB,bw={ZEROS_318}GB/s", "is too small (at least 1e-09 GB/s"),
    ("CPU=64GiB,ghz=1e-300", "not a clock from 1e-06"),
])
def test_figures_too_small_for_the_arithmetic_are_refused(decl: str, named: str) -> None:
    """A subnormal figure passed the 'above 0' checks: tflops=4e-324 times the efficiency is 0.0 and fit
    died dividing by it (ZeroDivisionError traceback; plan said 'speed estimate unavailable:
    ZeroDivisionError'), a 318-zero bw= made a token's time infinite."""
    r = run("fit", QWEN, "--no-detect", "--device", "CUDA0=8GiB", "--device", decl)
    refused(r, 2, f"--device '{decl}'", named)


def test_the_smallest_figures_give_finite_speeds() -> None:
    """At the floors (1 byte/s, 1 FLOP/s, 1 kHz) every speed stays a positive finite number: the text
    says '< 0.000001 t/s', the JSON has no NaN or Infinity token."""
    devs = ["--device", "CUDA0=12GiB,bw=0.000000001GB/s,tflops=1e-12",
            "--device", "CUDA1=12GiB,bw=0.000000001GB/s,tflops=1e-12,pcie=1x1",
            "--device", "CPU=64GiB,ram=1xDDR4-1,ghz=0.000001,threads=1"]
    r = run("fit", QWEN, "--no-detect", *devs, "--depth", "100000", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"{c} in fit --json"))
    for row in out["candidates"]:
        assert 0 < row["tg_tps"] < 1e-6 and 0 < row["pp_tps"] < 1e-6, row


@pytest.mark.parametrize(("where", "bw", "named"), [
    (("gpus", 0), 5e-324, "5e-324 GB/s is below 1e-09 GB/s"),
    (("cpu",), 5e-324, "5e-324 GB/s is below 1e-09 GB/s"),
    (("gpus", 1), 1e9, "out of range (0..1e+06)"),
])
def test_a_plan_file_bandwidth_outside_what_bw_takes_is_refused(tmp_path: Path, where: tuple[str | int, ...],
                                                                bw: float, named: str) -> None:
    """A hand-edited bandwidth_gbs of 5e-324 (a subnormal, above the old 0 floor) made every speed of
    the plan 0.0 and its estimate's JSON carry NaN and Infinity; 1e9 was above what bw= takes."""
    model = write_model(SMALL_MODELS["qwen3moe"], tmp_path / "qwen3moe.gguf")[0]
    gpus = (Device("CUDA0", DeviceKind.CUDA, 8 << 30), Device("CUDA1", DeviceKind.CUDA, 8 << 30))
    plan = plan_from_args(open_model(model), DeviceSet(Device("CPU", DeviceKind.CPU, 64 << 30), gpus),
                          argparse.Namespace(ctx_size=2048))
    data = plan_json(PlanFile.of(plan))
    entry = data["devices"]
    for key in where:
        entry = entry[key]
    entry["bandwidth_gbs"] = bw
    path = tmp_path / "edited.plan.json"
    path.write_text(json.dumps(data))
    field = "$.devices." + ("cpu" if where == ("cpu",) else f"gpus[{where[1]}]") + ".bandwidth_gbs"
    line = refused(run("launch", str(path), "--no-detect"), 2, str(path), field, named)
    assert line.startswith("offload-planner: ")


def test_fit_with_a_gpu_whose_margin_leaves_less_than_its_buffers() -> None:
    """A 1 GiB card (1 GiB margin by default: a budget below 0) beside a large one, the CPU's RAM slow:
    the packed layout's empty block on the small card was asked for -1 whole layers, no fill was
    chosen, and fit died with 'ValueError: zip() argument 2 is shorter than argument 1'."""
    r = run("fit", DEEPSEEK, "--no-detect", "--device", "CUDA0=200GiB", "--device", "CUDA1=1GiB",
            "--device", "CPU=1TiB,ram=1xDDR4-1", "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["best"] and out["plan"]["command"][0] == "-m", out["best"]


@pytest.mark.parametrize("command", ["plan", "fit"])
def test_a_100_kb_device_value_is_refused_in_one_short_line(command: str) -> None:
    """A 100 KB --device value was quoted whole in its error line, twice for an unknown field (200 KB
    on stderr)."""
    r = run(command, QWEN, "--no-detect", "--device", "CUDA0=24GiB," + "x" * 100_000)
    line = refused(r, 2, "--device 'CUDA0=24GiB,x", "(100012 characters)", "at most 1024 characters")
    assert len(line) < 300, len(line)


def _tg(stdout: str) -> str:
    line = next(x for x in stdout.splitlines() if x.startswith("speed estimate"))
    return line.split("tg ")[1].split(" t/s")[0]


def test_a_draft_model_of_another_vocabulary_is_named_and_not_counted(tmp_path: Path) -> None:
    """llama.cpp's common_speculative_are_compatible refuses a draft whose vocabulary is 512 tokens
    larger: llama-server logs 'failed to initialize speculative decoding context' and generates
    without it. plan and fit counted its speed-up (tg 22966 t/s against 5425 without a draft) and
    said nothing; now a warning names the -md file and tg is the plain one; a draft of the same
    vocabulary still speeds tg up."""
    target = write_model(SMALL_MODELS["llama"], tmp_path / "llama.gguf")[0]
    other = write_model(SMALL_MODELS["qwen3moe"], tmp_path / "qwen3moe.gguf")[0]
    same = write_model(SMALL_MODELS["llama-draft"], tmp_path / "llama-draft.gguf")[0]
    base = ["--no-detect", "--device", "CUDA0=24GiB"]
    plain = run("plan", str(target), *base)
    mismatched = run("plan", str(target), *base, "--", "-md", str(other), "--spec-type", "draft-simple")
    matched = run("plan", str(target), *base, "--", "-md", str(same), "--spec-type", "draft-simple")
    assert plain.returncode == mismatched.returncode == matched.returncode == 0, mismatched.stderr[-2000:]
    assert _tg(mismatched.stdout) == _tg(plain.stdout) != _tg(matched.stdout)
    warning = f"-md {other}: llama-server does not use this draft model"
    assert warning in mismatched.stdout and "differ by 512 tokens" in mismatched.stdout
    assert warning not in matched.stdout
    fit = run("fit", str(target), *base, "--json", "--", "-md", str(other), "--spec-type", "draft-simple")
    assert fit.returncode == 0, fit.stderr[-2000:]
    out = json.loads(fit.stdout)
    assert any(n.startswith(warning) for n in out["notes"]), out["notes"]
