"""A projection's buffers as a multiset, to compare two projections buffer by buffer."""

from __future__ import annotations

from collections import Counter


def buffer_counts(projection: object) -> Counter[tuple[str, str, str]]:
    """Bytes per (device, buffer name, kind) of ``projection`` (a :class:`core.memory.Projection`)."""
    out: Counter[tuple[str, str, str]] = Counter()
    for dm in projection.devices:  # type: ignore[attr-defined]
        for b in dm.buffers:
            out[(dm.device.name, b.name, b.kind)] += b.bytes
    return out
