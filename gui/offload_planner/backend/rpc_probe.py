"""The network link to a running ``ggml-rpc-server``, measured through its own protocol.

ggml-rpc (``ggml/src/ggml-rpc/ggml-rpc.cpp``, protocol 7): a request is ``| cmd (1 byte) | size
(8 bytes) | data |``, a response ``| size (8 bytes) | data |``; every connection starts with HELLO.
The probe times round trips of DEVICE_COUNT (a command with no work: the link's latency as
llama.cpp's client sees it, TCP_NODELAY as it sets) and a tensor of :data:`PROBE_BYTES` written with
SET_TENSOR and read back with GET_TENSOR in a scratch buffer it allocates on device 0 and frees
(the throughput of the payload both ways).  Then the server's own work per graph split: a
GRAPH_COMPUTE of :data:`GRAPH_NODES` small additions chained on device 0 (what a split asks of it:
deserialize the graph's tensors, build it, run ``ggml_backend_graph_compute``, a fresh threadpool each
time on a CPU server; ``rpc_server::graph_compute``) followed by a GET_TENSOR of its result, less a
GET_TENSOR alone (the round trip).  About a tenth of a second on loopback.
"""

from __future__ import annotations

import socket
import statistics
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from offload_planner.core.cmdline.rpc_endpoint import read_rpc_endpoint

PROTO_MAJOR = 7
CONN_CAPS = 24  # RPC_CONN_CAPS_SIZE (transport.h): zeros ask for no transport upgrade
CMD_ALLOC_BUFFER, CMD_BUFFER_GET_BASE, CMD_FREE_BUFFER = 0, 3, 4
CMD_SET_TENSOR, CMD_GET_TENSOR, CMD_GRAPH_COMPUTE, CMD_HELLO, CMD_DEVICE_COUNT = 6, 8, 10, 14, 15
CMD_GET_DEVICE_MEMORY = 11  # rpc_msg_get_device_memory_req {uint32 device} -> {uint64 free, uint64 total}
GGML_TYPE_F32 = 0
GGML_OP_ADD = 2  # ggml.h: GGML_OP_NONE, GGML_OP_DUP, GGML_OP_ADD
PROBE_BYTES = 4 * 1024 * 1024
ROUNDS = 32
TRANSFERS = 3
#: The probe graph: a chain of additions of 4096 floats, about a layer's node count of a split
#: (a transformer layer is some 20-30 graph nodes)
GRAPH_NODES = 30
GRAPH_FLOATS = 4096


class RpcProbeError(Exception):
    """The endpoint cannot be probed: not reachable, not a ggml-rpc-server, another protocol."""


@dataclass(frozen=True)
class LinkProbe:
    endpoint: str
    rtt_us: float  # median round trip of a command with no work
    gbs: float  # payload GB/s (10^9 bytes), a tensor written and read back
    server_version: str
    graph_us: float = 0.0  # median of the server's own work on one small graph split (0: not measured)
    mem_total: int | None = None  # bytes device 0 reports as its total memory (None: not asked)
    n_devices: int | None = None  # the devices the server serves (DEVICE_COUNT)


def _rpc_tensor(buffer: int, data: int, n_floats: int, *, tensor_id: int = 1, op: int = 0,
                srcs: tuple[int, ...] = (), use_count: int = 0) -> bytes:
    """``rpc_tensor`` (packed, 296 bytes) of a 1-D f32 tensor at ``data`` in ``buffer``: the result of
    ``op`` on the tensors ``srcs`` (ids), or a leaf."""
    nb = [4, 4 * n_floats, 4 * n_floats, 4 * n_floats]
    src = [*srcs, *([0] * (10 - len(srcs)))]
    return (struct.pack("<QIQ4I4II16iI", tensor_id, GGML_TYPE_F32, buffer, n_floats, 1, 1, 1, *nb, op,
                        *([0] * 16), 0)
            + struct.pack("<10Q", *src) + struct.pack("<QQQ", 0, 0, data)
            + b"probe".ljust(64, b"\0") + struct.pack("<i", use_count))


#: The whole probe's time limit in seconds (each socket operation also waits at most ``timeout``)
PROBE_DEADLINE = 10.0


