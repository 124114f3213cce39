"""Projected against actual: the projection's buffers against the sizes llama-server logged, per
device, kind and buffer, with the engine's tolerance (model, KV and output equal to the printed
0.01 MiB; compute within 5% or 2 MiB); the device set with the free memory the server logged."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from offload_planner.backend.log_parser import LoadReport, device_of_buffer
from offload_planner.core.devices import Device, DeviceKind, DeviceSet, kind_of
from offload_planner.core.dialects.base import Dialect
from offload_planner.core.errors import PlannerError
from offload_planner.core.memory import Projection
from offload_planner.core.units import MiB

# --- tolerance ------------------------------------------------------------------------------------

EXACT_MIB = 0.011  # llama.cpp prints 2 decimals: equal to its precision (plus rounding)
COMPUTE_REL = 0.05
COMPUTE_ABS_MIB = 2.0
KINDS = ("model", "kv", "rs", "output", "compute", "mmproj")


def within_tolerance(kind: str, projected_mib: float, actual_mib: float) -> bool:
    """The engine's tolerance: model/KV/output equal to 0.01 MiB, compute within 5% or 2 MiB."""
    diff = abs(projected_mib - actual_mib)
    if kind in ("compute", "mmproj"):  # mmproj: the log gives the unpadded weights, not the buffer
        return diff <= max(COMPUTE_REL * actual_mib, COMPUTE_ABS_MIB)
    return diff <= EXACT_MIB




@dataclass(frozen=True)
class CompareRow:
    device: str
    kind: str
    buffer: str  # as projected / logged (RPC buffers by device name)
    projected_mib: float | None
    actual_mib: float | None

    @property
    def diff_mib(self) -> float | None:
        if self.projected_mib is None or self.actual_mib is None:
            return None
        return self.actual_mib - self.projected_mib


@dataclass(frozen=True)
class KindTotal:
    device: str
    kind: str
    projected_mib: float
    actual_mib: float

    @property
    def ok(self) -> bool:
        return within_tolerance(self.kind, self.projected_mib, self.actual_mib)


@dataclass
class Comparison:
    rows: list[CompareRow] = field(default_factory=list)
    totals: list[KindTotal] = field(default_factory=list)

    @property
    def has_actual(self) -> bool:
        return any(r.actual_mib is not None for r in self.rows)

    @property
    def ok(self) -> bool:
        """Every device's model, KV, output and compute within tolerance (and something was logged)."""
        return self.has_actual and all(t.ok for t in self.totals)

    def device_ok(self, device: str) -> bool:
        return all(t.ok for t in self.totals if t.device == device)

    def devices(self) -> list[str]:
        return list(dict.fromkeys(t.device for t in self.totals))

    def device_total(self, device: str) -> tuple[float, float]:
        ts = [t for t in self.totals if t.device == device]
        return sum(t.projected_mib for t in ts), sum(t.actual_mib for t in ts)

    def text(self) -> str:
        """The table: one row per device and buffer, then each device's total."""
        head = f"{'device':8} {'buffer':14} {'kind':8} {'projected':>11} {'actual':>11} {'diff':>9}"
        out = [head + "  (MiB)", "-" * len(head)]
        for dev in self.devices():
            for r in (r for r in self.rows if r.device == dev):
                out.append(f"{r.device:8} {r.buffer:14.14} {r.kind:8} {_num(r.projected_mib):>11} "
                           f"{_num(r.actual_mib):>11} {_signed(r.diff_mib):>9}")
            p, a = self.device_total(dev)
            bad = [t.kind for t in self.totals if t.device == dev and not t.ok]
            verdict = "ok" if not bad else "MISMATCH: " + ", ".join(bad)
            out.append(f"{dev:8} {'total':14} {'':8} {p:>11.2f} {a:>11.2f} {_signed(a - p):>9}  {verdict}")
        return "\n".join(out)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _signed(x: float | None) -> str:
    return "" if x is None else f"{round(x, 2) or 0.0:+.2f}"  # no "-0.00"


def compare(projection: Projection, report: LoadReport,
            resolve: Mapping[str, str] | None = None, dialect: Dialect | None = None) -> Comparison:
    """Projected buffers (bytes) against logged ones (MiB), per device, kind and buffer name.
    ``resolve`` maps RPC endpoints to device names; by default the log's ``using device`` lines.
    ``dialect``: the build that wrote the log, whose names are read as the planner's (a 2025 build's
    ``Metal_Mapped`` is MTL0_Mapped: :meth:`Dialect.planner_buffer_name`); None: names as logged."""
    resolve = dict(resolve) if resolve is not None else report.rpc_endpoints()
    proj: dict[tuple[str, str, str], float] = defaultdict(float)
    act: dict[tuple[str, str, str], float] = defaultdict(float)
    for dm in projection.devices:
        for b in dm.buffers:
            proj[(dm.device.name, b.kind, b.name)] += b.bytes / MiB
    for bl in report.buffers:
        buffer = dialect.planner_buffer_name(bl.buffer) if dialect is not None else bl.buffer
        dev = device_of_buffer(buffer, resolve)
        name = dev if buffer.startswith("RPC") else buffer
        act[(dev, bl.kind, name)] += bl.mib
    order = {d.device.name: i for i, d in enumerate(projection.devices)}
    kind_order = {k: i for i, k in enumerate(KINDS)}
    keys = sorted(set(proj) | set(act),
                  key=lambda k: (order.get(k[0], 99), k[0], kind_order.get(k[1], 9), k[2]))
    rows = [CompareRow(d, k, n, proj.get((d, k, n)), act.get((d, k, n))) for d, k, n in keys]
    totals = []
    for dev in dict.fromkeys(k[0] for k in keys):
        for kind in KINDS:
            p = sum(v for (d, k, _), v in proj.items() if d == dev and k == kind)
            a = sum(v for (d, k, _), v in act.items() if d == dev and k == kind)
            if p or a:
                totals.append(KindTotal(dev, kind, round(p, 4), round(a, 4)))
    return Comparison(rows, totals)


def devices_from_log(devices: DeviceSet, report: LoadReport, dialect: Dialect | None = None) -> DeviceSet:
    """The device set with the free memory llama-server reported at load (``using device X (...) -
    N MiB free``): the default -ts split follows it.  Logged devices missing from the set are added
    in the log's order (llama.cpp's order).  ``dialect``: the build that wrote the log (its ``Metal`` is
    the planner's MTL0)."""
    if not report.devices:
        return devices
    logged = [replace(d, name=dialect.planner_device_name(d.name)) if dialect is not None else d
              for d in report.devices]
    gpus = list(devices.gpus)
    logged_names = [d.name for d in logged]
    for ld in logged:
        free = ld.free_mib * MiB
        idx = next((i for i, g in enumerate(gpus) if g.name.lower() == ld.name.lower()), None)
        if idx is None:
            try:
                kind = kind_of(ld.name)
            except PlannerError:
                continue
            endpoint = ld.description if kind is DeviceKind.RPC else ""
            gpus.append(Device(ld.name, kind, free, free, description=ld.description, source="log",
                               endpoint=endpoint))
        else:
            g = gpus[idx]
            gpus[idx] = replace(g, free=free, total=g.total if g.total is not None else free)
    rank = {n.lower(): i for i, n in enumerate(logged_names)}
    gpus.sort(key=lambda g: rank.get(g.name.lower(), len(rank)))
    return DeviceSet(devices.cpu, tuple(gpus), reported_order=True)
