"""`offload-planner plan` through its entry point, on what a newcomer types: devices in any order,
sizes without units, typos, flags before `--`, values llama.cpp changes without a word, the
environment, plan files, and a plan over capacity. Errors come first and alone (nothing on stdout,
one message on stderr, exit 2); every silent change is a note; over capacity is exit 3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import offload_planner

# the package under test first (a checkout's gui/ or the install), then the caller's own path
PACKAGE_ROOT = os.pathsep.join(
    p for p in (str(Path(offload_planner.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")) if p
)
ROOT = Path(__file__).resolve().parents[1]
QWEN = str(ROOT / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf")  # 48 layers, 128 experts
GPUS = ("--no-detect", "--device", "CUDA0=24GiB", "--device", "CPU=512GiB")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI as installed from this checkout, in a clean environment plus ``env``."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home()),
            "PYTHONPATH": PACKAGE_ROOT}
    return subprocess.run([sys.executable, "-m", "offload_planner", *args], capture_output=True,
                          text=True, timeout=300, env={**base, **(env or {})})


def plan_json(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    r = run("plan", QWEN, "--json", *args, env=env)
    assert r.returncode in (0, 3), r.stderr
    return dict(json.loads(r.stdout))


def refused(r: subprocess.CompletedProcess[str]) -> str:
    """The one error message of a refused run (exit 2, nothing on stdout, no traceback)."""
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr)
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    return r.stderr


# --- 3. devices in llama.cpp's order ---------------------------------------------------------------


def test_declared_devices_take_llama_cpp_order_and_ts_follows_it() -> None:
    """`--device CUDA1=... --device CUDA0=... -- -ts 3,1`: llama.cpp lists CUDA0 first, so CUDA0 gets
    three quarters of the 49 units (48 layers and the output): unit u goes to CUDA0 while
    u / 49 < 0.75, i.e. layers 0-36."""
    d = plan_json("--no-detect", "--device", "CUDA1=24GiB", "--device", "CUDA0=12GiB",
                  "--device", "CPU=512GiB", "--", "-ts", "3,1", "-c", "4096", "-ot", "exps=CPU")
    assert [x["name"] for x in d["devices"]] == ["CUDA0", "CUDA1", "CPU"]
    cuda0, cuda1 = d["devices"][0], d["devices"][1]
    assert cuda0["capacity_bytes"] == 12 * 1024**3 and cuda1["capacity_bytes"] == 24 * 1024**3
    blk = {t: dev for t, dev in d["tensors"].items() if t.startswith("blk.")}
    layers = {g: {int(t.split(".")[1]) for t, dev in blk.items() if dev == g} for g in ("CUDA0", "CUDA1")}
    assert layers["CUDA0"] == set(range(37)) and layers["CUDA1"] == set(range(37, 48))


# --- 4. units --------------------------------------------------------------------------------------


@pytest.mark.parametrize("decl", ["CUDA0=24", "CUDA0=24GiB,free=20", "CUDA0=２４GiB"])
def test_a_size_without_a_unit_is_refused_with_the_accepted_forms(decl: str) -> None:
    err = refused(run("plan", QWEN, "--no-detect", "--device", decl, "--", "-c", "4096"))
    assert f"--device {decl!r}" in err and "24GiB" in err and "4096B" in err
    assert err.count("\n") == 1


def test_the_window_refuses_a_size_without_a_unit_before_anything_else() -> None:
    err = refused(run("gui", "--device", "CUDA0=24"))  # no display in this environment either
    assert "--device 'CUDA0=24'" in err and "no unit" in err


# --- 6. errors first and alone, every silent change a note ----------------------------------------


def test_a_typo_is_one_error_with_the_flag_it_meant() -> None:
    err = refused(run("plan", QWEN, *GPUS, "--", "-ngl", "99", "--n-gpu-layer", "5"))
    assert err.count("\n") == 1
    assert "error: error:" not in err
    assert "invalid argument: --n-gpu-layer" in err and "did you mean --n-gpu-layers?" in err


def test_server_flags_before_the_double_dash_say_where_they_go() -> None:
    err = refused(run("plan", QWEN, "--no-detect", "-ngl", "99"))
    assert "unrecognized arguments: -ngl 99" in err and "after `--`" in err


def test_a_number_that_is_not_one_names_the_flag() -> None:
    err = refused(run("plan", QWEN, *GPUS, "--", "-ngl", "abc"))
    assert "-ngl abc: expected an integer" in err


def test_c_32k_is_read_as_32_like_llama_server_and_said() -> None:
    r = run("plan", QWEN, *GPUS, "--", "-c", "32k")
    assert r.returncode == 0, r.stderr
    assert "note: -c 32k: llama-server reads 32 and ignores 'k'" in r.stdout
    assert " -c 32 " in r.stdout.splitlines()[-1]


def test_ubatch_above_batch_is_noted() -> None:
    d = plan_json(*GPUS, "--", "-c", "4096", "-ub", "4096")
    assert d["context"]["n_ubatch"] == 2048
    assert any("-ub 4096 is larger than -b 2048" in n for n in d["notes"])


def test_a_leading_program_name_is_dropped_with_a_note() -> None:
    d = plan_json(*GPUS, "--", "llama-server", "-c", "4096", "-ngl", "10")
    assert any("'llama-server' after `--` is read as the program name" in n for n in d["notes"])
    assert d["context"]["n_ctx"] == 4096 and d["command"][d["command"].index("-ngl") + 1] == "10"


def test_any_other_word_after_the_double_dash_is_refused() -> None:
    err = refused(run("plan", QWEN, *GPUS, "--", "model.gguf", "-c", "4096"))
    assert "invalid argument: model.gguf" in err and "no positional arguments" in err


def test_llama_arg_variables_apply_unless_the_command_line_sets_the_flag() -> None:
    env = {"LLAMA_ARG_CTX_SIZE": "8192", "LLAMA_ARG_UBATCH": "1024"}
    d = plan_json(*GPUS, "--", "-ngl", "10", env=env)
    assert (d["context"]["n_ctx"], d["context"]["n_ubatch"]) == (8192, 1024)
    assert any(n.startswith("LLAMA_ARG_CTX_SIZE=8192 from the environment") for n in d["notes"])
    d = plan_json(*GPUS, "--", "-ngl", "10", "-c", "4096", env=env)
    assert d["context"]["n_ctx"] == 4096
    assert any("LLAMA_ARG_CTX_SIZE environment variable is set, but will be overwritten" in n
               for n in d["notes"])


def test_a_bad_llama_arg_variable_is_refused_naming_it() -> None:
    err = refused(run("plan", QWEN, *GPUS, "--", "-c", "4096", env={"LLAMA_ARG_N_GPU_LAYERS": "many"}))
    assert "LLAMA_ARG_N_GPU_LAYERS" in err


def test_a_plan_file_is_named_as_one(tmp_path: Path) -> None:
    saved = tmp_path / "x.plan.json"
    saved.write_text('{"format": "offload-planner-plan", "version": 1}', encoding="utf-8")
    err = refused(run("plan", str(saved), *GPUS, "--", "-c", "4096"))
    assert "is a plan file" in err and f"offload-planner {saved}" in err


def test_over_capacity_exits_3_and_says_so() -> None:
    r = run("plan", QWEN, "--no-detect", "--device", "CUDA0=4GiB", "--device", "CPU=512GiB", "--",
            "-c", "4096", "-fit", "off")
    assert r.returncode == 3, r.stderr
    assert "OVER" in r.stdout and "note: over capacity: CUDA0 (exit status 3)" in r.stdout
    r = run("plan", QWEN, *GPUS, "--", "-c", "4096", "-fit", "off")
    assert r.returncode == 0 and "OVER" not in r.stdout


def test_help_documents_the_exit_statuses() -> None:
    r = run("plan", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "0 the plan fits" in text and "3 a device is over capacity" in text


# --- issue 12.8: numbers as llama.cpp reads them ---------------------------------------------------


@pytest.mark.parametrize("split", ["nan", "inf", "1,nan", "-inf,1"])
def test_a_non_finite_split_is_refused_as_llama_cpp_fails_to_load(split: str) -> None:
    err = refused(run("plan", QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--device", "CUDA1=24GiB",
                      "--", "-ts", split, "-c", "4096"))
    assert "error loading model: vector::_M_range_check" in err  # the pinned build's own words
    assert f"-ts {split}: a NaN or infinite proportion" in err


def test_a_negative_split_is_refused() -> None:
    err = refused(run("plan", QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--device", "CUDA1=24GiB",
                      "--", "-ts", "-1,2", "-c", "4096"))
    assert "-ts -1,2: a negative proportion" in err


def test_an_all_zero_split_is_the_default_split_and_said() -> None:
    args = ("--no-detect", "--device", "CUDA0=24GiB", "--device", "CUDA1=8GiB", "--device", "CPU=512GiB")
    zero = plan_json(*args, "--", "-ts", "0,0", "-c", "4096")
    default = plan_json(*args, "--", "-c", "4096")
    assert zero["tensors"] == default["tensors"]
    assert any("every proportion is 0" in n for n in zero["notes"])


@pytest.mark.parametrize("value", ["１２３", "٣"])
def test_digits_llama_cpp_does_not_read_are_refused(value: str) -> None:
    err = refused(run("plan", QWEN, *GPUS, "--", "-c", value))
    assert f"-c {value}: expected an integer in ASCII digits 0-9" in err


def test_over_capacity_says_when_fit_leaves_the_command_alone() -> None:
    """The pinned build's --fit is on by default, but gives up when the user set what it adapts: with
    -ngl 99, 'n_gpu_layers already set by user to 99, abort' (common/fit.cpp 464), and the server runs
    out of memory at load. The plan said 'over capacity' without why --fit did not help."""
    r = run("plan", QWEN, "--no-detect", "--device", "CUDA0=12GiB", "--device", "CPU=512GiB",
            "--", "-c", "16384", "-ngl", "99")
    assert r.returncode == 3, r.stderr
    assert ("note: --fit is on but leaves this command as it is (llama.cpp: \"n_gpu_layers already set by "
            "user to 99, abort\"), so CUDA0 stays over") in r.stdout
    fits = run("plan", QWEN, "--no-detect", "--device", "CUDA0=12GiB", "--device", "CPU=512GiB",
               "--", "-c", "16384")  # no -ngl: --fit moves experts to the CPU and says so
    assert "leaves this command as it is" not in fits.stdout and "--fit is on" in fits.stdout
    off = run("plan", QWEN, "--no-detect", "--device", "CUDA0=12GiB", "--device", "CPU=512GiB",
              "--", "-c", "16384", "-ngl", "99", "-fit", "off")
    assert off.returncode == 3 and "--fit is on" not in off.stdout
