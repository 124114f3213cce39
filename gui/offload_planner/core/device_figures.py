"""What one device's memory bar shows, from a DeviceMemory, and the capacity rule.

mmap'd weights count with the bytes actually read (``Buffer.resident``: page cache), not the file
span llama.cpp reports for the mapping: the span includes the tensors of other devices lying
between the CPU's, which never occupy RAM. The span stays in the tooltip.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from offload_planner.core.memory import Buffer, DeviceMemory, Projection
from offload_planner.core.units import fmt_bytes

#: Buffer kinds in bar order, with their labels.
BUFFER_KINDS: tuple[tuple[str, str], ...] = (
    ("model", "weights"),
    ("kv", "KV cache"),
    ("rs", "recurrent state"),  # a hybrid model's (core.recurrent_state); absent elsewhere
    ("compute", "compute"),
    ("output", "output"),
    ("mmproj", "projector"),  # --mmproj: the multimodal projector's weights and compute
)


def counted(b: Buffer) -> int:
    """Bytes a buffer occupies in the device's memory."""
    return b.resident if b.resident is not None else b.bytes


@dataclass(frozen=True)
class DeviceFigures:
    name: str
    description: str
    by_kind: tuple[tuple[str, int], ...]
    used: int
    capacity: int | None
    margin: int
    unread_span: int  # mmap span bytes not counted (never read)

    @property
    def over(self) -> int:
        return 0 if self.capacity is None else max(0, self.used + self.margin - self.capacity)

    @property
    def left(self) -> int | None:
        return None if self.capacity is None else self.capacity - self.margin - self.used

    @classmethod
    def of(cls, dm: DeviceMemory) -> DeviceFigures:
        d = dm.device
        kinds = tuple((k, sum(counted(b) for b in dm.buffers if b.kind == k)) for k, _ in BUFFER_KINDS)
        unread = sum(b.bytes - b.resident for b in dm.buffers if b.resident is not None)
        return cls(d.name, d.description, kinds, sum(n for _, n in kinds), d.capacity, d.margin, unread)


#: Window text appended to a device's over-capacity warning (the preset that fixes it, or what helps
#: where none does), or "": given the device and the whole projection.
CapacityHint = Callable[[DeviceMemory, Projection], str]


def capacity_warnings(projection: Projection, hint: CapacityHint | None = None) -> list[str]:
    """The one capacity rule (the table's OVER rows, the window's bars and warnings): a device is
    over when the bytes it holds (mmap'd weights by the bytes read) plus its margin exceed its
    capacity. ``hint`` adds a window's advice to each line."""
    out = []
    for dm in projection.devices:
        f = DeviceFigures.of(dm)
        if f.over and f.capacity is not None:
            margin = f" + {fmt_bytes(f.margin)} margin" if f.margin else ""
            out.append(
                f"{f.name} is over capacity by {fmt_bytes(f.over)} ({fmt_bytes(f.used)} projected{margin} "
                f"> {fmt_bytes(f.capacity)}){hint(dm, projection) if hint is not None else ''}"
            )
    return out


def over_capacity(projection: Projection) -> list[str]:
    """Names of the devices over capacity (:func:`capacity_warnings`' rule)."""
    return [dm.device.name for dm in projection.devices if DeviceFigures.of(dm).over]
