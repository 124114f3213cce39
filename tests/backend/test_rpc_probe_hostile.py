"""The RPC probe against servers that are not ggml-rpc-servers or answer too slowly: one
RpcProbeError naming HOST:PORT, within the probe's deadline, never a hang."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from offload_planner.backend import rpc_probe
from offload_planner.backend.rpc_probe import RpcProbeError, probe_link

HELLO = struct.pack("<Q", 28) + bytes([rpc_probe.PROTO_MAJOR, 0, 0, 0]) + bytes(24)
DEVICE_COUNT = struct.pack("<QI", 4, 1)


def _drip(conn: socket.socket, data: bytes, stop: threading.Event, pause: float) -> None:
    for b in data:
        if stop.wait(pause):
            return
        conn.sendall(bytes([b]))


def _drip_everything(conn: socket.socket, stop: threading.Event) -> None:
    """HELLO and every later answer (DEVICE_COUNT's) a byte at a time, each within the timeout."""
    conn.recv(64)
    _drip(conn, HELLO, stop, 0.05)
    while not stop.is_set():
        conn.recv(64)
        _drip(conn, DEVICE_COUNT, stop, 0.05)


def _hello_then_garbage(conn: socket.socket, stop: threading.Event) -> None:
    conn.recv(64)
    conn.sendall(HELLO)
    conn.recv(64)
    conn.sendall(b"\xff" * 64)
    stop.wait(30)


def _close_mid_answer(conn: socket.socket, stop: threading.Event) -> None:
    conn.recv(64)
    conn.sendall(HELLO[:11])
    conn.close()


def _silent(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait(30)


@pytest.fixture
def hostile() -> Iterator[Callable[[Callable[[socket.socket, threading.Event], None]], str]]:
    """A TCP listener on 127.0.0.1 that answers each connection as the given function does."""
    stop = threading.Event()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    threads: list[threading.Thread] = []

    def start(answer: Callable[[socket.socket, threading.Event], None]) -> str:
        def serve() -> None:
            conn, _ = srv.accept()
            try:
                answer(conn, stop)
            except OSError:
                pass
            finally:
                conn.close()
        t = threading.Thread(target=serve, daemon=True)
        t.start()
        threads.append(t)
        return f"127.0.0.1:{srv.getsockname()[1]}"

    yield start
    stop.set()
    srv.close()
    for t in threads:
        t.join(5)


def _probe_within(endpoint: str, seconds: float) -> str:
    """probe_link's RpcProbeError message, in a thread: a probe still running after ``seconds`` fails
    the test instead of holding it."""
    out: list[BaseException | None] = []

    def go() -> None:
        try:
            probe_link(endpoint, timeout=0.5)
            out.append(None)
        except BaseException as e:  # handed to the test
            out.append(e)
    t = threading.Thread(target=go, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(seconds)
    assert out, f"the probe of {endpoint} still runs after {time.monotonic() - t0:.1f} s"
    assert isinstance(out[0], RpcProbeError), out[0]
    assert str(out[0]).startswith(f"{endpoint}: "), out[0]
    return str(out[0])


def test_a_server_dripping_its_answers_is_given_up_at_the_deadline(
        hostile: Callable[[Callable[[socket.socket, threading.Event], None]], str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each byte came within the per-operation timeout, so the old probe waited 32 round trips of
    12 bytes (a 1.5 s drip: 198 s of `plan --rpc`); now the whole probe has a deadline."""
    monkeypatch.setattr(rpc_probe, "PROBE_DEADLINE", 1.0, raising=False)
    message = _probe_within(hostile(_drip_everything), 6.0)
    assert "no complete answer within 1 s" in message


@pytest.mark.parametrize(("answer", "named"), [(_hello_then_garbage, "answer of"),
                                               (_close_mid_answer, "closed the connection"),
                                               (_silent, "no answer within")])
def test_a_server_that_is_not_ggml_rpc_is_named_fast(
        hostile: Callable[[Callable[[socket.socket, threading.Event], None]], str],
        answer: Callable[[socket.socket, threading.Event], None], named: str) -> None:
    assert named in _probe_within(hostile(answer), 6.0)
