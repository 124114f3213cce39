"""``-dev`` names as each build matches them, through the planner's real CLI.

The pinned llama.cpp build resolves ``-dev`` (and ``-devd``, ``-mmdev``) names ignoring case:
common/arg.cpp:1122 ``parse_device_list`` calls ``ggml_backend_dev_by_name``, which compares with
``striequals`` (ggml/src/ggml-backend-reg.cpp:348), so ``-dev cuda0`` is ``-dev CUDA0``. The planner
refused it ("invalid device"). ik_llama.cpp looks ``-dev`` names up exactly as written when it loads the
model (src/llama.cpp 7821-7828 at 8337e4cd, a ``std::map`` of its buffer types' names) and skips ``cuda0``
with "cuda0 backend not available.".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from offload_planner.core.synth import SMALL_MODELS, write_model

ROOT = Path(__file__).resolve().parents[1]
DEVICES = ("--device", "CUDA0=24GiB", "--device", "CUDA1=24GiB")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(SMALL_MODELS["qwen3moe"], tmp_path_factory.mktemp("devcase") / "qwen3moe.gguf")[0]


def _plan(model: Path, *args: str, backend: str = "llama.cpp") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "gui"), "QT_QPA_PLATFORM": "offscreen"}
    return subprocess.run(
        [sys.executable, "-m", "offload_planner", "plan", str(model), "--no-detect", "--backend", backend,
         *DEVICES, "--json", "--", *args],
        capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("given", ["cuda1", "Cuda1", "cUdA0,cuda1"])
def test_pinned_build_takes_a_device_name_in_any_case(model: Path, given: str) -> None:
    lower = _plan(model, "-dev", given, "-ngl", "99")
    exact = _plan(model, "-dev", given.upper(), "-ngl", "99")
    assert lower.returncode == 0, lower.stderr
    assert exact.returncode == 0, exact.stderr
    assert lower.stdout == exact.stdout  # the same plan, and its command names the device as the build does
    assert f'"{given.upper()}"' in lower.stdout and given not in lower.stdout


def test_ik_skips_a_device_name_in_another_case(model: Path) -> None:
    """ik does not refuse it: its loader logs "cuda1 backend not available.", skips it and, with no name
    left, loads the model on the CPU (src/llama.cpp 7821-7833 at 8337e4cd;
    tests/core/test_ik_unknown_dev.py)."""
    import json

    r = _plan(model, "-dev", "cuda1", "-ngl", "99", backend="ik_llama.cpp")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert any(n.startswith('-dev cuda1: ik_llama.cpp logs "cuda1 backend not available." and skips it')
               and "the model loads on the CPU only" in n for n in d["notes"]), d["notes"]
    assert {x["name"] for x in d["devices"]} >= {"CUDA0", "CUDA1"}
    assert all(x["total_bytes"] == 0 for x in d["devices"] if x["name"] != "CPU"), d["devices"]
    assert _plan(model, "-dev", "CUDA1", "-ngl", "99", backend="ik_llama.cpp").returncode == 0


def test_a_selection_of_fewer_gpus_is_modelled_and_said(model: Path) -> None:
    """``-dev`` naming fewer GPUs than the plan has: llama-server uses those only (checked on the real
    server in tests/integration/test_plan_vs_llama.py), and so does the plan: the GPUs left out hold
    nothing, and a note names them; naming every GPU (any order) says nothing, ``-dev none`` names all."""
    import json

    r = _plan(model, "-ngl", "99", "-dev", "cuda1")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert "-dev CUDA1: llama-server uses CUDA1 only; CUDA0 holds nothing of the model" in d["notes"]
    totals = {x["name"]: x["total_bytes"] for x in d["devices"]}
    assert totals["CUDA0"] == 0 < totals["CUDA1"], totals
    r = _plan(model, "-ngl", "99", "-dev", "none")
    none = "-dev none: llama-server uses no GPU; CUDA0, CUDA1 hold nothing of the model"
    assert none in json.loads(r.stdout)["notes"]
    for every in (["-dev", "CUDA1,CUDA0"], []):
        r = _plan(model, "-ngl", "99", *every)
        assert r.returncode == 0, r.stderr
        assert not [n for n in json.loads(r.stdout)["notes"] if n.startswith("-dev")]
