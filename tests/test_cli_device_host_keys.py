"""The host-only --device keys (ram=, threads=, cores=, ghz=) on a GPU were accepted and ignored;
now refused naming the --device value and the key and saying they belong on CPU=...; an RPC
device keeps threads= (its rpc-server's threads, which the estimate reads)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import offload_planner

QWEN = str(Path(__file__).resolve().parents[1] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
PACKAGE_ROOT = str(Path(offload_planner.__file__).resolve().parents[1])


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT}
    return subprocess.run([sys.executable, "-m", "offload_planner", *args], capture_output=True, text=True,
                          timeout=60, env=env)


@pytest.mark.parametrize("command", ["plan", "fit"])
@pytest.mark.parametrize("decl", ["CUDA0=24GiB,ghz=3", "CUDA0=24GiB,threads=4", "Vulkan0=16GiB,cores=8",
                                  "CUDA0=rtx3090,ram=2xDDR5-4800", "RPC0=32GiB,ghz=2.4"])
def test_host_key_on_a_gpu_is_refused(command: str, decl: str) -> None:
    r = run(command, QWEN, "--no-detect", "--device", decl)
    assert r.returncode == 2, (r.returncode, r.stdout[-300:], r.stderr[-500:])
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    key, val = decl.rsplit(",", 1)[1].split("=")
    assert f"--device {decl!r}" in last, last
    assert f"{key}= describes the host's CPU" in last and f"--device CPU=64GiB,{key}={val}" in last, last


def test_host_keys_on_the_cpu_and_threads_on_rpc_still_work() -> None:
    r = run("plan", QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--device", "RPC0=32GiB,threads=4",
            "--device", "CPU=64GiB,ram=2xDDR5-4800,threads=8,cores=8,ghz=3", "--", "--rpc", "10.0.0.2:50052")
    assert r.returncode == 0, r.stderr[-800:]
    assert "speed estimate" in r.stdout
