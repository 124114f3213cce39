"""Compute buffers (placeholder until the compute model lands): no buffers projected."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from offload_planner.core.devices import DeviceSet
    from offload_planner.core.memory import Buffer, ContextParams, ResolvedContext
    from offload_planner.core.model import Model
    from offload_planner.core.placement import Placement


def compute_buffers(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
                    params: ContextParams) -> list[Buffer]:
    return []
