"""The command the planner emits for an ik_llama.cpp plan reads back into the same command.

ik_llama.cpp from PR 1510 (2026-03-26) turns mmap off when a weight's ``-ot`` rule names the CPU
(``use_mmap_buffer &= !has_buft_overrides``). The planner's shortest ``-ot`` list grouped the experts
of a layer and sent the ones not moved back to the CPU by exact rules, so a plan with mmap on got a
command that, read back, turned mmap off and added ``--no-mmap``: emit -> re-read -> emit was no
fixed point. Through the real CLI on a synthetic MoE model.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from offload_planner.core.synth import SMALL_MODELS, write_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(SMALL_MODELS["qwen3moe"], tmp_path_factory.mktemp("ikmmap") / "qwen3moe.gguf")[0]


def _command(model: Path, backend: str, args: list[str]) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "gui"), "QT_QPA_PLATFORM": "offscreen"}
    r = subprocess.run(
        [sys.executable, "-m", "offload_planner", "plan", str(model), "--no-detect", "--backend", backend,
         "--device", "CUDA0=24GiB", "--", *args],
        capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr
    argv = shlex.split(r.stdout.strip().splitlines()[-1])
    assert argv[:3] == ["llama-server", "-m", str(model)]
    return argv[3:]


@pytest.mark.parametrize("backend", ["ik_llama.cpp", "ik_llama.cpp-2026-08"])
@pytest.mark.parametrize("args", [
    ["-ngl", "1", "-ot", r"blk\.0\.ffn_up_exps=CUDA0"],  # mmap on: no CPU rule may be emitted
    ["-ngl", "1", "-ot", r"blk\.[01]\.ffn_(up|down)_exps=CUDA0"],
    ["-ngl", "99", "-ot", r"blk\.1\.ffn_up_exps=CPU"],  # mmap off: the command says --no-mmap
    ["-ngl", "99", "-ot", r"exps=CPU"],
])
def test_emitted_command_is_a_fixed_point(model: Path, backend: str, args: list[str]) -> None:
    first = _command(model, backend, args)
    assert _command(model, backend, first) == first
    if not any(a.endswith("=CPU") for a in args[3:]):  # mmap stays on: the command says nothing else
        assert "--no-mmap" not in first and "=CPU" not in " ".join(first)
