"""What one device's memory bar shows, from a DeviceMemory (Qt-free).

mmap'd weights count with the bytes actually read (``Buffer.resident``: page cache), not the file
span llama.cpp reports for the mapping: the span includes the tensors of other devices lying
between the CPU's, which never occupy RAM. The span stays in the tooltip.
"""

from __future__ import annotations

from dataclasses import dataclass

from offload_planner.core.memory import Buffer, DeviceMemory, Projection
from offload_planner.core.units import fmt_bytes

#: Buffer kinds in bar order, with their labels.
BUFFER_KINDS: tuple[tuple[str, str], ...] = (
    ("model", "weights"),
    ("kv", "KV cache"),
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


def capacity_warnings(projection: Projection, *, moe: bool = False) -> list[str]:
    """Devices whose projected memory plus margin exceeds their capacity; for a GPU holding a MoE
    model's routed experts, the preset that fixes it."""
    out = []
    for dm in projection.devices:
        f = DeviceFigures.of(dm)
        if f.over and f.capacity is not None:
            margin = f" + {fmt_bytes(f.margin)} margin" if f.margin else ""
            hint = ""
            if moe and dm.device.is_gpu:
                hint = (f": Presets ▸ Fill {f.name} with routed experts keeps as many expert layers "
                        "there as fit and sends the rest to the CPU")
            out.append(
                f"{f.name} is over capacity by {fmt_bytes(f.over)} ({fmt_bytes(f.used)} projected{margin} "
                f"> {fmt_bytes(f.capacity)}){hint}"
            )
    return out
