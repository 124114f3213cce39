"""The real llama-server's buffers against the projection: the RPC device set the integration tests
declare, one server run up to ``listening`` and the per-device, per-kind comparison table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.support.procs import free_port, running_process

from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.memory import Projection

RPC_FREE = 24 * 1024**3
KINDS = ("model", "kv", "output", "compute")


def rpc_devices(endpoints: Sequence[str], free: int = RPC_FREE) -> DeviceSet:
    """The CPU and one ``RPC{i}`` device of ``free`` bytes (size and free) per ggml-rpc-server
    endpoint."""
    gpus = tuple(Device(f"RPC{i}", DeviceKind.RPC, free, free, source="rpc", endpoint=ep)
                 for i, ep in enumerate(endpoints))
    return DeviceSet(Device("CPU", DeviceKind.CPU), gpus)


def mib(n: int) -> float:
    """Bytes in MiB to llama.cpp's printed precision (0.01 MiB)."""
    return round(n / 1024 / 1024, 2)


def server_output(llama_server: Path, args: Sequence[str], log_path: Path, timeout: float) -> str:
    """What llama-server with ``args`` (on a free 127.0.0.1 port, ``-lv 4``, no warm-up) writes up to
    listening (or up to its exit, when it fails); it is stopped then."""
    argv = [str(llama_server), *args, "--host", "127.0.0.1", "--port", str(free_port()), "-lv", "4",
            "--no-warmup"]
    with running_process(argv, log_path=log_path, ready=r"listening on http://", timeout=timeout) as proc:
        pass
    return proc.output()


def buffer_rows(projection: Projection, actual: dict[str, dict[str, float]]) -> tuple[list[str], list[str]]:
    """A row per projected device and kind of buffer (projected against ``actual``, the logged MiB by
    device and kind), and the rows that differ: model, KV and output by more than llama.cpp's printed
    0.01 MiB, compute by more than 5% or 2 MiB."""
    rows, mismatches = [], []
    for dm in projection.devices:
        for kind in KINDS:
            proj = mib(dm.total(kind))
            act = actual.get(dm.device.name, {}).get(kind, 0.0)
            rows.append(f"{dm.device.name:5} {kind:8} projected {proj:9.2f}  actual {act:9.2f}")
            tolerance = max(0.05 * act, 2.0) if kind == "compute" else 0.011
            if abs(proj - act) > tolerance:
                mismatches.append(rows[-1])
    return rows, mismatches


def mib_rows(label: str, ours: Mapping[str, float], theirs: Mapping[str, float | None],
             width: int) -> tuple[list[str], list[str]]:
    """A table row per buffer (``label``, buffer, ours, theirs: MiB) and a line for each that differs
    by more than llama.cpp's printed 0.01 MiB or that the other side did not report."""
    rows, bad = [], []
    for key, value in theirs.items():
        mine = ours.get(key, 0.0)
        shown = value if value is not None else float("nan")
        rows.append(f"{label:{width}} {key:14} {mine:8.2f} {shown:8.2f}")
        if value is None or abs(mine - value) > 0.0051:
            bad.append(f"{label}: {key} {mine:.2f} MiB, theirs {value} MiB")
    return rows, bad
