"""An extra model or context llama-server loads beside the main one: a speculative draft model, the
MTP context on the main model's NextN layers, a multimodal projector.

Each is a named set of buffers on the same devices as the main model.  llama.cpp counts them per
device with the main model's (its ``--fit`` fits a draft/MTP context as ``common_fit_extra_model``;
the server adds the projector's memory to the fit targets), so :func:`attach` puts every extra buffer
in its device's list, tagged with the extra's ``key`` (:attr:`Buffer.owner`): totals, memory bars and
fits count them, and views can still show each extra as its own rows.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from offload_planner.core.buffer import Buffer

if TYPE_CHECKING:
    from offload_planner.core.memory import Projection

DRAFT = "draft"
MTP = "mtp"
MMPROJ = "mmproj"


@dataclass(frozen=True)
class ExtraContext:
    """One extra model/context: ``key`` (draft | mtp | mmproj), a label for views, its buffers (each
    on a device of the main device set), and whether it runs on the main model's weights (MTP)."""

    key: str
    label: str
    buffers: tuple[Buffer, ...]
    shares_model: bool = False

    def by_device(self, kind: str | None = None) -> dict[str, int]:
        """Bytes per device (host buffers count for the CPU, as in :class:`Projection`)."""
        out: dict[str, int] = defaultdict(int)
        for b in self.buffers:
            if kind is None or b.kind == kind:
                out[b.device] += b.bytes
        return dict(out)

    def total(self, kind: str | None = None) -> int:
        return sum(self.by_device(kind).values())


def tagged(key: str, buffers: list[Buffer]) -> tuple[Buffer, ...]:
    """The buffers with :attr:`Buffer.owner` set to ``key``."""
    return tuple(replace(b, owner=key) for b in buffers)


def attach(projection: Projection, extras: list[ExtraContext]) -> Projection:
    """``projection`` with every extra's buffers counted on their devices (unknown devices: the CPU,
    as :func:`memory.project` does) and the extras listed in ``projection.extras``."""
    if not extras:
        return projection
    names = {dm.device.name: dm for dm in projection.devices}
    cpu = projection.devices[-1]
    devices = [replace(dm, buffers=list(dm.buffers)) for dm in projection.devices]
    by_name = {dm.device.name: dm for dm in devices}
    for extra in extras:
        for b in extra.buffers:
            by_name[b.device if b.device in names else cpu.device.name].buffers.append(b)
    return replace(projection, devices=devices, extras=[*projection.extras, *extras])


def main_buffers(buffers: list[Buffer]) -> list[Buffer]:
    """The main model's buffers only (views that show extras as their own rows)."""
    return [b for b in buffers if not b.owner]
