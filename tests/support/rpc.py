"""Local ggml-rpc-servers that give llama-server offload devices (RPC0, RPC1, ...) without a GPU."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.procs import free_port, running_process


def wait_listening(port: int, timeout: float = 30.0) -> None:
    """Block until something accepts TCP connections on 127.0.0.1:port."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing is listening on 127.0.0.1:{port}")
        time.sleep(0.05)


@contextlib.contextmanager
def rpc_servers(bin_dir: Path, n: int, log_dir: Path) -> Iterator[list[str]]:
    """Start ``n`` ggml-rpc-servers on free 127.0.0.1 ports; yield their ``host:port`` endpoints.

    Readiness is the open port (the server's banner sits in a block-buffered stdout when that is
    a file). Each server is stopped by PID on exit, whatever happens in the block.
    """
    with contextlib.ExitStack() as stack:
        endpoints = []
        for i in range(n):
            port = free_port()
            stack.enter_context(
                running_process(
                    [bin_dir / "ggml-rpc-server", "-H", "127.0.0.1", "-p", str(port)],
                    log_path=log_dir / f"rpc{i}.log",
                )
            )
            wait_listening(port)
            endpoints.append(f"127.0.0.1:{port}")
        yield endpoints
