"""`fit` on a dense model (no routed experts): no --cpu-moe / --n-cpu-moe baselines and no notes
about routed experts, which do not apply; one note says what the search does instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import offload_planner
from offload_planner.core.synth import SMALL_MODELS, write_model

PACKAGE_ROOT = str(Path(offload_planner.__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("dense") / "llama.gguf"
    write_model(SMALL_MODELS["llama"], path)
    return str(path)


def fit(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT}
    return subprocess.run([sys.executable, "-m", "offload_planner", "fit", *args], capture_output=True,
                          text=True, timeout=60, env=env)


def test_dense_fit_lists_no_moe_baselines(llama: str) -> None:
    r = fit(llama, "--no-detect", "--device", "CUDA0=24GiB", "--", "-c", "4096")
    assert r.returncode == 0, r.stderr
    assert "--cpu-moe" not in r.stdout and "--n-cpu-moe" not in r.stdout, r.stdout
    assert "routed expert" not in r.stdout.replace("(no routed experts)", ""), r.stdout
    assert "note: dense model (no routed experts)" in r.stdout
    assert "llama.cpp --fit" in r.stdout and "*fastest" in r.stdout


def test_dense_fit_that_does_not_fit_says_why_without_experts(llama: str) -> None:
    r = fit(llama, "--no-detect", "--device", "CUDA0=1MiB", "--json", "--", "-c", "4096")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert [c["label"] for c in out["candidates"]] == ["llama.cpp --fit"]
    assert not any("routed expert on the CPU" in n for n in out["notes"]), out["notes"]
    assert any("does not fit with the command's layers on the GPUs" in n for n in out["notes"])
