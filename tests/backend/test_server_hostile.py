"""A program given as llama-server that misbehaves (closes its output and never exits, leaves children
behind, ignores SIGTERM): the planner reports it in one line within its time limit and leaves no
process of it running."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from pytestqt.qtbot import QtBot
from tests.support.procs import still_running

from offload_planner.backend import child_guard

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX scripts stand in for llama-server")


def script(tmp_path: Path, name: str, body: str) -> Path:
    exe = tmp_path / name
    exe.write_text(f"#!{sys.executable}\n{body}")
    exe.chmod(0o755)
    return exe


def test_a_program_that_closes_its_output_and_stays_is_timed_out(tmp_path: Path) -> None:
    """Its --version closed stdout/stderr and slept: the reader saw the end of its output and the
    planner waited for its exit without a limit (launch hung for ever)."""
    pid = tmp_path / "pid"
    exe = script(tmp_path, "closer", f"import os, time\nopen({str(pid)!r}, 'w').write(str(os.getpid()))\n"
                                     "os.close(1); os.close(2)\ntime.sleep(120)\n")
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        child_guard.output_of([str(exe), "--version"], timeout=2)
    assert time.monotonic() - t0 < 6
    assert still_running([int(pid.read_text())], within=2.0) == []


def test_a_child_left_behind_without_the_output_is_ended(tmp_path: Path) -> None:
    """A --version that answers and exits, leaving a child that let go of its output: the answer is
    read, and the child (in the program's process group) is ended with it."""
    pid = tmp_path / "pid"
    child = f"import os, time; open({str(pid)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    exe = script(tmp_path, "leaver",
                 "import subprocess, sys, time\n"
                 f"subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.DEVNULL,"
                 " stderr=subprocess.DEVNULL)\n"
                 f"while not __import__('os').path.exists({str(pid)!r}): time.sleep(0.01)\n"
                 "print('version: 1 (abc)')\n")
    assert child_guard.output_of([str(exe), "--version"], timeout=20) == "version: 1 (abc)\n"
    assert still_running([int(pid.read_text())], within=2.0) == []


def test_a_listening_address_that_is_no_url_fails_the_bench_in_one_line() -> None:
    """The URL comes from the server's log ('listening on http://[[[:9'): urllib's ValueError escaped
    the check's thread as a traceback and the check 'ended without a result'."""
    from offload_planner.backend.server_bench import BenchError, measure

    t0 = time.monotonic()
    with pytest.raises(BenchError, match=r"http://\[\[\[:9/completion: not an address .*Invalid IPv6 URL"):
        measure("http://[[[:9", n_vocab=1000, timeout=5)
    assert time.monotonic() - t0 < 1


