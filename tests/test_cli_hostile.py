"""Hostile input through the entry point: one clear line, exit 2, fast; never a hang or traceback.

Every run has a timeout, so a regression fails here instead of hanging the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

TIMEOUT = 20


def run(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "offload_planner", *args], capture_output=True, text=True,
                       timeout=TIMEOUT, env={**os.environ, "HOME": str(Path.home())})
    return r, time.monotonic() - t0


def one_clear_error(r: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("offload-planner: error: ") and r.stderr.count("\n") == 1, r.stderr
    for f in fragments:
        assert f in r.stderr, r.stderr
    return r.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("command", ["inspect", "plan"])
def test_fifo_as_model_is_refused(tmp_path: Path, command: str) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    extra = ["--no-detect"] if command == "plan" else []
    r, _ = run(command, str(fifo), *extra)
    one_clear_error(r, f"{fifo}: is a FIFO (named pipe), not a GGUF file")


def test_directory_as_model_is_refused(tmp_path: Path) -> None:
    r, _ = run("inspect", str(tmp_path))
    assert one_clear_error(r) == f"offload-planner: error: {tmp_path}: is a directory, not a GGUF file\n"
