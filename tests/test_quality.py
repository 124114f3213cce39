"""ruff and mypy are part of the build: a lint or type error fails the suite."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_clean() -> None:
    if shutil.which("ruff") is None:
        pytest.fail("ruff is not installed (it is in the test extra)")
    r = _run(["ruff", "check", "gui", "tests", "bench", "resources"])
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_clean() -> None:
    r = _run([sys.executable, "-m", "mypy"])
    assert r.returncode == 0, r.stdout + r.stderr
