"""Hostile input left by hostile3: an rpc-server that never answers (the estimate said 'loopback
assumed' with no word of the failed probe), ``margin=0B`` (read as the default 1 GiB), a plan file's
hand-edited ``extra_args`` (added to the command unchecked), a CPU model name with control characters
or a BOM. One clear line naming the endpoint, flag, file or key; never a traceback or a hang."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import offload_planner

QWEN = str(Path(__file__).resolve().parents[1] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
PACKAGE_ROOT = str(Path(offload_planner.__file__).resolve().parents[1])


def run(*args: str, timeout: float = 60, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI in a child with a timeout: a hang fails the test instead of the suite."""
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT}
    if config is not None:
        env["OFFLOAD_PLANNER_CONFIG_DIR"] = str(config)
    return subprocess.run([sys.executable, "-m", "offload_planner", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env=env)


def test_a_failed_rpc_probe_is_said_with_its_endpoint_and_reason(tmp_path: Path) -> None:
    """An rpc-server that accepts and never answers: the probe gave up silently and the estimate said
    'network link not declared; loopback assumed' as if nothing had been tried. Now the assumption
    names RPC0, HOST:PORT and the reason; the probe waits one socket timeout (2 s), not the deadline."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)  # the kernel accepts the connection; nobody ever reads or answers
    endpoint = f"127.0.0.1:{srv.getsockname()[1]}"
    try:
        r = run("plan", QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--device", "RPC0=24GiB",
                "--device", "CPU=64GiB,bw=50GB/s", "--", "--rpc", endpoint, "-c", "4096", config=tmp_path)
    finally:
        srv.close()
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(x for x in r.stdout.splitlines() if "RPC0 host link" in x)
    assert f"RPC0 {endpoint}: no answer within 2 s; link assumed 10 GB/s loopback" in line, line
    assert "not declared" not in line
