"""Values as the real llama-server reads them, against `plan`: `-c 32k` is read as 32 (std::stoi),
which `plan` follows and notes; `-ts` values llama.cpp accepts and then cannot use (on two
ggml-rpc-servers): a NaN proportion fails the load with the message `plan` prints, and a negative
one either puts every layer on one device or fails the load; `plan` refuses both, naming -ts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.procs import free_port, run_to_completion, running_process
from tests.support.rpc import rpc_servers

import offload_planner

PACKAGE_ROOT = os.pathsep.join(
    p for p in (str(Path(offload_planner.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")) if p
)


@pytest.fixture(scope="module")
def rpc(llama_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two ggml-rpc-servers for the whole module, stopped by PID."""
    with rpc_servers(llama_bin_dir, 2, tmp_path_factory.mktemp("rpc")) as endpoints:
        yield endpoints


def _plan(model: Path, rpc: list[str], split: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "offload_planner", "plan", str(model), "--no-detect", "--",
         "--rpc", ",".join(rpc), "-ngl", "99", "-c", "512", "-ts", split],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": PACKAGE_ROOT},
    )


def _server(llama_server: Path, model: Path, rpc: list[str], split: str) -> list[str]:
    return [str(llama_server), "-m", str(model), "--rpc", ",".join(rpc), "-ngl", "99", "-c", "512",
            "-ts", split, "-fit", "off", "-lv", "4", "--host", "127.0.0.1", "--port", str(free_port())]


@pytest.mark.parametrize("split", ["nan", "1,-1"])
def test_a_split_that_fails_the_load_is_refused_with_the_servers_message(
    split: str, llama_server: Path, rpc: list[str], small_models: dict[str, Path], tmp_path: Path
) -> None:
    model = small_models["qwen3moe"]
    code, out = run_to_completion(_server(llama_server, model, rpc, split), log_path=tmp_path / "srv.log")
    assert code != 0 and "llama_model_load: error loading model: vector::_M_range_check" in out
    r = _plan(model, rpc, split)
    assert r.returncode == 2 and r.stdout == "", r.stdout[-400:]
    assert f"-ts {split}: a" in r.stderr
    if split == "nan":
        server_line = next(ln for ln in out.splitlines() if "error loading model" in ln)
        assert server_line.split(" E ", 1)[1] in r.stderr  # llama-server's own words


def test_a_negative_split_that_loads_leaves_a_device_empty(
    llama_server: Path, rpc: list[str], small_models: dict[str, Path], tmp_path: Path
) -> None:
    model = small_models["qwen3moe"]
    with running_process(_server(llama_server, model, rpc, "-1,2"), log_path=tmp_path / "srv.log",
                         ready=r"listening on http://", timeout=120) as proc:
        out = proc.output()
    buffers = [ln for ln in out.splitlines() if "model buffer size" in ln and "RPC" in ln]
    assert len(buffers) == 1 and rpc[1] in buffers[0], buffers  # every layer on the second device
    r = _plan(model, rpc, "-1,2")
    assert r.returncode == 2 and "-ts -1,2: a negative proportion" in r.stderr


def test_c_32k_is_read_as_32_by_the_server_and_by_plan(
    llama_server: Path, small_models: dict[str, Path], tmp_path: Path
) -> None:
    model = small_models["qwen3moe"]
    args = ["-c", "32k", "-ngl", "0", "-np", "1", "-fit", "off"]
    with running_process([str(llama_server), "-m", str(model), *args, "--host", "127.0.0.1",
                          "--port", str(free_port())], log_path=tmp_path / "srv.log",
                         ready=r"listening on http://", timeout=120) as proc:
        served = proc.wait_for(r"n_ctx_slot = (\d+)", 10)
    r = subprocess.run([sys.executable, "-m", "offload_planner", "plan", str(model), "--json", "--no-detect",
                        "--", *args], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": PACKAGE_ROOT})
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["context"]["n_ctx"] == int(served.group(1)) == 256  # 32 cells, padded to 256
    assert any(n.startswith("-c 32k: llama-server reads 32 and ignores 'k'") for n in d["notes"])


def test_a_device_name_in_lower_case_is_the_device(
    llama_server: Path, rpc: list[str], small_models: dict[str, Path], tmp_path: Path
) -> None:
    """``-dev rpc1``: the pinned build matches device names ignoring case (``striequals`` in
    ``ggml_backend_dev_by_name``), so the model goes to RPC1; `plan` reads it as ``-dev RPC1``."""
    model = small_models["qwen3moe"]
    cmd = [str(llama_server), "-m", str(model), "--rpc", ",".join(rpc), "-dev", "rpc1", "-ngl", "99",
           "-c", "512", "-fit", "off", "-lv", "4", "--host", "127.0.0.1", "--port", str(free_port())]
    with running_process(cmd, log_path=tmp_path / "srv.log", ready=r"listening on http://",
                         timeout=120) as proc:
        out = proc.output()
    buffers = [ln for ln in out.splitlines() if "model buffer size" in ln and "RPC" in ln]
    assert len(buffers) == 1 and rpc[1] in buffers[0], buffers  # every layer on the second server

    def plan(dev: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "offload_planner", "plan", str(model), "--no-detect", "--json", "--",
             "--rpc", ",".join(rpc), "-dev", dev, "-ngl", "99", "-c", "512"],
            capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": PACKAGE_ROOT},
        )

    lower, upper = plan("rpc1"), plan("RPC1")
    assert lower.returncode == 0, lower.stderr
    assert lower.stdout == upper.stdout
    command = json.loads(lower.stdout)["command"]
    assert command[command.index("-dev") + 1] == "RPC1"  # the device's own name


def test_an_ot_on_a_device_dev_leaves_out_aborts_the_server_and_is_warned(
    llama_server: Path, rpc: list[str], small_models: dict[str, Path], tmp_path: Path
) -> None:
    """``-dev RPC0`` with an -ot naming RPC1's buffer type: the server loads those weights into RPC1 and
    then aborts while reserving the compute buffers (no backend of the scheduler can use that buffer);
    `plan` projects the load and warns that the server aborts."""
    model = small_models["qwen3moe"]
    args = ["--rpc", ",".join(rpc), "-dev", "RPC0", "-ngl", "99", "-c", "512",
            "-ot", rf"blk\.1\.=RPC0[{rpc[1]}]"]
    code, out = run_to_completion([str(llama_server), "-m", str(model), *args, "-fit", "off", "--host",
                                   "127.0.0.1", "--port", str(free_port())], log_path=tmp_path / "srv.log")
    assert code != 0 and "pre-allocated tensor (blk.1." in out and f"in a buffer (RPC0[{rpc[1]}])" in out
    r = subprocess.run([sys.executable, "-m", "offload_planner", "plan", str(model), "--no-detect", "--json",
                        "--", *args], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": PACKAGE_ROOT})
    assert r.returncode == 0, r.stderr
    warned = [w for w in json.loads(r.stdout)["warnings"] if w.startswith("RPC1 holds")]
    assert warned and "-dev RPC0 leaves RPC1 out" in warned[0] and "aborts" in warned[0]
