"""ServerProcess with small Python scripts standing in for llama-server: states, progress, readiness
from the log or /health, stop (SIGTERM, then SIGKILL), children killed by PID, failures, flavour
probing, environment and wrapper, incremental decoding."""

from __future__ import annotations

import os
import stat
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from pytestqt.qtbot import QtBot
from tests.support.procs import free_port

from offload_planner.backend import launch
from offload_planner.backend.log_parser import DOTS_SPAN
from offload_planner.backend.runner import LaunchConfig, LaunchOutcome, ServerProcess, ServerState
from offload_planner.core.cmdline import Dialect

LOADER = [
    "0.00.001.000 I srv    load_model: loading model '/m.gguf'",
    "0.00.002.000 I llama_model_loader: loaded meta data with 30 key-value pairs and 50 tensors from /m.gguf",
    "0.00.003.000 I load_tensors: loading model tensors, this can take a while... (load_mode = mmap)",
    "0.00.004.000 I load_tensors:   CPU_Mapped model buffer size =     4.42 MiB",
    "0.00.005.000 I llama_kv_cache:        CPU KV buffer size =     8.00 MiB",
    "0.00.006.000 I sched_reserve:        CPU compute buffer size =    21.07 MiB",
    "0.00.007.000 I srv  llama_server: model loaded",
]


def _script(tmp_path: Path, name: str, body: str) -> Path:
    p = tmp_path / name
    p.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p


def _server_script(tmp_path: Path, *, listen: bool = True, ignore_term: bool = False, child: bool = False,
                   exit_code: int | None = None, extra: str = "") -> Path:
    return _script(tmp_path, "fake-server", f"""
        import os, signal, subprocess, sys, time
        if {ignore_term!r}:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if {child!r}:
            kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            print(f"child {{kid.pid}}", flush=True)
        for line in {LOADER!r}:
            print(line, flush=True)
            time.sleep(0.01)
        {extra}
        if {exit_code!r} is not None:
            sys.exit({exit_code!r})
        if {listen!r}:
            print("0.00.008.000 I srv  llama_server: listening on http://127.0.0.1:9", flush=True)
        time.sleep(120)
    """)


def _config(exe: Path, **kw: object) -> LaunchConfig:
    base: dict[str, object] = dict(executable=str(exe), dialect=Dialect.LLAMA_CPP, host=None, port=None,
                                   verbose_log=False, health_check=False, stop_timeout=5.0)
    base.update(kw)
    return LaunchConfig(**base)  # type: ignore[arg-type]


def _gone(pid: int | None) -> bool:
    if pid is None:
        return True
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def server(qtbot: QtBot) -> ServerProcess:
    sp = ServerProcess()
    yield sp  # type: ignore[misc]
    sp.shutdown(2.0)
    assert not sp.state.active or sp.state is ServerState.IDLE


def _finish(qtbot: QtBot, sp: ServerProcess, timeout: int = 20_000) -> LaunchOutcome:
    with qtbot.waitSignal(sp.finished, timeout=timeout) as blocker:
        pass
    outcome = blocker.args[0]
    assert isinstance(outcome, LaunchOutcome)
    return outcome


def test_states_progress_lines_and_stop(qtbot: QtBot, server: ServerProcess, tmp_path: Path) -> None:
    states: list[str] = []
    progress: list[tuple[float, str]] = []
    lines: list[str] = []
    server.stateChanged.connect(states.append)
    server.progressChanged.connect(lambda f, label: progress.append((f, label)))
    server.linesReceived.connect(lines.extend)
    with qtbot.waitSignal(server.ready, timeout=20_000) as ready:
        assert server.start(_config(_server_script(tmp_path)))
    assert ready.args == ["http://127.0.0.1:9"] and server.url == "http://127.0.0.1:9"
    assert server.state is ServerState.RUNNING
    assert lines[: len(LOADER)] == LOADER
    fractions = [f for f, _ in progress]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(fractions) >= 5
    assert server.report.by_device() == {"CPU": {"model": 4.42, "kv": 8.0, "compute": 21.07}}
    assert not server.start(_config(_server_script(tmp_path)))  # one at a time
    pid = server.pid
    server.stop()
    outcome = _finish(qtbot, server)
    assert states == ["Starting", "Loading", "Running", "Stopping", "Exited"]
    assert outcome.ok and outcome.stopped and not outcome.killed and outcome.reached_running
    assert outcome.explain() == []
    assert _gone(pid)


