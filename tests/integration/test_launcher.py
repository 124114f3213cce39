"""The launcher against the real llama-server and two local ggml-rpc-servers.

* ServerProcess (in a Qt event loop) starts llama-server on the project's small models, reaches
  Running, the buffers it logs equal the engine's projection within tolerance, and stopping it
  leaves no process behind (the PID and every child it had are gone).
* ``offload-planner launch --verify`` as a user runs it: exit 0 on a small model, non-zero with the
  right message for a bad flag, a missing model and a server that logs no buffer sizes.
* Out of memory for real: an RPC server under ``prlimit --as`` fails the KV allocation (explained
  for RPC0 or RPC1 by its endpoint), and llama-server itself under a ``prlimit`` wrapper fails the
  host KV cache (explained for CPU with a smaller -c that fits).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from pytestqt.qtbot import QtBot
from tests.support.procs import free_port, running_process
from tests.support.rpc import rpc_servers, wait_listening

from offload_planner.backend import launch
from offload_planner.backend.launch import PlanContext
from offload_planner.backend.runner import LaunchConfig, LaunchOutcome, ServerProcess, ServerState
from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import Dialect, parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model

pytestmark = pytest.mark.integration

GUI = Path(__file__).resolve().parents[2] / "gui"
CASES = [
    ("qwen3moe", "-ngl 999 -ts 1,1 -c 4096"),
    ("qwen3moe", "-ngl 999 -ts 1,1 -c 4096 -ot exps=CPU"),
    ("llama", "-ngl 2 -ts 1,1 -c 2048"),
    ("gpt-oss", "-ngl 999 -ts 1,1 -c 4096 -ub 256"),
]
FIXED = ["-fit", "off", "--no-warmup"]


@pytest.fixture(scope="module")
def rpc(llama_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    with rpc_servers(llama_bin_dir, 2, tmp_path_factory.mktemp("rpc")) as endpoints:
        yield endpoints


def _devices(endpoints: list[str]) -> DeviceSet:
    gpus = tuple(Device(f"RPC{i}", DeviceKind.RPC, source="rpc", endpoint=ep)
                 for i, ep in enumerate(endpoints))
    return DeviceSet(Device("CPU", DeviceKind.CPU, 64 << 30, 64 << 30), gpus)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _run(qtbot: QtBot, sp: ServerProcess, cfg: LaunchConfig, timeout: int = 120_000) -> LaunchOutcome:
    with qtbot.waitSignal(sp.finished, timeout=timeout) as done:
        sp.start(cfg)
    outcome = done.args[0]
    assert isinstance(outcome, LaunchOutcome)
    return outcome


@pytest.mark.parametrize(("name", "args"), CASES, ids=[f"{m}:{a}" for m, a in CASES])
def test_server_process_matches_the_projection_and_leaves_nothing(
    qtbot: QtBot, name: str, args: str, small_models: dict[str, Path], llama_server: Path, rpc: list[str],
) -> None:
    argv = ["--rpc", ",".join(rpc), *args.split(), *FIXED]
    sp = ServerProcess()
    states: list[str] = []
    progress: list[float] = []
    sp.stateChanged.connect(states.append)
    sp.progressChanged.connect(lambda f, label: progress.append(f))
    cfg = LaunchConfig(server_args=argv, executable=str(llama_server), model=str(small_models[name]),
                       port=free_port())
    try:
        with qtbot.waitSignal(sp.ready, timeout=120_000):
            sp.start(cfg)
        assert sp.state is ServerState.RUNNING and sp.dialect is Dialect.LLAMA_CPP
        qtbot.waitUntil(lambda: sp.healthy is True, timeout=10_000)  # /health answers 200
        pid = sp.pid
        assert pid is not None and _alive(pid)
        kids = [p.pid for p in psutil.Process(pid).children(recursive=True)]
        report = sp.report
        parsed = parse_server_args(argv, dialect=Dialect.LLAMA_CPP)
        devices = launch.devices_from_log(_devices(rpc), report)
        projection = analyse_command(open_model(small_models[name]), devices, parsed.args).projection
        cmp = launch.compare(projection, report)
        print(f"\n{name} {args}\n{cmp.text()}")
        assert cmp.ok, cmp.text()
        assert {t.device for t in cmp.totals} >= {"RPC0", "RPC1", "CPU"}
        with qtbot.waitSignal(sp.finished, timeout=30_000) as done:
            sp.stop()
        outcome = done.args[0]
    finally:
        sp.shutdown(5)
    assert outcome.ok and outcome.stopped and not outcome.killed
    assert states == ["Starting", "Loading", "Running", "Stopping", "Exited"]
    assert progress == sorted(progress) and progress[-1] == 1.0 and len(progress) >= 5
    assert not _alive(pid) and not any(_alive(k) for k in kids)


def _cli(*args: str, tmp_path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home()),
           "PYTHONPATH": str(GUI), "OFFLOAD_PLANNER_CONFIG_DIR": str(tmp_path / "cfg"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "offload_planner", "launch", *args], capture_output=True,
                          text=True, timeout=300, env=env)


def test_cli_verify(small_models: dict[str, Path], llama_server: Path, rpc: list[str],
                    tmp_path: Path) -> None:
    model = str(small_models["qwen3moe"])
    rpc_arg = ["--rpc", ",".join(rpc)]
    ok = _cli(model, "--server", str(llama_server), "--verify", "--save-calibration", "--",
              *rpc_arg, "-ngl", "999", "-ts", "1,1", "-c", "4096", *FIXED, tmp_path=tmp_path)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "every device matches the projection" in ok.stderr and "projected against actual" in ok.stdout
    assert "RPC1     total" in ok.stdout and "listening on http://127.0.0.1:" in ok.stdout  # the log streamed
    assert (tmp_path / "cfg" / "calibration.json").is_file()

    bad = _cli(model, "--server", str(llama_server), "--verify", "--quiet", "--",
               "-c", "4096", "--bogus-flag", *FIXED, tmp_path=tmp_path)
    assert bad.returncode == 3 and "llama-server does not accept --bogus-flag" in bad.stderr

    missing = str(tmp_path / "missing.gguf")
    gone = _cli(missing, "--server", str(llama_server), "--verify", "--quiet", "--", "-c", "4096", *FIXED,
                tmp_path=tmp_path)
    assert gone.returncode == 3 and f"model file not found: {missing}" in gone.stderr

    quiet = _cli(model, "--server", str(llama_server), "--verify", "--quiet", "--", *rpc_arg, "-c", "4096",
                 "-lv", "3", *FIXED, tmp_path=tmp_path)
    assert quiet.returncode == 1 and "logged no buffer sizes" in quiet.stderr

    ot = _cli(model, "--server", str(llama_server), "--verify", "--quiet", "--", "-c", "4096",
              "-ot", "exps=NOPE", *FIXED, tmp_path=tmp_path)
    assert ot.returncode == 3 and "-ot: unknown buffer type" in ot.stderr
    assert not any(p.info["name"] == "llama-server" and p.info["ppid"] == os.getpid()
                   for p in psutil.process_iter(["name", "ppid"]))


def test_cli_verify_reads_a_pasted_command_and_the_environment_as_the_server_does(
    small_models: dict[str, Path], llama_server: Path, rpc: list[str], tmp_path: Path
) -> None:
    """`-- llama-server ...` (a pasted command): the program name is not passed on as an argument;
    LLAMA_ARG_CTX_SIZE reaches the server from the environment and the projection reads it too."""
    model = str(small_models["qwen3moe"])
    r = _cli(model, "--server", str(llama_server), "--verify", "--quiet", "--", "llama-server",
             "--rpc", ",".join(rpc), "-ngl", "999", "-ts", "1,1", *FIXED, tmp_path=tmp_path,
             env={"LLAMA_ARG_CTX_SIZE": "4096"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "'llama-server' after `--` is read as the program name" in r.stderr
    assert "LLAMA_ARG_CTX_SIZE=4096 from the environment" in r.stderr
    assert "every device matches the projection" in r.stderr


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit (util-linux) is not installed")
def test_rpc_server_out_of_memory_is_explained(qtbot: QtBot, small_models: dict[str, Path],
                                               llama_bin_dir: Path, rpc: list[str], tmp_path: Path) -> None:
    port = free_port()
    limited = ["prlimit", "--as=700000000", "--", str(llama_bin_dir / "ggml-rpc-server"), "-H", "127.0.0.1",
               "-p", str(port)]
    with running_process(limited, log_path=tmp_path / "rpc-limited.log"):
        wait_listening(port)
        endpoints = [rpc[0], f"127.0.0.1:{port}"]  # the limited server is RPC1
        argv = ["--rpc", ",".join(endpoints), "-ngl", "999", "-ts", "1,1", "-c", "1048576", *FIXED]
        sp = ServerProcess()
        try:
            cfg = LaunchConfig(server_args=argv, executable=str(llama_bin_dir / "llama-server"),
                               model=str(small_models["qwen3moe"]), port=free_port())
            outcome = _run(qtbot, sp, cfg)
        finally:
            sp.shutdown(5)
    assert outcome.state is ServerState.FAILED and not outcome.reached_running
    model = open_model(small_models["qwen3moe"])
    parsed = parse_server_args(argv, dialect=Dialect.LLAMA_CPP)
    devices = launch.devices_from_log(_devices(endpoints), outcome.report)
    projection = analyse_command(model, devices, parsed.args).projection
    exps = outcome.explain(PlanContext(model, devices, argv, "llama.cpp", projection))
    oom = next(e for e in exps if e.kind == "oom")
    # 1M cells: RPC1's KV cache (its one layer) fits under the limit, its compute buffer does not
    assert oom.device == "RPC1" and "could not allocate" in oom.title, [e.text() for e in exps]
    assert "24105 MiB free" in oom.detail or "MiB free" in oom.detail
    assert oom.suggestion is not None and oom.suggestion.verified
    print("\n" + "\n".join(e.text() for e in exps))
    assert outcome.pid is not None and not _alive(outcome.pid)


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit (util-linux) is not installed")
def test_host_out_of_memory_under_a_wrapper(qtbot: QtBot, small_models: dict[str, Path],
                                            llama_server: Path) -> None:
    argv = ["-ngl", "0", "-c", "1048576", *FIXED]
    sp = ServerProcess()
    try:
        outcome = _run(qtbot, sp, LaunchConfig(server_args=argv, executable=str(llama_server),
                                               model=str(small_models["llama"]), port=free_port(),
                                               wrapper=["prlimit", "--as=900000000", "--"]))
    finally:
        sp.shutdown(5)
    assert outcome.command is not None and Path(outcome.command.program).name == "prlimit"
    assert outcome.state is ServerState.FAILED and outcome.exit_code == 1
    model = open_model(small_models["llama"])
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 << 30, 64 << 30))
    parsed = parse_server_args(argv, dialect=Dialect.LLAMA_CPP)
    projection = analyse_command(model, devices, parsed.args).projection
    exps = outcome.explain(PlanContext(model, devices, argv, "llama.cpp", projection))
    oom = next(e for e in exps if e.kind == "oom")
    assert oom.device == "CPU" and "KV cache of 1024.00 MiB" in oom.title
    assert oom.suggestion is not None and oom.suggestion.verified and oom.suggestion.change[0] == "-c"
    assert int(oom.suggestion.change[1]) < 1048576


def test_cli_verify_follows_the_default_fit(small_models: dict[str, Path], llama_server: Path, rpc: list[str],
                                            tmp_path: Path) -> None:
    """With --fit left on and a target that leaves each RPC device 15 MiB (an RPC server reports the
    machine's physical memory), llama-server refits the command at start; launch --verify compares
    the buffers with the planner's port of that fit, and they match."""
    phys_mib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // (1024 * 1024)
    target = phys_mib - 15
    model = str(small_models["qwen3moe"])
    r = _cli(model, "--server", str(llama_server), "--verify", "--", "--rpc", ",".join(rpc), "-c", "4096",
             "-fitt", f"{target},{target}", "--no-warmup", tmp_path=tmp_path)
    assert "--fit (on by default) changed the command" in r.stderr, r.stderr[-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    assert "every device matches the projection" in r.stderr
