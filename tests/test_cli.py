"""The headless entry point as a user runs it: `inspect` and `plan` on real GGUF files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import offload_planner
from offload_planner.cli import demo_model_path

# the package under test first (a checkout's gui/ or the install), then the caller's own path
PACKAGE_ROOT = os.pathsep.join(
    p for p in (str(Path(offload_planner.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")) if p
)  # the code under test


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "offload_planner", *args], capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()),
                                            "PYTHONPATH": PACKAGE_ROOT})


def test_inspect_json_schema_on_the_demo_model() -> None:
    r = run("inspect", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for key in ("arch", "n_layer", "n_vocab", "n_expert", "n_expert_used", "header_only", "total_bytes"):
        assert key in d
    assert (d["arch"], d["n_layer"], d["n_expert"], d["n_expert_used"], d["n_vocab"]) == (
        "deepseek2", 61, 256, 8, 129280)
    assert d["header_only"] is True and len(d["tensors"]) == 1086
    t = d["tensors"][0]
    assert set(t) == {"name", "layer", "role", "type", "shape", "bytes", "shard"}
    assert sum(x["bytes"] for x in d["tensors"]) == d["total_bytes"]


def test_inspect_text_has_summary_and_layer_table() -> None:
    r = run("inspect", str(demo_model_path()))
    assert r.returncode == 0, r.stderr
    assert "arch deepseek2, 61 layers" in r.stdout and "experts 256 (8 used, 1 shared)" in r.stdout
    assert "  layer " in r.stdout and "\n      60 " in r.stdout


def test_inspect_bad_file_is_one_clear_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    r = run("inspect", str(bad))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "bad.gguf" in r.stderr and "Traceback" not in r.stderr


def test_plan_json_on_declared_gpus() -> None:
    r = run("plan", str(demo_model_path()), "--json", "--no-detect", "--device", "CUDA0=24GiB",
            "--device", "CUDA1=24GiB", "--device", "CPU=512GiB", "--",
            "-ngl", "999", "-ts", "1,1", "-ot", "exps=CPU", "-c", "32768")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert [x["name"] for x in d["devices"]] == ["CUDA0", "CUDA1", "CPU"]
    for x in d["devices"]:
        assert x["total_bytes"] == x["weights_bytes"] + x["kv_bytes"] + x["compute_bytes"] + x["output_bytes"]
    assert d["devices"][0]["capacity_bytes"] == 24 * 1024**3
    assert d["tensors"]["blk.10.ffn_up_exps.weight"] == "CPU"
    assert d["tensors"]["blk.10.attn_q_a.weight"] in ("CUDA0", "CUDA1")
    assert d["errors"] == [] and "-fit" in d["command"]


def test_plan_reports_llama_cpp_refusals_with_exit_2() -> None:
    r = run("plan", str(demo_model_path()), "--json", "--no-detect", "--device", "CUDA0=24GiB", "--",
            "-ot", "exps=CUDA7", "-fa", "off", "-ctv", "q8_0")
    assert r.returncode == 2 and r.stdout == ""
    assert "unknown buffer type" in r.stderr and "flash" in r.stderr


@pytest.mark.parametrize("flag", ["--no-mmap", "--bogus-flag"])
def test_plan_refuses_flags_the_pinned_build_refuses(flag: str) -> None:
    r = run("plan", str(demo_model_path()), "--json", "--no-detect", "--", flag)
    assert r.returncode == 2 and r.stdout == ""
    assert f"invalid argument: {flag}" in r.stderr


def test_plan_says_what_fit_changes(small_models: dict[str, Path]) -> None:
    """The pinned build fits by default: on a GPU with 15 MiB above llama.cpp's 1 GiB target, the
    plan reports the command the server will really run (and nothing with -fit off); that command
    keeps the GPU under the target (the fit itself is compared with llama-fit-params in
    tests/integration/test_fit_vs_llama.py)."""
    model = str(small_models["qwen3moe"])
    base = ("plan", model, "--json", "--no-detect", "--device", "CUDA0=1039MiB", "--")
    r = run(*base, "-c", "4096")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    fit = d["fit"]
    assert fit["status"] == "success" and fit["changed"] and "-ngl" in fit["args"]
    assert any(n.startswith("--fit is on") for n in d["notes"])
    fitted = fit["command"]
    assert fitted[fitted.index("-fit") + 1] == "off"
    again = json.loads(run(*base, *fitted[2:]).stdout)
    assert again["fit"] is None, "-fit off: nothing to report"
    cuda0 = next(x for x in again["devices"] if x["name"] == "CUDA0")
    assert cuda0["total_bytes"] <= 15 * 1024**2
    as_written = next(x for x in d["devices"] if x["name"] == "CUDA0")
    assert as_written["total_bytes"] > 15 * 1024**2, "the table still shows the command as written"


def test_plan_does_not_guess_the_fit_on_gpus_of_unknown_size(small_models: dict[str, Path]) -> None:
    r = run("plan", str(small_models["qwen3moe"]), "--json", "--no-detect", "--",
            "--rpc", "127.0.0.1:50052", "-c", "4096")
    d = json.loads(r.stdout)
    assert d["fit"] is None
    assert any("declare RPC0 with --device" in n for n in d["notes"])
