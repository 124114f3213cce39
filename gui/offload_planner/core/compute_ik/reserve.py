"""ik's one reserve: its graph built, scheduled and allocated."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from offload_planner.core.compute.ggml import CPU
from offload_planner.core.compute.scheduler import Backend, Scheduler
from offload_planner.core.compute_ik.allocator import IkGraphAllocator
from offload_planner.core.compute_ik.archs import IK_GRAPHS
from offload_planner.core.compute_ik.builder import IkBuilder
from offload_planner.core.compute_ik.scheduler import ik_backends
from offload_planner.core.compute_ik.simulate import ik_shape, ik_weights, loads_nextn

if TYPE_CHECKING:
    from offload_planner.core.devices import DeviceSet
    from offload_planner.core.memory import ContextParams, ResolvedContext
    from offload_planner.core.model import Model
    from offload_planner.core.placement import Placement


@dataclass(frozen=True)
class IkReserve:
    backends: list[Backend]
    sizes: list[int]  # bytes per backend as ik's gallocr reserves them
    n_nodes: int
    n_splits: int
    n_tokens: int


def simulate_ik(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
                p: ContextParams, graph: Callable[[IkBuilder], None] | None = None) -> IkReserve:
    """ik's one reserve: the prompt graph of ``min(n_ctx, n_batch, n_ubatch)`` tokens over the whole
    cache (``graph``: another of the architecture's graphs, the MTP context's)."""
    arch_fn = graph or IK_GRAPHS[model.arch]
    backends = ik_backends(devices, placement, p.repack, p.dialect.cuda_multiplies_r4)
    sh = replace(ik_shape(model, ctx, p, cpu_only=len(backends) == 1), mtp=loads_nextn(model, placement))

    def kv_dev(il: int) -> str:
        return placement.layer_device(il) if p.offload_kqv else CPU

    b = IkBuilder(sh, ik_weights(model, placement, p.mla), kv_dev)
    arch_fn(b)
    sched = Scheduler(backends, 1, p.op_offload)
    sched.split_graph(b.g)
    galloc = IkGraphAllocator(backends)
    sizes = galloc.run(sched.nodes, sched.node_ids, sched.leafs, sched.leaf_ids)
    return IkReserve(backends, sizes, len(b.g.nodes), len(sched.splits), sh.n_tokens)
