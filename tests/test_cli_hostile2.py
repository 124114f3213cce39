"""Hostile input against `launch --bench` (a server whose answers are not llama-server's), launch's
number options and the --device keys whose figures the estimate divides by: one clear line naming
the option or the answer, an exit code, never a traceback or a hang; the server we start dies with us."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.support.cli import run_cli

from offload_planner.backend.server_bench import BenchError, measure

QWEN = str(Path(__file__).resolve().parents[1] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf")

# A stand-in llama-server: says its version, listens, and answers /completion as HOSTILE_MODE says
# (the rates of a good answer are its tokens over its time, as llama-server computes them).
SERVER = r'''
import json, os, sys, time, http.server, socketserver
if "--version" in sys.argv or "--help" in sys.argv:
    print("version: 1 (abc)"); sys.exit(0)
open(os.environ["HOSTILE_PID"], "w").write(str(os.getpid()))
mode = os.environ["HOSTILE_MODE"]
def timings(**kw):
    t = {"prompt_n": 512, "prompt_ms": 500.0, "prompt_per_second": 1024.0,
         "predicted_n": 64, "predicted_ms": 1000.0, "predicted_per_second": 64.0}
    t.update(kw)
    return json.dumps({"timings": t})
ANSWERS = {
    "good": lambda: timings(),
    "inf_count": lambda: timings(prompt_n=1e400),
    "deep": lambda: "[" * 100000 + "]" * 100000,
    "rate_not_measured": lambda: timings(prompt_per_second=1e300, prompt_ms=1e-300),
    "count_far_above": lambda: timings(prompt_n=10**15, prompt_ms=10**15 * 1000 / 1024.0),
}
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if mode == "drip":
            self.send_response(200); self.send_header("Content-Length", "100000"); self.end_headers()
            while True:
                self.wfile.write(b" "); self.wfile.flush(); time.sleep(0.2)
        body = ANSWERS[mode]().encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
s = S(("127.0.0.1", 0), H)
print(f"main: server is listening on http://127.0.0.1:{s.server_address[1]}", file=sys.stderr, flush=True)
s.serve_forever()
'''


@pytest.fixture
def server(tmp_path: Path) -> Path:
    exe = tmp_path / "llama-server"
    exe.write_text(f"#!{sys.executable}\n{SERVER}")
    exe.chmod(0o755)
    return exe


run = run_cli


def clean_exit(r: subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    """The exit code, no traceback, and the error line with every fragment; that line."""
    assert r.returncode == code, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr
    line = next((ln for ln in r.stderr.splitlines() if "error" in ln or "failed" in ln), "")
    for f in fragments:
        assert f in line, (f, r.stderr[-1500:])
    return line


def gone(pid_file: Path) -> bool:
    pid = int(pid_file.read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    os.kill(pid, signal.SIGKILL)  # not left running for the next test
    return False


pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="a POSIX script stands in for llama-server")


def bench(server: Path, tmp_path: Path, mode: str, *more: str,
          timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run("launch", QWEN, "--server", str(server), "--no-detect", "--device", "CUDA0=24GiB", "--bench",
               "--no-store", "--quiet", *more, timeout=timeout, HOSTILE_MODE=mode,
               HOSTILE_PID=str(tmp_path / "pid"))


def test_a_good_answer_is_measured(server: Path, tmp_path: Path) -> None:
    """The stand-in's well-formed answer is taken: the hostile cases below fail for their answer."""
    r = bench(server, tmp_path, "good")
    assert "pp    1024.00 t/s measured" in r.stdout, r.stderr[-1500:]
    assert "Traceback" not in r.stderr and gone(tmp_path / "pid")


@pytest.mark.parametrize(("mode", "said"), [
    ("inf_count", "'timings' gives an infinite count of tokens"),  # was an OverflowError traceback
    ("deep", "the answer is not JSON"),  # was a RecursionError traceback
    # printed as a 300-digit rate
    ("rate_not_measured", "'timings' gives prompt_per_second = 1e+300 for 512 tokens"),
    # the estimate walked 10^15 prompt tokens: a hang
    ("count_far_above", "reports 1000000000000000 prompt and 64 generated tokens for a request of 512"),
])
def test_a_hostile_bench_answer_is_one_line(server: Path, tmp_path: Path, mode: str, said: str) -> None:
    start = time.monotonic()
    r = bench(server, tmp_path, mode, timeout=40)
    clean_exit(r, 3, "speed check failed:", said)
    assert time.monotonic() - start < 30
    assert gone(tmp_path / "pid"), "the server outlived launch"


