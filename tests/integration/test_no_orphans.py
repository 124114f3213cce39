"""A llama-server the planner started dies with the planner, however the planner ends.

The real llama-server on a small synthetic model, started by ``offload-planner launch`` (and by the
window's launcher panel, offscreen) in a subprocess; once it listens the planner is killed with
SIGKILL, or stopped with SIGTERM, SIGHUP or Ctrl-C, and no server may be running 2 s later.  Issue 12
found the server still answering /health 30 s after ``kill -TERM`` of the planner.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil
import pytest
from tests.support.procs import free_port, running, still_running
from tests.support.rpc import rpc_servers

from offload_planner.backend import child_guard

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the death signal is Linux's")

ROOT = Path(__file__).resolve().parents[2]
SERVER_ARGS = ["-c", "512", "-ngl", "0", "--no-warmup"]
LISTENING = "llama-server is listening on"
WINDOW_READY = "server pid"


def _env(tmp_path: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
            "PYTHONPATH": str(ROOT / "gui"), "OFFLOAD_PLANNER_CONFIG_DIR": str(tmp_path / "cfg"),
            "QT_QPA_PLATFORM": "offscreen", "XDG_CONFIG_HOME": str(tmp_path / "xdg")}


@contextlib.contextmanager
def _started(args: list[str], tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A planner process (itself guarded: it dies with this test) logging to a file; whatever the
    test's outcome, it and any llama-server it started are killed by PID afterwards."""
    log = tmp_path / "planner.log"
    with log.open("wb") as out:
        proc = child_guard.popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 env=_env(tmp_path), cwd=tmp_path)
    try:
        yield proc, log
    finally:
        servers = psutil.Process(proc.pid).children() if proc.poll() is None else []
        proc.kill()
        proc.wait(10)
        for p in servers:  # only reached when the test failed: do not leave them running
            with contextlib.suppress(psutil.Error):
                p.kill()


def _wait_for_server(planner: subprocess.Popen[bytes], log: Path, ready: str, timeout: float = 120) -> int:
    """The PID of the llama-server the planner started, once the planner says it listens."""
    deadline = time.monotonic() + timeout
    while ready not in log.read_text(errors="replace"):
        if planner.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the planner did not start the server (exit {planner.poll()}):\n"
                        + log.read_text(errors="replace")[-3000:])
        time.sleep(0.1)
    servers = [p.pid for p in psutil.Process(planner.pid).children() if p.name() == "llama-server"]
    assert len(servers) == 1, log.read_text(errors="replace")[-3000:]
    return servers[0]


def _cli(model: Path, server: Path, extra: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "offload_planner", "launch", str(model), "--server", str(server),
            "--no-detect", "--port", str(free_port()), "--", *SERVER_ARGS, *extra]


def _stop_planner(planner: subprocess.Popen[bytes], sig: int) -> None:
    planner.send_signal(sig)
    try:
        planner.wait(30)
    except subprocess.TimeoutExpired:
        planner.kill()
        pytest.fail(f"the planner ignored {signal.Signals(sig).name} for 30 s")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGINT],
                         ids=lambda s: signal.Signals(s).name)
def test_cli_launch_leaves_no_server(sig: int, small_models: dict[str, Path], llama_server: Path,
                                     tmp_path: Path) -> None:
    with _started(_cli(small_models["llama"], llama_server), tmp_path) as (planner, log):
        server = _wait_for_server(planner, log, LISTENING)
        assert running(server) and os.getpgid(server) == server  # its own group, led by it
        t0 = time.monotonic()
        _stop_planner(planner, sig)
        assert still_running([server], within=max(0.0, 2.0 - (time.monotonic() - t0))) == []
    text = log.read_text(errors="replace")
    if sig != signal.SIGKILL:  # stopped cleanly by the planner, not only by the death signal
        assert f"{signal.Signals(sig).name}: stopping llama-server" in text, text[-3000:]


def test_cli_launch_with_rpc_leaves_no_server(small_models: dict[str, Path], llama_bin_dir: Path,
                                              llama_server: Path, tmp_path: Path) -> None:
    with rpc_servers(llama_bin_dir, 1, tmp_path / "rpc") as endpoints:
        args = _cli(small_models["llama"], llama_server, ["--rpc", endpoints[0]])
        with _started(args, tmp_path) as (planner, log):
            server = _wait_for_server(planner, log, LISTENING)
            _stop_planner(planner, signal.SIGKILL)
            assert still_running([server], within=2.0) == []


WINDOW = textwrap.dedent("""
    import sys
    from PySide6.QtWidgets import QApplication
    from offload_planner.ui.launcher_panel import LauncherPanel

    server, model, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    app = QApplication([])
    panel = LauncherPanel(executable=server)
    panel.set_executable(server)
    panel.set_plan(None, command=["-m", model, *sys.argv[4:]])
    panel.port_spin.setValue(port)
    panel.server.ready.connect(lambda url: print("server pid", panel.server.pid, flush=True))
    panel.server.finished.connect(lambda outcome: app.exit(3))
    panel.launch()
    sys.exit(app.exec())
""")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=lambda s: signal.Signals(s).name)
def test_window_launch_leaves_no_server(sig: int, small_models: dict[str, Path], llama_server: Path,
                                        tmp_path: Path) -> None:
    args = [sys.executable, "-c", WINDOW, str(llama_server), str(small_models["llama"]), str(free_port()),
            *SERVER_ARGS]
    with _started(args, tmp_path) as (window, log):
        server = _wait_for_server(window, log, WINDOW_READY)
        _stop_planner(window, sig)
        assert still_running([server], within=2.0) == []


def _stubborn_backend(tmp_path: Path) -> Path:
    """A "llama-server" that loads forever and ignores SIGTERM."""
    exe = tmp_path / "llama-server"
    exe.write_text(f"#!{sys.executable}\n" + textwrap.dedent("""
        import signal, sys, time
        if sys.argv[1:] in (["--version"], ["--help"]):
            print("version: 1 (fake)")
            sys.exit(0)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("load_tensors: loading model tensors, this can take a while...", flush=True)
        time.sleep(120)
    """))
    exe.chmod(0o755)
    return exe


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT],
                         ids=lambda s: signal.Signals(s).name)
def test_a_signal_while_loading_stops_then_a_second_kills(sig: int, tmp_path: Path) -> None:
    args = [sys.executable, "-m", "offload_planner", "launch", str(tmp_path / "m.gguf"), "--server",
            str(_stubborn_backend(tmp_path)), "--no-detect", "--stop-timeout", "60", "--", "-c", "512"]
    with _started(args, tmp_path) as (planner, log):
        server = _wait_for_server(planner, log, "loading model tensors")
        planner.send_signal(sig)
        time.sleep(1.0)
        assert planner.poll() is None and running(server)  # SIGTERM sent; it ignores it for now
        _stop_planner(planner, sig)  # the second one kills it
        assert planner.returncode == 128 + sig
        assert still_running([server], within=2.0) == []
    text = log.read_text(errors="replace")
    name = signal.Signals(sig).name
    assert f"{name}: stopping llama-server" in text and f"{name} again: killing llama-server" in text, text