QWEN = str(Path(__file__).resolve().parents[2] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
#: says it listens, then exits 0 on its own
LISTENS_THEN_EXITS = ("import sys\nif '--version' in sys.argv or '--help' in sys.argv:\n"
                      "    print('version: 1 (abc)'); sys.exit(0)\n"
                      "print('main: server is listening on http://127.0.0.1:1', flush=True)\n")


@pytest.mark.parametrize(("extra", "code", "said"), [
    ([], 1, []),  # 1: no buffer sizes to compare, as before
    (["--bench", "--no-store"], 3,
     ["speed check failed: llama-server ended before it answered: nothing measured"]),
])
def test_a_server_that_exits_on_its_own_after_listening_is_said(tmp_path: Path, extra: list[str], code: int,
                                                               said: list[str]) -> None:
    """It ended and launch exited without a word (with --bench after 'measuring speed', status 1)."""
    from tests.support.cli import run_cli

    exe = script(tmp_path, "llama-server", LISTENS_THEN_EXITS)
    t0 = time.monotonic()
    r = run_cli("launch", QWEN, "--server", str(exe), "--no-detect", "--quiet", "--no-verbose-log", *extra,
                "--", "-c", "512", timeout=60)
    assert time.monotonic() - t0 < 30 and "Traceback" not in r.stderr, r.stderr[-2000:]
    for line in [*said, "llama-server exited on its own after it listened (exit code 0)"]:
        assert line in r.stderr, r.stderr[-2000:]
    assert r.returncode == code, r.stderr[-2000:]


#: never listens, ignores SIGTERM, and starts two children that ignore it too, one in a session of its
#: own (outside the server's process group)
#: (SIGTERM is ignored first thing: a loaded machine's SIGTERM after --timeout 2 s could come before it)
STUBBORN = ("import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "import os, subprocess, sys, time\n"
            "if '--version' in sys.argv or '--help' in sys.argv:\n"
            "    print('version: 1 (abc)'); sys.exit(0)\n"
            "kid = 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)'\n"
            "a = subprocess.Popen([sys.executable, '-c', kid])\n"
            "b = subprocess.Popen([sys.executable, '-c', kid], start_new_session=True)\n"
            "open(os.environ['HOSTILE_PIDS'], 'w').write(f'{os.getpid()} {a.pid} {b.pid}')\n"
            "sys.stdout.buffer.write(b'\\xff\\xfe \\x1b[31m' + b'A' * 200000 + b'\\n'); sys.stdout.flush()\n"
            "time.sleep(120)\n")


def test_a_server_that_ignores_sigterm_is_killed_with_its_children_and_said(tmp_path: Path) -> None:
    """After --timeout it was SIGKILLed as it should be, but launch said 'llama-server ended before it
    listened (exit code 9)': 9 was SIGKILL's number, not an exit code of the server."""
    from tests.support.cli import run_cli

    exe = script(tmp_path, "llama-server", STUBBORN)
    pids = tmp_path / "pids"
    t0 = time.monotonic()
    r = run_cli("launch", QWEN, "--server", str(exe), "--no-detect", "--timeout", "2", "--stop-timeout", "1",
                "--", "-c", "512", timeout=60, HOSTILE_PIDS=str(pids))
    assert time.monotonic() - t0 < 30 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.returncode == 3
    assert "llama-server did not listen within 2 s; stopping it" in r.stderr
    assert "llama-server ignored SIGTERM for 1 s: killed (SIGKILL)" in r.stderr
    assert "exit code 9" not in r.stderr, r.stderr[-2000:]
    assert "\\xff\\xfe \\x1b[31mAAAA" in r.stdout and len(max(r.stdout.splitlines(), key=len)) < 5000
    assert still_running([int(p) for p in pids.read_text().split()], within=3.0) == []


#: never listens; on SIGTERM (which it outlives) starts forking children in sessions of their own, one
#: every millisecond or so, each living 50 ms, and any that finds its parent gone writes its PID down
FORKER = ("import signal; asked = []; signal.signal(signal.SIGTERM, lambda *_: asked.append(1))\n"
          "import os, sys, time\n"
          "if '--version' in sys.argv or '--help' in sys.argv:\n"
          "    print('version: 1 (abc)'); sys.exit(0)\n"
          "me, out = os.getpid(), os.environ['HOSTILE_ESCAPED']\n"
          "while not asked: time.sleep(0.01)\n"
          "while True:\n"
          "    if os.fork() == 0:\n"
          "        os.setsid()\n"
          "        for _ in range(50):\n"
          "            if os.getppid() != me:\n"
          "                open(out, 'a').write(f'{os.getpid()}\\n'); os._exit(0)\n"
          "            time.sleep(0.001)\n"
          "        os._exit(0)\n"
          "    while True:\n"
          "        try:\n"
          "            if os.waitpid(-1, os.WNOHANG)[0] == 0: break\n"
          "        except ChildProcessError: break\n"
          "    time.sleep(0.001)\n")


def test_a_server_forking_while_it_is_killed_leaves_no_child(tmp_path: Path) -> None:
    """Its children were listed, then it was SIGKILLed: one forked in between (in a session of its own,
    outside the server's process group) was never seen and outlived launch. Now the server and its
    children are stopped (SIGSTOP) before they are listed, so none is born between the list and the
    SIGKILL, nor notices its parent's death before its own."""
    from tests.support.cli import run_cli

    exe = script(tmp_path, "llama-server", FORKER)
    escaped = tmp_path / "escaped"
    t0 = time.monotonic()
    r = run_cli("launch", QWEN, "--server", str(exe), "--no-detect", "--timeout", "1", "--stop-timeout",
                "0.5", "--quiet", "--", "-c", "512", timeout=60, HOSTILE_ESCAPED=str(escaped))
    assert time.monotonic() - t0 < 30 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "llama-server ignored SIGTERM for 0.5 s: killed (SIGKILL)" in r.stderr, r.stderr[-2000:]
    time.sleep(0.5)  # an unseen child notices its parent's death within 1 ms
    assert not escaped.exists(), escaped.read_text()


#: answers --version with 64 MiB, a MiB every 10 ms, then waits
FLOOD = ("import sys, time\n"
         "if '--version' in sys.argv:\n"
         "    for _ in range(64):\n"
         "        sys.stdout.write('y' * (1 << 20)); sys.stdout.flush(); time.sleep(0.01)\n"
         "time.sleep(120)\n")


def test_the_windows_probe_of_a_flooding_program_stops_at_the_limit(qtbot: QtBot, tmp_path: Path) -> None:
    """The Launch tab's --version probe (a QProcess) kept all a program printed until its 30 s
    timeout (``yes``: gigabytes), then started the program as llama-server anyway; now the launch
    fails at child_guard.OUTPUT_LIMIT bytes, saying so."""
    from offload_planner.backend.runner import LaunchConfig, LaunchOutcome, ServerProcess, ServerState

    exe = script(tmp_path, "llama-server", FLOOD)
    sp = ServerProcess()
    notices: list[str] = []
    outcomes: list[LaunchOutcome] = []
    sp.notice.connect(notices.append)
    sp.finished.connect(outcomes.append)
    t0 = time.monotonic()
    sp.start(LaunchConfig(executable=str(exe), dialect=None, host=None, health_check=False))
    qtbot.waitUntil(lambda: bool(outcomes), timeout=20_000)
    assert time.monotonic() - t0 < 10
    assert outcomes[0].state is ServerState.FAILED and outcomes[0].pid is None  # never started
    assert any(f"cannot run {exe}: printed more than 4 MiB for --version" in n for n in notices), notices
    sp.shutdown(2.0)


@pytest.mark.parametrize(("kind", "line"), [
    ("buffers", "load_tensors: CUDA{n} model buffer size = {i}.00 MiB"),
    ("breakdown", "common_memory_breakdown_print: |   - Host{i}  |  1 = 2 + (3 = 4 + 5 + 6) + 7 |"),
    ("info", "print_info: key{i} = {i}"),
    ("oom", "ggml_backend_cuda_buffer_type_alloc_buffer: allocating {i}.00 MiB on device 0: "
            "cudaMalloc failed: out of memory"),
    ("devices", "llama_model_load_from_file_impl: using device CUDA{i} (NVIDIA X) (0000:01:00.0) - "
                "1000 MiB free"),
])
def test_a_log_that_repeats_one_kind_of_line_keeps_a_bounded_report(kind: str, line: str) -> None:
    """A server printing buffer, device, print_info or allocation-failure lines in a loop grew the
    report without end, and distinct memory breakdown rows cost a copy of the table each: 20,000 took
    5 s (quadratic). Each kind now keeps at most what a real load logs many times over."""
    from offload_planner.backend.log_parser import LogAccumulator

    acc = LogAccumulator()
    t0 = time.perf_counter()
    for i in range(30_000):
        acc.feed(line.format(i=i, n=i % 8))
    assert time.perf_counter() - t0 < 3
    got = getattr(acc.report, kind)
    assert 0 < len(got) <= 10_000  # a real load: dozens


#: never says it listens; answers /health (port from --port) with MODE: 'flood' streams 300 MB of body
#: per request, 'drip' sends the headers then a byte a second; counts the requests in HOSTILE_COUNT
HEALTH_SERVER = ("import os, socket, sys, threading, time\n"
                 "if '--version' in sys.argv or '--help' in sys.argv:\n"
                 "    print('version: 1 (abc)'); sys.exit(0)\n"
                 "port, mode = int(sys.argv[sys.argv.index('--port') + 1]), os.environ['HOSTILE_MODE']\n"
                 "srv = socket.create_server(('127.0.0.1', port))\n"
                 "def serve(c):\n"
                 "    try:\n"
                 "        c.recv(65536)\n"
                 "        open(os.environ['HOSTILE_COUNT'], 'a').write('.')\n"
                 "        c.sendall(b'HTTP/1.1 200 OK\\r\\nContent-Type: text/plain\\r\\n\\r\\n')\n"
                 "        for _ in range(300 if mode == 'flood' else 60):\n"
                 "            c.sendall(b'x' * (1 << 20) if mode == 'flood' else b'x')\n"
                 "            if mode == 'drip': time.sleep(1)\n"
                 "    except OSError: pass\n"
                 "def accept():\n"
                 "    while True:\n"
                 "        threading.Thread(target=serve, args=(srv.accept()[0],), daemon=True).start()\n"
                 "threading.Thread(target=accept, daemon=True).start()\n"
                 "print('loading', flush=True)\n"
                 "time.sleep(60)\n")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _health_run(qtbot: QtBot, tmp_path: Path, mode: str, seconds: float) -> tuple[int, int]:
    """(growth of this process's resident memory in bytes, /health requests made) over ``seconds``
    from the first request."""
    import psutil

    from offload_planner.backend.runner import LaunchConfig, ServerProcess

    exe = script(tmp_path, "llama-server", HEALTH_SERVER)
    count = tmp_path / "count"
    os.environ.update(HOSTILE_MODE=mode, HOSTILE_COUNT=str(count))
    sp = ServerProcess()
    try:
        sp.start(LaunchConfig(executable=str(exe), dialect=None, port=_free_port(), stop_timeout=1))
        qtbot.waitUntil(count.exists, timeout=30_000)  # a loaded machine starts the stand-in slowly
        before = psutil.Process().memory_info().rss
        qtbot.wait(int(seconds * 1000))
        grown = psutil.Process().memory_info().rss - before
    finally:
        sp.shutdown(2.0)
        del os.environ["HOSTILE_MODE"], os.environ["HOSTILE_COUNT"]
    return grown, len(count.read_text())


def test_a_health_answer_without_end_is_not_kept(qtbot: QtBot, tmp_path: Path) -> None:
    """Qt kept all of /health's body: a server streaming one grew the planner by 1 GB/s (5 GB in 10 s
    of `launch`); the reply keeps 64 KiB and waits, then times out."""
    grown, _asked = _health_run(qtbot, tmp_path, "flood", 4.0)
    assert grown < 50 << 20, grown  # the old code: 197 MB in these 4 s


def test_a_dripping_health_answer_is_given_up_and_asked_again(qtbot: QtBot, tmp_path: Path) -> None:
    """A byte a second never hit the transfer timeout, and no /health was asked while it lasted (60 s
    here); each request now ends after 5 s."""
    _grown, asked = _health_run(qtbot, tmp_path, "drip", 7.5)
    assert asked >= 2, asked
