"""``--rpc`` entries the pinned llama-server cannot use are refused by the planner, one line naming the
flag and the entry (leftovers4). Before, ``--rpc host`` and ``--rpc 127.0.0.1:99999`` were planned as
RPC0 and only the RPC probe, later, said something was wrong.

What the server does with them is measured on the real llama-server: ggml-rpc's ``parse_endpoint``
aborts on an entry with no ``:PORT`` (``Failed to parse endpoint: host``), and ``socket_t::connect``
takes the port modulo 65536 (``htons``), so ``:99999`` reaches whatever listens on port 34463 while
ggml-rpc-server itself refuses ``-p 99999``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.refusals import refused
from tests.support.rpc import rpc_servers

import offload_planner

QWEN = str(Path(__file__).resolve().parents[1] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
PACKAGE_ROOT = str(Path(offload_planner.__file__).resolve().parents[1])


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": PACKAGE_ROOT, **(env or {})}
    return subprocess.run([sys.executable, "-m", "offload_planner", *args], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, env=full)


@pytest.mark.parametrize(
    ("command", "entry", "fragments"),
    [
        ("plan", "host", ("--rpc host: no port; expected HOST:PORT", "Failed to parse endpoint: host")),
        ("plan", "127.0.0.1:99999", ("--rpc 127.0.0.1:99999: port 99999 is outside 1-65535",
                                     "would connect to port 34463")),
        ("plan", "127.0.0.1:50052,127.0.0.1:abc", ("--rpc 127.0.0.1:abc: port 'abc': expected an integer",
                                                   "Failed to parse endpoint: 127.0.0.1:abc")),
        ("plan", "127.0.0.1:50052,", ("--rpc '': an empty entry",)),
        ("plan", ":50052", ("--rpc :50052: no host before ':'",)),
        ("fit", "host", ("--rpc host: no port",)),
        ("fit", "127.0.0.1:65536", ("--rpc 127.0.0.1:65536: port 65536 is outside 1-65535",
                                    "would connect to port 0")),
    ],
)
def test_an_unusable_rpc_entry_is_refused_in_one_line(command: str, entry: str,
                                                      fragments: tuple[str, ...]) -> None:
    r = run(command, QWEN, "--no-detect", "--device", "CPU=64GiB,bw=50GB/s", "--", "--rpc", entry,
            "-c", "4096")
    refused(r, 2, *fragments)


def test_the_environment_variable_is_named_with_its_value() -> None:
    r = run("plan", QWEN, "--no-detect", "--device", "CPU=64GiB,bw=50GB/s", env={"LLAMA_ARG_RPC": "host"})
    refused(r, 2, "LLAMA_ARG_RPC=host: no port", "Failed to parse endpoint: host")


@pytest.mark.parametrize(("entry", "reason"), [
    ("host", "ik_llama.cpp gets no RPC device from it"),  # add_rpc_devices: no device from it
    ("127.0.0.1:abc", "ik_llama.cpp stops: stoi"),  # its parse_endpoint: std::stoi unchecked
    ("127.0.0.1:99999", "ik_llama.cpp would connect to port 34463"),  # the same htons
])
def test_ik_llama_cpp_is_refused_with_its_own_reason(entry: str, reason: str) -> None:
    r = run("plan", QWEN, "--no-detect", "--backend", "ik_llama.cpp", "--device", "CPU=64GiB,bw=50GB/s",
            "--", "--rpc", entry)
    refused(r, 2, f"--rpc {entry}: ", reason)


def test_usable_entries_still_plan_their_devices() -> None:
    r = run("plan", QWEN, "--no-detect", "--device", "CPU=64GiB,bw=50GB/s", "--device", "RPC0=8GiB",
            "--device", "RPC1=8GiB", "--", "--rpc", "127.0.0.1:50052,localhost:1", "-c", "4096")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "RPC1" in r.stdout


def _list_devices(llama_bin_dir: Path, entry: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}
    return subprocess.run([str(llama_bin_dir / "llama-server"), "--rpc", entry, "--list-devices"],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, env=env)


def test_the_real_server_stops_where_the_planner_says(llama_bin_dir: Path) -> None:
    """The planner's quoted reason is the server's: ``--rpc host`` aborts while the arguments are read."""
    r = _list_devices(llama_bin_dir, "host")
    assert r.returncode != 0
    assert "Failed to parse endpoint: host" in r.stdout + r.stderr
    planner = run("plan", QWEN, "--no-detect", "--", "--rpc", "host")
    refused(planner, 2, "Failed to parse endpoint: host")


def test_the_real_server_takes_a_port_modulo_65536(llama_bin_dir: Path, tmp_path: Path) -> None:
    """A ggml-rpc-server on port P is reached through ``--rpc 127.0.0.1:P+65536``: the planner names P."""
    with rpc_servers(llama_bin_dir, 1, tmp_path) as endpoints:
        port = int(endpoints[0].rsplit(":", 1)[1])
        wrapped = f"127.0.0.1:{port + 65536}"
        r = _list_devices(llama_bin_dir, wrapped)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"RPC0: {wrapped}" in r.stdout + r.stderr
    planner = run("plan", QWEN, "--no-detect", "--", "--rpc", wrapped)
    refused(planner, 2, f"--rpc {wrapped}: port {port + 65536} is outside 1-65535",
            f"would connect to port {port};")