def test_kill_after_timeout_and_children_are_killed(qtbot: QtBot, server: ServerProcess,
                                                    tmp_path: Path) -> None:
    exe = _server_script(tmp_path, ignore_term=True, child=True)
    with qtbot.waitSignal(server.ready, timeout=20_000):
        server.start(_config(exe, stop_timeout=0.5))
    kid = int(next(ln for ln in server.tail if ln.startswith("child ")).split()[1])
    assert psutil.pid_exists(kid)
    pid = server.pid
    t0 = time.monotonic()
    server.stop()
    outcome = _finish(qtbot, server)
    assert outcome.killed and outcome.stopped and outcome.state is ServerState.EXITED
    assert 0.4 < time.monotonic() - t0 < 5
    assert _gone(pid)
    qtbot.waitUntil(lambda: _gone(kid), timeout=3000)  # SIGKILL by PID; delivery takes a moment


def test_exit_before_listening_is_a_failure_with_an_explanation(qtbot: QtBot, server: ServerProcess,
                                                               tmp_path: Path) -> None:
    exe = _server_script(tmp_path, exit_code=1, extra='print("error: invalid argument: --bogus", flush=True)')
    server.start(_config(exe))
    outcome = _finish(qtbot, server)
    assert outcome.state is ServerState.FAILED and outcome.exit_code == 1 and not outcome.crashed
    assert not outcome.reached_running
    exps = outcome.explain()
    assert exps[0].kind == "bad-flag" and "--bogus" in exps[0].title


def test_crash_by_signal(qtbot: QtBot, server: ServerProcess, tmp_path: Path) -> None:
    exe = _server_script(tmp_path, extra="os.kill(os.getpid(), signal.SIGSEGV)")
    server.start(_config(exe))
    outcome = _finish(qtbot, server)
    assert outcome.state is ServerState.FAILED and outcome.crashed
    assert outcome.explain()[0].kind == "crash" and "signal 11" in outcome.explain()[0].title


def test_missing_or_unrunnable_executable(qtbot: QtBot, server: ServerProcess, tmp_path: Path) -> None:
    states: list[str] = []
    server.stateChanged.connect(states.append)
    server.start(_config(tmp_path / "no-such-server"))
    assert server.state is ServerState.STARTING  # the failure arrives from the event loop
    outcome = _finish(qtbot, server)
    assert states == ["Starting", "Failed"]
    assert outcome.state is ServerState.FAILED and outcome.start_error
    assert "not found" in outcome.start_error and outcome.explain()[0].kind == "start"
    plain = tmp_path / "llama-server"
    plain.write_text("not a program")
    plain.chmod(0o644)
    server.start(_config(plain, wrapper=[str(tmp_path / "missing-wrapper")]))
    outcome = _finish(qtbot, server)
    assert outcome.state is ServerState.FAILED and outcome.start_error


def test_running_once_health_answers(qtbot: QtBot, server: ServerProcess, tmp_path: Path) -> None:
    exe = _script(tmp_path, "http-server", """
        import sys, time
        from http.server import BaseHTTPRequestHandler, HTTPServer
        port = int(sys.argv[sys.argv.index("--port") + 1])
        t0 = time.monotonic()
        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                ok = self.path == "/health" and time.monotonic() - t0 > 0.6
                self.send_response(200 if ok else 503)
                self.end_headers()
                self.wfile.write(b"{}")
            def log_message(self, *a):
                pass
        print("a server that never says where it listens", flush=True)
        HTTPServer(("127.0.0.1", port), H).serve_forever()
    """)
    port = free_port()
    health: list[bool] = []
    server.healthChanged.connect(health.append)
    with qtbot.waitSignal(server.ready, timeout=20_000) as ready:
        server.start(_config(exe, host="127.0.0.1", port=port, health_check=True))
    assert ready.args == [f"http://127.0.0.1:{port}"]
    qtbot.waitUntil(lambda: health == [True], timeout=5000)
    server.stop()
    assert _finish(qtbot, server).ok