class _Conn:
    def __init__(self, endpoint: str, timeout: float) -> None:
        ep = read_rpc_endpoint(endpoint)  # where llama-server connects: port modulo 65536 (htons)
        if ep is None or not ep.host:
            raise RpcProbeError(f"{endpoint}: expected HOST:PORT")
        try:
            self.sock = socket.create_connection((ep.host, ep.port % 65536), timeout=timeout)
        except OSError as e:
            raise RpcProbeError(f"{endpoint}: cannot connect ({e})") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.endpoint = endpoint
        self.timeout = timeout
        self.deadline = time.monotonic() + PROBE_DEADLINE

    def _wait(self) -> None:
        """Each socket operation waits at most ``timeout`` and all of them together
        :data:`PROBE_DEADLINE`: a server that answers a byte at a time just within the timeout held
        the probe (and ``plan``) for minutes."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RpcProbeError(f"{self.endpoint}: no complete answer within {PROBE_DEADLINE:g} s "
                                "(the probe takes about a tenth of a second on a working link)")
        self.sock.settimeout(min(self.timeout, left))

    def _late(self) -> None:
        """After a socket timeout: the deadline's message when it was the deadline that ran out."""
        if time.monotonic() >= self.deadline:
            self._wait()

    def send(self, cmd: int, data: bytes = b"") -> None:
        self._wait()
        try:
            self.sock.sendall(struct.pack("<BQ", cmd, len(data)) + data)
        except TimeoutError:
            self._late()
            raise

    def _recv(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            self._wait()
            try:
                chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            except TimeoutError:
                self._late()
                raise
            if not chunk:
                raise RpcProbeError(f"{self.endpoint}: the server closed the connection")
            buf += chunk
        return bytes(buf)

    def call(self, cmd: int, data: bytes, size: int) -> bytes:
        self.send(cmd, data)
        (n,) = struct.unpack("<Q", self._recv(8))
        if n != size:
            raise RpcProbeError(f"{self.endpoint}: answer of {n} bytes to command {cmd}, expected {size}")
        return self._recv(n)

    def close(self) -> None:
        self.sock.close()


def _hello(c: _Conn) -> str:
    major, minor, patch = struct.unpack("<BBBx", c.call(CMD_HELLO, bytes(CONN_CAPS), 4 + CONN_CAPS)[:4])
    if major != PROTO_MAJOR:
        raise RpcProbeError(f"{c.endpoint}: RPC protocol {major}.{minor}.{patch}, the probe speaks "
                            f"{PROTO_MAJOR}.x")
    return f"{major}.{minor}.{patch}"


def _transfer_seconds(c: _Conn, nbytes: int) -> float:
    """Best time of writing and reading back ``nbytes`` in a scratch buffer on device 0."""
    remote, size = struct.unpack("<QQ", c.call(CMD_ALLOC_BUFFER, struct.pack("<IQ", 0, nbytes), 16))
    if not remote or size < nbytes:
        raise RpcProbeError(f"{c.endpoint}: the server did not allocate {nbytes} bytes")
    try:
        (base,) = struct.unpack("<Q", c.call(CMD_BUFFER_GET_BASE, struct.pack("<Q", remote), 8))
        tensor = _rpc_tensor(remote, base, nbytes // 4)
        payload = bytes(range(256)) * (nbytes // 256)
        best = float("inf")
        for _ in range(TRANSFERS):
            t0 = time.perf_counter()
            c.send(CMD_SET_TENSOR, tensor + b"\0" + struct.pack("<Q", 0) + payload)
            back = c.call(CMD_GET_TENSOR, tensor + struct.pack("<QQ", 0, nbytes), nbytes)
            best = min(best, time.perf_counter() - t0)
            if back != payload:
                raise RpcProbeError(f"{c.endpoint}: the tensor read back differs from the one written")
        return best
    finally:
        c.send(CMD_FREE_BUFFER, struct.pack("<Q", remote))


def _median_us(f: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _graph_us(c: _Conn, rounds: int, nodes: int = GRAPH_NODES, n: int = GRAPH_FLOATS) -> float:
    """The server's work on a graph of ``nodes`` chained additions (GRAPH_COMPUTE, which answers
    nothing, then a GET_TENSOR of the last node) less a GET_TENSOR alone, median of ``rounds``."""
    nbytes = 4 * n * (nodes + 2)
    remote, size = struct.unpack("<QQ", c.call(CMD_ALLOC_BUFFER, struct.pack("<IQ", 0, nbytes), 16))
    if not remote or size < nbytes:
        raise RpcProbeError(f"{c.endpoint}: the server did not allocate {nbytes} bytes")
    try:
        (base,) = struct.unpack("<Q", c.call(CMD_BUFFER_GET_BASE, struct.pack("<Q", remote), 8))
        tensors = [_rpc_tensor(remote, base, n, tensor_id=1, use_count=1),
                   _rpc_tensor(remote, base + 4 * n, n, tensor_id=2, use_count=nodes)]
        for k in range(nodes):  # node k adds the previous result and tensor 2
            tensors.append(_rpc_tensor(remote, base + 4 * n * (2 + k), n, tensor_id=3 + k, op=GGML_OP_ADD,
                                       srcs=(2 + k if k else 1, 2), use_count=1))
        ids = list(range(3, 3 + nodes))
        graph = (struct.pack("<II", 0, nodes) + struct.pack(f"<{nodes}Q", *ids)
                 + struct.pack("<I", len(tensors)) + b"".join(tensors))
        last = tensors[-1] + struct.pack("<QQ", 0, 64)

        def get() -> None:
            c.call(CMD_GET_TENSOR, last, 64)

        def compute() -> None:
            c.send(CMD_GRAPH_COMPUTE, graph)
            get()

        compute()  # the server's first graph allocates its buffers
        return max(0.0, _median_us(compute, rounds) - _median_us(get, rounds))
    finally:
        c.send(CMD_FREE_BUFFER, struct.pack("<Q", remote))


def probe_link(endpoint: str, *, rounds: int = ROUNDS, nbytes: int = PROBE_BYTES,
               timeout: float = 2.0) -> LinkProbe:
    """Latency and throughput of the link to the ggml-rpc-server at ``endpoint`` (HOST:PORT), the
    server's own work on one graph split, its device count and device 0's total memory."""
    c = _Conn(endpoint, timeout)
    try:
        version = _hello(c)
        (n_devices,) = struct.unpack("<I", c.call(CMD_DEVICE_COUNT, b"", 4))
        _free, total = struct.unpack("<QQ", c.call(CMD_GET_DEVICE_MEMORY, struct.pack("<I", 0), 16))
        rtt = _median_us(lambda: c.call(CMD_DEVICE_COUNT, b"", 4), rounds)
        seconds = _transfer_seconds(c, nbytes)
        graph = _graph_us(c, rounds)
    except TimeoutError:  # the deadline's own message is an RpcProbeError: this is one operation's wait
        raise RpcProbeError(f"{endpoint}: no answer within {timeout:g} s") from None
    except (OSError, struct.error) as e:
        raise RpcProbeError(f"{endpoint}: {e}") from None
    finally:
        c.close()
    return LinkProbe(endpoint, rtt, 2 * nbytes / seconds / 1e9, version, graph, total, n_devices)
