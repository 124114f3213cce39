"""A candidate of the fastest-plan search (:mod:`.fastest`): its plan, its memory and whether it fits
each device's capacity minus its margin, its speed estimate made when asked for; the search's result."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.memory import Projection
from offload_planner.core.plan import Plan
from offload_planner.core.speed.result import SpeedEstimate
from offload_planner.core.units import GiB

DEFAULT_MARGIN = 1 * GiB  # the window's default margin on every GPU


@dataclass
class Candidate:
    label: str
    plan: Plan
    projection: Projection
    #: the speed estimate, made when first asked for (:attr:`estimate`; a candidate over its limit
    #: on the way to a fill is never scored) and shared by the candidate's copies
    speed: Callable[[], SpeedEstimate]
    over: list[str] = field(default_factory=list)  # GPUs over their limit
    #: memory from a full projection of this plan; False: its weights, KV and output are exact and
    #: its compute buffers predicted from plans of the same ``-ub`` that were projected in full
    verified: bool = True
    #: bytes over the host's (the CPU's RAM) capacity minus its margin; 0: within it or unknown.
    #: Moving experts to the GPUs only lowers it, so the search fills as if it were not there and
    #: a plan over it is never chosen
    host_over: int = 0

    @property
    def fits(self) -> bool:
        return not self.over and not self.host_over

    @property
    def estimate(self) -> SpeedEstimate:
        return self.speed()


@dataclass
class FastestResult:
    best: Candidate | None  # None: nothing fits; else verified by a full projection
    candidates: list[Candidate]  # ours first, then the baselines
    goal: str
    projections: int = 0  # full projections (compute buffers simulated)
    notes: list[str] = field(default_factory=list)
    evaluations: int = 0  # candidates evaluated with predicted compute buffers
    fit_seconds: float = 0.0  # CPU time of the llama.cpp --fit baseline (its own ~25 dry runs)
    why: str = ""  # when nothing fits: which device is over, by how much, in the closest candidate
    fit_forked: bool = False  # the --fit baseline ran in a child process beside the search


def margin_of(dev: Device) -> int:
    """The bytes kept free on ``dev``: its margin, else (not given) the default on a GPU; margin=0B
    given is no margin."""
    return dev.margin if dev.margin_given else (DEFAULT_MARGIN if dev.is_gpu else 0)


def room(projection: Projection, devices: DeviceSet) -> dict[str, int]:
    """Bytes each GPU can still take: capacity - margin - what the projection puts there."""
    out = {}
    for g in devices.gpus:
        if g.capacity is not None:
            out[g.name] = g.capacity - margin_of(g) - projection.device(g.name).resident()
    return out


def host_used(projection: Projection, devices: DeviceSet) -> int:
    """Bytes the projection takes of the host's RAM: the CPU's (mmap'd weights by the bytes read, as on
    the memory bars), and on a Mac the Metal GPUs' too, which share that memory (Apple silicon's unified
    memory: Metal's capacity is recommendedMaxWorkingSetSize, a share of the RAM), the CPU's mapped
    tensors inside a GPU's mapped span counted once (:func:`~offload_planner.core.mapped_span.
    shared_bytes`). Without a Metal GPU: the CPU's alone."""
    used = projection.device(devices.cpu.name).resident()
    metal = [g.name for g in devices.gpus if g.kind is DeviceKind.METAL]
    if metal:
        from offload_planner.core.mapped_span import shared_bytes

        used += sum(projection.device(g).resident() for g in metal) - sum(shared_bytes(projection).values())
    return used


def host_left(projection: Projection, devices: DeviceSet) -> int | None:
    """Bytes the host (the CPU's RAM: declared, else this machine's) can still take after its margin
    (None: capacity unknown): :func:`host_used`."""
    cpu = devices.cpu
    if cpu.capacity is None:
        return None
    return cpu.capacity - margin_of(cpu) - host_used(projection, devices)


def over_by(c: Candidate, devices: DeviceSet) -> list[tuple[str, int]]:
    """(device, bytes) each device of ``c`` is over its capacity minus its margin."""
    left = room(c.projection, devices)
    out = [(g, -left[g]) for g in c.over]
    return out + ([(devices.cpu.name, c.host_over)] if c.host_over else [])


def why_nothing_fits(candidates: Sequence[Candidate], devices: DeviceSet) -> str:
    """One sentence: the candidate over by the fewest bytes, each device it is over and by how much."""
    from offload_planner.core.units import fmt_bytes

    over = [(c, over_by(c, devices)) for c in candidates if not c.fits]
    if not over:
        return ""
    c, by = min(over, key=lambda x: (sum(b for _, b in x[1]), not x[0].verified))
    parts = []
    for name, b in by:
        dev = devices.by_name(name)
        assert dev is not None
        margin = margin_of(dev)
        used = c.projection.device(name).resident() if dev.is_gpu else host_used(c.projection, devices)
        shared = any(g.kind is DeviceKind.METAL for g in devices.gpus) and not dev.is_gpu
        parts.append(f"{name}{' (RAM)' if not dev.is_gpu else ''} over by {fmt_bytes(b, precision=1)} "
                     f"({fmt_bytes(used, precision=1)} projected"
                     + (", the Metal GPU's share of the same memory included" if shared else "")
                     + (f" + {fmt_bytes(margin, precision=1)} margin" if margin else "")
                     + f" > {fmt_bytes(dev.capacity or 0, precision=1)})")
    return (f"{'; '.join(parts)} in the closest plan, {c.label}"
            + ("" if c.verified else " (compute buffers predicted)"))
