"""``-devd`` without a draft model: both builds parse the device list (an unknown name is refused) and
read it only when a draft loads (pinned: common_base_params_to_speculative with has_dft(), common/
speculative.cpp 2537-2541; ik: common_speculative_load_draft_model, 1942-1950 at 8337e4cd), so ``plan``
says once that it is ignored, and says nothing when the draft loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import offload_planner

PACKAGE_ROOT = str(Path(offload_planner.__file__).resolve().parents[1])
TWO_GPUS = ["--no-detect", "--device", "CUDA0=24GiB", "--device", "CUDA1=24GiB"]


def plan(backend: str, *server: str) -> list[str]:
    r = subprocess.run([sys.executable, "-m", "offload_planner", "plan", server[0], *TWO_GPUS,
                        "--backend", backend, "--", *server[1:]], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": PACKAGE_ROOT})
    assert r.returncode == 0, r.stderr[-2000:]
    return [line for line in r.stdout.splitlines() if "-devd" in line and line.startswith("note: ")]


@pytest.mark.parametrize(("backend", "spec"), [
    ("llama.cpp", []), ("llama.cpp", ["--spec-type", "draft-mtp"]),
    ("llama.cpp", ["--spec-type", "ngram-simple"]), ("ik_llama.cpp", []),
    ("ik_llama.cpp", ["--spec-type", "mtp"]), ("ik_llama.cpp", ["--spec-type", "ngram_simple"]),
])
def test_devd_without_a_draft_model_is_noted(backend: str, spec: list[str],
                                             small_models: dict[str, Path]) -> None:
    notes = plan(backend, str(small_models["llama"]), "-devd", "CUDA1", *spec)
    assert notes == ["note: -devd CUDA1 is ignored: the command has no draft model (-md), and llama-server "
                     "reads the draft's devices only when it loads one"]


@pytest.mark.parametrize(("backend", "spec"), [
    ("llama.cpp", []), ("llama.cpp", ["--spec-type", "draft-simple"]),
    ("ik_llama.cpp", ["--spec-type", "draft"]),
])
def test_devd_with_a_loaded_draft_is_not_noted(backend: str, spec: list[str],
                                               small_models: dict[str, Path]) -> None:
    draft = str(small_models["llama-draft"])
    assert plan(backend, str(small_models["llama"]), "-devd", "CUDA1", "-md", draft, *spec) == []


def test_ik_draft_params_without_md_load_a_draft(small_models: dict[str, Path]) -> None:
    """ik's has_dft() is -md or -draft "ARGS" (common/common.h 265-267): -draft "-m FILE" names the draft
    model, which loads on -devd's devices; -devd is not ignored there."""
    draft = str(small_models["llama-draft"])
    assert plan("ik_llama.cpp", str(small_models["llama"]), "-devd", "CUDA1", "--spec-type", "draft",
                "-draft", f"-m {draft}") == []
