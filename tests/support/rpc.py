"""Local ggml-rpc-servers that give llama-server offload devices (RPC0, RPC1, ...) without a GPU."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from tests.support.procs import free_port, running_process


@contextlib.contextmanager
def rpc_servers(bin_dir: Path, n: int, log_dir: Path) -> Iterator[list[str]]:
    """Start ``n`` ggml-rpc-servers on free 127.0.0.1 ports; yield their ``host:port`` endpoints.

    Each is stopped by PID on exit, whatever happens in the block.
    """
    with contextlib.ExitStack() as stack:
        endpoints = []
        for i in range(n):
            port = free_port()
            stack.enter_context(
                running_process(
                    [bin_dir / "ggml-rpc-server", "-H", "127.0.0.1", "-p", str(port)],
                    log_path=log_dir / f"rpc{i}.log",
                    ready=r"transport\s*:",
                    timeout=30,
                )
            )
            endpoints.append(f"127.0.0.1:{port}")
        yield endpoints
