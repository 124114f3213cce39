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
    """The CLI with a bare environment, but this session's private config folder (conftest): `plan`
    caches its RAM probe there, never in the user's."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()),
           "OFFLOAD_PLANNER_CONFIG_DIR": os.environ["OFFLOAD_PLANNER_CONFIG_DIR"],
           "PYTHONPATH": PACKAGE_ROOT}
    return subprocess.run([sys.executable, "-m", "offload_planner", *args], capture_output=True, text=True,
                          timeout=300, env=env)


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


# --- speed estimate and fit ---------------------------------------------------------------------------

QWEN = str(Path(__file__).resolve().parents[1] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf")


def test_plan_json_carries_the_speed_estimate() -> None:
    r = run("plan", QWEN, "--json", "--no-detect", "--device", "CUDA0=rtx3090", "--device",
            "CPU=64GiB,ram=2xDDR5-5600", "--prompt", "2048", "--", "-ngl", "999", "--n-cpu-moe", "24",
            "-c", "16384", "-t", "8")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)["speed"]
    assert s["tg_tps"] > s["tg_tps_at_ctx"] > 0 and s["pp_tps"] > 0 and s["prompt"] == 2048
    assert [d["name"] for d in s["devices"]] == ["CUDA0", "CPU"]
    assert all({"name", "bytes_per_token", "tg_ms_per_token"} <= set(d) for d in s["devices"])
    assert s["bottleneck"] and s["assumptions"]
    cpu_bw = next(a for a in s["assumptions"] if a["what"] == "CPU memory bandwidth")
    assert (cpu_bw["value"], cpu_bw["source"]) == (89.6, "declared")
    threads = next(a for a in s["assumptions"] if a["what"] == "CPU compute")
    assert "8 threads" in threads["note"]


def test_plan_text_prints_the_estimate_under_the_table() -> None:
    r = run("plan", QWEN, "--no-detect", "--device", "CUDA0=24GiB,bw=936GB/s,pcie=4x16,tflops=71",
            "--device", "CPU=64GiB,bw=80GB/s", "--", "-ngl", "999", "-ot", "exps=CPU", "-c", "8192")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.index("CPU  ") < out.index("speed estimate") < out.index("context:")
    assert "CUDA0 memory bandwidth: 936 GB/s (declared" in out
    assert "CUDA0 host link: 31.5 GB/s (declared: PCIe 4.0 x16" in out


@pytest.mark.parametrize(("args", "named"), [
    (["--device", "CUDA0=24GiB,pcie=4x"], "--device 'CUDA0=24GiB,pcie=4x'"),
    (["--device", "CPU=64GiB,ram=lots"], "--device 'CPU=64GiB,ram=lots'"),
    (["--prompt", "-5"], "--prompt"),
])
def test_plan_refuses_bad_speed_values_naming_the_flag(args: list[str], named: str) -> None:
    r = run("plan", QWEN, "--no-detect", *args, "--", "-c", "4096")
    assert r.returncode == 2
    assert named in r.stderr and "Traceback" not in r.stderr


def test_fit_prints_the_fastest_plan_beside_the_baselines() -> None:
    r = run("fit", QWEN, "--no-detect", "--device", "CUDA0=12GiB,bw=360GB/s", "--device",
            "CPU=64GiB,ram=2xDDR5-5600", "--goal", "tg", "--json", "--", "-c", "16384")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    labels = [c["label"] for c in d["candidates"]]
    assert "--cpu-moe" in labels and "llama.cpp --fit" in labels
    assert any(x.startswith("--n-cpu-moe") for x in labels)
    best = next(c for c in d["candidates"] if c["label"] == d["best"])
    assert best["fits"]
    assert all(best["tg_tps"] >= c["tg_tps"] for c in d["candidates"] if c["fits"])
    cuda0 = next(x for x in d["plan"]["devices"] if x["name"] == "CUDA0")
    assert cuda0["total_bytes"] <= 11 * 1024**3  # 12 GiB minus the 1 GiB margin (no mmap span on a GPU)
    assert d["plan"]["command"][:1] == ["-m"] and "16384" in d["plan"]["command"]


def test_fit_quantizes_the_kv_cache_only_when_allowed() -> None:
    base = ("fit", QWEN, "--no-detect", "--device", "CUDA0=12GiB,bw=936GB/s", "--device",
            "CPU=64GiB,ram=2xDDR5-5600", "--goal", "tg", "--json")
    kept = json.loads(run(*base, "--", "-c", "40960", "-np", "1").stdout)
    assert "-ctk" not in kept["plan"]["command"] and "-ctv" not in kept["plan"]["command"]
    r = run(*base, "--allow-kv-quant", "--", "-c", "40960", "-np", "1")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    cmd = d["plan"]["command"]
    assert cmd[cmd.index("-ctk") + 1] == "q8_0" and cmd[cmd.index("-ctv") + 1] == "q8_0"
    assert d["speed"]["tg_tps"] > kept["speed"]["tg_tps"]


def test_fit_needs_gpu_sizes() -> None:
    r = run("fit", QWEN, "--no-detect", "--", "-c", "4096")
    assert r.returncode == 2 and "--device" in r.stderr
