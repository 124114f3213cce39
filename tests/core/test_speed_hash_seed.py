"""The fit command prints the same answer whatever Python's hash seed: the speed estimate walks its
devices in their first-seen order, not a set's (whose order follows ``PYTHONHASHSEED``), so a tie
between two GPUs' shares names the same one every run.  GLM-4.5-Air on four equal GPUs ties CUDA1
and CUDA2 as the pp bottleneck; before the fix seeds 0 and 4 printed different bottlenecks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from offload_planner.core.synth import write_model
from offload_planner.core.synth.catalog import BIG_MODELS

GUI = Path(__file__).resolve().parents[2] / "gui"


def _fit(model: Path, seed: int, config: Path) -> str:
    gpus = [a for i in range(4) for a in ("--device", f"CUDA{i}=24GiB")]
    env = {**os.environ, "PYTHONHASHSEED": str(seed), "OFFLOAD_PLANNER_CONFIG_DIR": str(config),
           "PYTHONPATH": str(GUI)}
    done = subprocess.run(
        [sys.executable, "-m", "offload_planner.cli", "fit", str(model), "--no-detect", *gpus,
         "--device", "CPU=512GiB,bw=200GB/s", "--goal", "tg", "--", "-c", "32768"],
        capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_fit_output_does_not_depend_on_the_hash_seed(tmp_path: Path) -> None:
    spec = BIG_MODELS["GLM-4.5-Air-Q4_K_M"]
    [model] = write_model(spec, tmp_path / "glm-air.header.gguf", header_only=True)
    outputs = {seed: _fit(model, seed, tmp_path / "config") for seed in (0, 4, 5)}
    assert "bottleneck" in outputs[0]
    assert outputs[0] == outputs[4] == outputs[5]