def test_a_dripping_answer_ends_at_the_timeout(server: Path, tmp_path: Path) -> None:
    """A byte every 0.2 s reset the socket's per-read timeout: the check waited for the whole body
    (here 100,000 bytes: 5.5 hours)."""
    proc = subprocess.Popen([str(server)], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HOSTILE_MODE": "drip", "HOSTILE_PID": str(tmp_path / "pid")})
    try:
        assert proc.stderr is not None
        url = proc.stderr.readline().split("listening on ")[1].strip()
        start = time.monotonic()
        with pytest.raises(BenchError, match="did not arrive in time"):
            measure(url, n_vocab=32000, warmup=False, timeout=1.0)
        assert time.monotonic() - start < 4
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(("flag", "value"), [
    ("--timeout", "nan"), ("--timeout", "inf"), ("--timeout", "1e12"), ("--timeout", "-1"),
    ("--stop-timeout", "nan"), ("--stop-timeout", "inf"),  # were tracebacks from Qt's timer
    ("--port", "70000"), ("--port", "-1"),  # the server only 'exited with code 1'
    ("--bench-prompt", "0"), ("--bench-prompt", "-5"), ("--bench-gen", "0"),  # sent as they were
    ("--bench-prompt", "100000000"),  # minutes building the request
])
def test_launch_numbers_are_refused_at_the_flag(server: Path, tmp_path: Path, flag: str, value: str) -> None:
    r = bench(server, tmp_path, "good", f"{flag}={value}", timeout=20)
    clean_exit(r, 2, f"argument {flag}: {value!r}")
    assert not (tmp_path / "pid").exists(), "the server was started"


def test_a_stop_timeout_of_zero_is_still_taken(server: Path, tmp_path: Path) -> None:
    r = bench(server, tmp_path, "good", "--stop-timeout", "0")
    assert "pp    1024.00 t/s measured" in r.stdout, r.stderr[-1500:]
    assert gone(tmp_path / "pid")


def test_an_unclosed_wrapper_quote_is_one_line(server: Path, tmp_path: Path) -> None:
    r = bench(server, tmp_path, "good", "--wrapper", "nice '-n 5", timeout=20)
    clean_exit(r, 2, "--wrapper \"nice '-n 5\"", "No closing quotation")
    assert not (tmp_path / "pid").exists()


@pytest.mark.parametrize("cpu", ["CPU=64GiB,ram=1xDDR5-1", "CPU=64GiB,threads=1,ghz=0.0001"])
def test_a_tiny_cpu_figure_is_estimated_not_divided_by_zero(cpu: str) -> None:
    """The figure rounded to 0 (0.008 GB/s to one decimal): 'ZeroDivisionError: float division by zero'."""
    r = run("plan", QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--device", cpu, "--", "-ngl", "20")
    assert r.returncode == 0 and "speed estimate (" in r.stdout, (r.stdout[-800:], r.stderr[-800:])
    assert "unavailable" not in r.stdout + r.stderr


def test_a_non_ascii_thread_count_names_the_key() -> None:
    r = run("plan", QWEN, "--no-detect", "--device", "CPU=64GiB,threads=²")
    line = clean_exit(r, 2, "--device 'CPU=64GiB,threads=²'", "threads='²': not a count")
    assert "invalid literal" not in line


@pytest.mark.parametrize("args", [["plan", QWEN, "--device=--"], ["plan", QWEN, "--prompt=--", "--no-d"],
                                  ["plan", QWEN, "--backend=--", "--no-d"], ["--device=--"]])
def test_an_option_given_dashes_names_the_option(args: list[str]) -> None:
    """argparse drops the -- of --opt=-- and stores [] unconverted: a traceback later ('list' object has
    no attribute 'partition'); the quick reader took '--' as the value. Both paths now refuse it."""
    flag = next(a for a in args if a.endswith("=--")).partition("=")[0]
    r = run(*args, timeout=20, QT_QPA_PLATFORM="offscreen")
    clean_exit(r, 2, f"argument {flag}: '--' is not a value")


@pytest.mark.parametrize(("args", "flag"), [
    (["plan", QWEN, "--no-detect", "--depth=²"], "--depth"),  # '²' is a digit to isdigit, not to int()
    (["plan", QWEN, "--no-detect", "--depth", "9" * 5000], "--depth"),  # int() refuses 5,000 digits
    (["plan", QWEN, "--no-detect", "--prompt", "9" * 5000], "--prompt"),
])
def test_a_count_int_refuses_is_refused_in_words(args: list[str], flag: str) -> None:
    """argparse said 'invalid _depth value' / 'invalid prompt_len value': the function's name."""
    line = clean_exit(run(*args, timeout=20), 2, f"argument {flag}: {flag} ", "expected a number of tokens")
    assert "invalid" not in line
