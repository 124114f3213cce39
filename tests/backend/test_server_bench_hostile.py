"""`launch --bench` and the window's Bench talk HTTP to the server they started: an answer that is not
HTTP, headers that never end or trickle in, a server that wants the --api-key. Each fails in one
BenchError (no traceback from http.client) by its deadline, or works."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from offload_planner.backend.server_bench import BenchError, measure

QWEN = str(Path(__file__).resolve().parents[2] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
GOOD = (b'{"timings": {"prompt_n": 512, "prompt_ms": 500.0, "prompt_per_second": 1024.0, '
        b'"predicted_n": 64, "predicted_ms": 1000.0, "predicted_per_second": 64.0}}')


def _ok(body: bytes = GOOD) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        piece = conn.recv(65536)
        if not piece:
            return data
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next((int(ln.split(b":")[1]) for ln in lines if ln.lower().startswith(b"content-length")), 0)
    while len(body) < length:
        body += conn.recv(65536)
    return head


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[socket.socket, bytes], None]], str]]:
    """Start a loopback TCP server answering each connection with ``answer(conn, request_head)``."""
    socks: list[socket.socket] = []
    stop = threading.Event()

    def start(answer: Callable[[socket.socket, bytes], None]) -> str:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen()
        s.settimeout(0.2)
        socks.append(s)

        def loop() -> None:
            while not stop.is_set():
                try:
                    conn, _ = s.accept()
                except OSError:
                    continue
                with conn, contextlib.suppress(OSError):
                    answer(conn, _read_request(conn))

        threading.Thread(target=loop, daemon=True).start()
        return f"http://127.0.0.1:{s.getsockname()[1]}"

    yield start
    stop.set()
    for s in socks:
        s.close()


def _trickle(data: bytes, pause: float) -> Callable[[socket.socket, bytes], None]:
    def answer(conn: socket.socket, _head: bytes) -> None:
        for b in data:
            conn.sendall(bytes([b]))
            time.sleep(pause)
    return answer


@pytest.mark.parametrize(("answer", "said"), [
    (b"HELLO\r\n\r\n", "not an HTTP answer"),  # http.client.BadStatusLine: a traceback in the bench thread
    (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70000 + b"\r\n\r\n", "not an HTTP answer"),  # LineTooLong
    (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 150 + b"\r\n", "not an HTTP answer"),  # more than 100 headers
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "not an HTTP answer"),  # bad chunk
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{", "no answer to the benchmark request"),  # cut short
], ids=["status", "long-header", "many-headers", "bad-chunk", "cut-short"])
def test_an_answer_that_is_not_http_is_one_bench_error(serve: Callable[..., str], answer: bytes,
                                                       said: str) -> None:
    url = serve(lambda conn, _head: conn.sendall(answer))
    with pytest.raises(BenchError, match=said):
        measure(url, n_vocab=32000, warmup=False, timeout=5)


def test_headers_trickling_in_end_at_the_deadline(serve: Callable[..., str]) -> None:
    """A byte every 0.1 s of the status line and headers reset the socket's per-read timeout: the bench
    waited for as long as the server kept sending (http.client reads headers without a deadline)."""
    url = serve(_trickle(b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"y" * 300 + b"\r\n\r\n", 0.1))
    start = time.monotonic()
    with pytest.raises(BenchError, match=r"did not arrive in time"):
        measure(url, n_vocab=32000, warmup=False, timeout=1.5)
    assert time.monotonic() - start < 4


def test_the_api_key_is_sent_as_a_bearer_token(serve: Callable[..., str]) -> None:
    """A server launched with --api-key answers 401 to a request without it (llama-server: 'Invalid API
    Key'): the bench sends the key the command gave."""
    def answer(conn: socket.socket, head: bytes) -> None:
        if b"\r\nauthorization: bearer s3cret" in head.lower():
            conn.sendall(_ok())
        else:
            body = b'{"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}'
            conn.sendall(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    url = serve(answer)
    with pytest.raises(BenchError, match=r"HTTP 401: Invalid API Key"):
        measure(url, n_vocab=32000, warmup=False, timeout=5)
    assert measure(url, n_vocab=32000, warmup=False, timeout=5, api_key="s3cret").pp_tps == 1024.0


def test_the_key_comes_from_the_command(tmp_path: Path) -> None:
    from offload_planner.backend.server_bench import api_key_of
    from offload_planner.core.cmdline import Dialect, parse_server_args

    def key(*args: str) -> str | None:
        return api_key_of(parse_server_args(list(args), dialect=Dialect.LLAMA_CPP))

    keys = tmp_path / "keys"
    keys.write_text("\n# a comment, as arg.cpp skips it\nk-from-file\nother\n")
    assert key("--api-key", "k1,k2") == "k1" and key("-c", "512") is None
    assert key("--api-key", ',"k,3",k4') == "k,3"  # arg.cpp's parse_csv_row: empty fields skipped, quotes
    assert key("--api-key-file", str(keys)) == "k-from-file"
    assert key("--api-key-file", str(tmp_path / "none")) is None


def test_the_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-server reads --api-key from LLAMA_API_KEY (arg.cpp), which the launched server inherits."""
    from offload_planner.backend.server_bench import api_key_of
    from offload_planner.core.cmdline import Dialect, parse_server_args

    parsed = parse_server_args(["-c", "512"], dialect=Dialect.LLAMA_CPP, env={"LLAMA_API_KEY": "env-k"})
    assert api_key_of(parsed) == "env-k"


#: A stand-in llama-server for `launch --bench`: it answers /completion only with the --api-key it was
#: given (401 as llama-server words it otherwise)
KEYED = r'''
import json, os, sys, http.server, socketserver
if "--version" in sys.argv or "--help" in sys.argv:
    print("version: 1 (abc)"); sys.exit(0)
key = sys.argv[sys.argv.index("--api-key") + 1].split(",")[0]
GOOD = {"timings": {"prompt_n": 512, "prompt_ms": 500.0, "prompt_per_second": 1024.0,
                    "predicted_n": 64, "predicted_ms": 1000.0, "predicted_per_second": 64.0}}
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        ok = self.headers.get("Authorization") == f"Bearer {key}"
        body = json.dumps(GOOD if ok else {"error": {"code": 401, "message": "Invalid API Key",
                                                     "type": "authentication_error"}}).encode()
        self.send_response(200 if ok else 401); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
s = S(("127.0.0.1", 0), H)
print(f"main: server is listening on http://127.0.0.1:{s.server_address[1]}", file=sys.stderr, flush=True)
s.serve_forever()
'''


@pytest.mark.skipif(sys.platform == "win32", reason="a POSIX script stands in for llama-server")
def test_launch_bench_on_a_server_with_an_api_key_measures(tmp_path: Path) -> None:
    """It failed: 'llama-server refused the benchmark request (HTTP 401: Invalid API Key)'."""
    from tests.support.cli import run_cli

    exe = tmp_path / "llama-server"
    exe.write_text(f"#!{sys.executable}\n{KEYED}")
    exe.chmod(0o755)
    r = run_cli("launch", QWEN, "--server", str(exe), "--no-detect", "--device", "CUDA0=24GiB", "--bench",
                "--no-store", "--quiet", "--", "--api-key", "s3cret-k,other", timeout=60,
                XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    assert "pp    1024.00 t/s measured" in r.stdout, r.stderr[-1500:]
    assert "s3cret" not in r.stdout + r.stderr


def test_launch_bench_with_an_api_key_on_the_real_server(llama_server: Path, small_models: dict[str, Path],
                                                        tmp_path: Path) -> None:
    """The pinned llama-server with --api-key answers /completion only with the key (401 'Invalid API
    Key' without it): the bench sends it, and prints nothing of it."""
    from tests.support.cli import run_cli
    from tests.support.procs import free_port

    r = run_cli("launch", str(small_models["qwen3moe"]), "--no-detect", "--server", str(llama_server),
                "--port", str(free_port()), "--quiet", "--bench", "--no-store", "--bench-prompt", "64",
                "--bench-gen", "8", "--", "--api-key", "s3cret-k",
                "-c", "1024", "-np", "1", "-fit", "off", timeout=180, XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "t/s measured" in r.stdout and "s3cret" not in r.stdout + r.stderr


#: A stand-in that logs a line a model's metadata can put in llama-server's log (the loader prints every
#: key name unshortened at -lv 4: "llama_model_loader: - kv   3: <key> str = ..."), naming another host
FORGED = r'''
import os, sys, time
if "--version" in sys.argv or "--help" in sys.argv:
    print("version: 1 (abc)"); sys.exit(0)
print("llama_model_loader: - kv   3: x listening on " + os.environ["HOSTILE_URL"] + " str = y", flush=True)
time.sleep(20)
'''


@pytest.mark.skipif(sys.platform == "win32", reason="a POSIX script stands in for llama-server")
def test_a_listening_line_from_the_models_metadata_sends_nothing_elsewhere(tmp_path: Path,
                                                                         serve: Callable[..., str]) -> None:
    """The URL was taken from any log line saying 'listening on URL': a GGUF key naming another host
    made launch --bench post its request there, the --api-key as its bearer token with it (and the
    window's Open web UI open that URL). The host is now the one launched with."""
    from tests.support.cli import run_cli

    heads: list[bytes] = []
    s = socket.socket()
    s.bind(("127.0.0.2", 0))  # another loopback address: "another host" that the test can watch
    s.listen()
    s.settimeout(0.2)
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                conn, _ = s.accept()
            except OSError:
                continue
            with conn:
                heads.append(_read_request(conn))

    threading.Thread(target=watch, daemon=True).start()
    exe = tmp_path / "llama-server"
    exe.write_text(f"#!{sys.executable}\n{FORGED}")
    exe.chmod(0o755)
    try:
        r = run_cli("launch", QWEN, "--server", str(exe), "--no-detect", "--device", "CUDA0=24GiB", "--bench",
                    "--no-store", "--timeout", "10", "--", "--api-key", "s3cret-k", timeout=60,
                    XDG_CONFIG_HOME=str(tmp_path / "cfg"),
                    HOSTILE_URL=f"http://127.0.0.2:{s.getsockname()[1]}/")
    finally:
        stop.set()
        s.close()
    assert heads == [], heads
    assert "127.0.0.2" not in r.stderr, r.stderr[-1500:]
