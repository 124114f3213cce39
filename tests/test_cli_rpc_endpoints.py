"""``--rpc`` entries the pinned llama-server cannot use are refused by the planner, one line naming the
flag and the entry (leftovers4). Before, ``--rpc host`` and ``--rpc 127.0.0.1:99999`` were planned as
RPC0 and only the RPC probe, later, said something was wrong.

What the server does with them is measured on the real llama-server: ggml-rpc's ``parse_endpoint``
aborts on an entry with no ``:PORT`` (``Failed to parse endpoint: host``), and ``socket_t::connect``
takes the port modulo 65536 (``htons``), so ``:99999`` reaches whatever listens on port 34463 while
ggml-rpc-server itself refuses ``-p 99999``.
"""

from __future__ import annotations

import json
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


# --- the rest of an entry as llama-server reads it (leftovers6) ------------------------------------------
# ggml-rpc splits an entry at its first ':' and reads the port with std::stoi: what follows the number is
# ignored and blanks before it skipped, so the real server takes these and connects to port P; the planner
# took them too but its RPC probe read them its own way (the last ':', digits only) and measured nothing.


def _usable(port: int) -> list[str]:
    return [f"127.0.0.1:{port}x", f"127.0.0.1:{port}:7", f"127.0.0.1: {port}"]


def test_entries_the_real_server_takes_are_planned_and_probed(llama_bin_dir: Path, tmp_path: Path) -> None:
    with rpc_servers(llama_bin_dir, 1, tmp_path) as [endpoint]:
        port = int(endpoint.rsplit(":", 1)[1])
        for entry in _usable(port):
            server = _list_devices(llama_bin_dir, entry)
            assert server.returncode == 0 and f"RPC0: {entry} (" in server.stdout, server.stderr[-2000:]
            r = run("plan", QWEN, "--no-detect", "--device", "RPC0=32GiB,bw=20GB/s", "--device", "CPU=64GiB",
                    "--json", "--", "--rpc", entry, "-c", "4096", "-ngl", "999")
            assert r.returncode == 0, (entry, r.stderr[-2000:])
            got = {a["what"]: a for a in json.loads(r.stdout)["speed"]["assumptions"]}
            assert got["RPC0 host link"]["source"] == "measured", (entry, got["RPC0 host link"])


def test_an_ignored_port_tail_is_said() -> None:
    r = run("plan", QWEN, "--no-detect", "--device", "CPU=64GiB,bw=50GB/s", "--device", "RPC0=8GiB",
            "--", "--rpc", "127.0.0.1:50052x", "-c", "4096")
    assert r.returncode == 0, r.stderr[-2000:]
    assert ("--rpc 127.0.0.1:50052x: llama-server reads port 50052 of 127.0.0.1 and ignores 'x'"
            in r.stdout + r.stderr)
    assert "llama-server -m" in r.stdout and "--rpc 127.0.0.1:50052x" in r.stdout  # passed on as written


def test_a_blank_before_an_entry_is_refused_where_the_real_server_stops(llama_bin_dir: Path,
                                                                         tmp_path: Path) -> None:
    """``--rpc a:P, a:P`` (a blank after the comma): the real server cannot connect to `` a:P``."""
    with rpc_servers(llama_bin_dir, 1, tmp_path) as [endpoint]:
        value = f"{endpoint}, {endpoint}"
        server = _list_devices(llama_bin_dir, value)
        planner = run("plan", QWEN, "--no-detect", "--", "--rpc", value)
    assert server.returncode != 0 and f"Failed to connect to  {endpoint}" in server.stdout + server.stderr
    refused(planner, 2, f"--rpc ' {endpoint}': host ' 127.0.0.1' has a blank",
            f"llama-server stops: Failed to connect to  {endpoint}")
