"""The CLI as a user runs it: a child process of this interpreter with this checkout's package first on
its path, a timeout, no stdin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import offload_planner

PACKAGE_ROOT = str(Path(offload_planner.__file__).resolve().parents[1])


def run_cli(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    """``offload-planner ARGS`` in a child with a timeout: a hang fails the test instead of the suite;
    ``env``: variables added to the child's environment."""
    return subprocess.run([sys.executable, "-m", "offload_planner", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONPATH": PACKAGE_ROOT, **env})