def test_environment_wrapper_and_added_arguments(qtbot: QtBot, server: ServerProcess, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REMOVE_ME", "1")
    exe = _script(tmp_path, "env-server", """
        import os, sys
        print("args", " ".join(sys.argv[1:]), flush=True)
        for k in ("CUDA_VISIBLE_DEVICES", "GGML_OP_OFFLOAD_MIN_BATCH", "REMOVE_ME", "WRAPPED"):
            print(k, os.environ.get(k, "<unset>"), flush=True)
    """)
    wrapper = _script(tmp_path, "wrap", """
        import os, sys
        os.environ["WRAPPED"] = sys.argv[1]
        os.execv(sys.argv[2], sys.argv[2:])
    """)
    env: dict[str, str | None] = {"CUDA_VISIBLE_DEVICES": "1,0", "GGML_OP_OFFLOAD_MIN_BATCH": "64",
                                  "REMOVE_ME": None}
    cfg = _config(exe, env=env,
                  wrapper=[str(wrapper), "numa"], server_args=["-c", "4096"], model="/m.gguf",
                  host="127.0.0.1", port=8123, verbose_log=True)
    server.start(cfg)
    outcome = _finish(qtbot, server)
    assert outcome.state is ServerState.EXITED and outcome.exit_code == 0
    assert outcome.tail == [
        "args -c 4096 -m /m.gguf --host 127.0.0.1 --port 8123 -lv 4",
        "CUDA_VISIBLE_DEVICES 1,0", "GGML_OP_OFFLOAD_MIN_BATCH 64", "REMOVE_ME <unset>", "WRAPPED numa",
    ]
    assert outcome.command is not None and outcome.command.argv[:3] == [str(wrapper), "numa", str(exe)]


def test_flavour_is_probed_then_cached(qtbot: QtBot, server: ServerProcess, tmp_path: Path) -> None:
    count = tmp_path / "probes"
    exe = _script(tmp_path, "ik-server", f"""
        import sys
        if sys.argv[1:] in (["--version"], ["--help"]):
            open({str(count)!r}, "a").write("x")
            print("version: 3953 (8337e4cd)" if sys.argv[1] == "--version" else "  -mla, --mla-use N")
            sys.exit(0)
        print("args", " ".join(sys.argv[1:]), flush=True)
    """)
    notices: list[str] = []
    server.notice.connect(notices.append)
    server.start(_config(exe, dialect=None, verbose_log=True))
    outcome = _finish(qtbot, server)
    assert server.dialect is Dialect.IK and outcome.tail == ["args "]  # ik logs buffers without -lv 4
    assert any("ik_llama.cpp" in n and "8337e4cd" in n for n in notices)
    server.start(_config(exe, dialect=None))
    _finish(qtbot, server)
    assert count.read_text() == "xx" and launch.cached_dialect(str(exe)) is not None


def test_progress_dots_and_split_utf8(qtbot: QtBot, server: ServerProcess, tmp_path: Path) -> None:
    exe = _script(tmp_path, "dots", """
        import sys, time
        out = sys.stdout.buffer
        out.write(b"0.00.003.000 I load_tensors: loading model tensors, this can take a while...\\n")
        out.write(b"llama_model_load: "); out.flush()
        for _ in range(50):
            out.write(b"."); out.flush()
        time.sleep(0.3)
        out.write(b"\\ncaf\\xc3"); out.flush(); time.sleep(0.1)
        out.write(b"\\xa9 \\xff done\\r\\n"); out.flush()
        out.write(b"no newline at the end"); out.flush()
    """)
    progress: list[float] = []
    server.progressChanged.connect(lambda f, label: progress.append(f))
    server.start(_config(exe))
    outcome = _finish(qtbot, server)
    lo, hi = DOTS_SPAN
    assert any(abs(p - (lo + (hi - lo) * 0.5)) < 1e-9 for p in progress)
    assert outcome.tail[-3:] == ["llama_model_load: " + "." * 50, "café \\xff done", "no newline at the end"]


def test_shutdown_blocks_until_nothing_is_left(qtbot: QtBot, tmp_path: Path) -> None:
    sp = ServerProcess()
    with qtbot.waitSignal(sp.ready, timeout=20_000):
        sp.start(_config(_server_script(tmp_path, ignore_term=True), stop_timeout=0.3))
    pid = sp.pid
    sp.shutdown()
    assert _gone(pid) and sp.state is ServerState.EXITED


def test_emits_from_python_do_not_exhaust_bool_references(tmp_path: Path) -> None:
    """PySide6 6.12's SignalInstance.emit returns True (and void calls None) without a reference; on
    Python 3.11 a few thousand would end in "Fatal Python error: bool_dealloc".  Importing the runner
    applies the guard."""
    import subprocess

    code = textwrap.dedent("""
        import offload_planner.backend.runner
        from PySide6.QtCore import QCoreApplication, QObject, Signal
        class A(QObject):
            s = Signal(list)
        app = QCoreApplication([])
        a = A()
        a.s.connect(lambda x: None)
        for _ in range(20000):
            a.s.emit([1])
            a.setObjectName("void call")
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
