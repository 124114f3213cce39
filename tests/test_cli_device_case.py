"""``-dev`` names as each build matches them, through the planner's real CLI.

The pinned llama.cpp build resolves ``-dev`` (and ``-devd``, ``-mmdev``) names ignoring case:
common/arg.cpp:1122 ``parse_device_list`` calls ``ggml_backend_dev_by_name``, which compares with
``striequals`` (ggml/src/ggml-backend-reg.cpp:348), so ``-dev cuda0`` is ``-dev CUDA0``. The planner
refused it ("invalid device"). ik_llama.cpp compares with ``strcmp`` (ggml-backend-reg.cpp
``ggml_backend_dev_by_name``) and refuses ``cuda0``.
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


def test_ik_refuses_a_device_name_in_another_case(model: Path) -> None:
    r = _plan(model, "-dev", "cuda1", "-ngl", "99", backend="ik_llama.cpp")
    assert r.returncode != 0
    assert "invalid device: cuda1" in r.stderr
    assert _plan(model, "-dev", "CUDA1", "-ngl", "99", backend="ik_llama.cpp").returncode == 0
