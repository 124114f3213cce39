"""One reserved graph: built, scheduled and allocated from scratch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from offload_planner.core.compute.allocator import GraphAllocator, shares_allocators
from offload_planner.core.compute.bound import lifetime_bound, unproven
from offload_planner.core.compute.ggml import Graph, T, nbytes
from offload_planner.core.compute.graph import Builder, Shape
from offload_planner.core.compute.jumps import JumpingAllocator
from offload_planner.core.compute.sched_layers import LayerScheduler, cached_refs
from offload_planner.core.compute.scheduler import Backend, Scheduler
from offload_planner.core.compute.template import LayerCodes, kept_codes

# --- reserve ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reserve:
    """One reserved graph: bytes per backend and what was going on at each backend's peak."""

    n_tokens: int
    sizes: list[int]
    peaks: list[str]  # per backend: the op (and layer) whose allocation set the maximum
    copies_bytes: list[int]  # bytes of split-input copies per backend (all copies)
    weight_copies_bytes: list[int]  # of which copies of host weights (op offload)
    n_nodes: int
    n_splits: int


def reserve(sh: Shape, arch_fn: Callable[[Builder], None], backends: list[Backend], n_copies: int,
            weights: Callable[[str], T | None], layer_dev: Callable[[int], str],
            kv_dev: Callable[[int], str], *, no_alloc: bool = False, op_offload: bool = True) -> Reserve:
    b = Builder(sh, weights, layer_dev, kv_dev)
    arch_fn(b)
    return reserve_graph(b.g, sh, backends, n_copies, no_alloc=no_alloc, op_offload=op_offload)


def reserve_below(sh: Shape, arch_fn: Callable[[Builder], None], backends: list[Backend], n_copies: int,
                  weights: Callable[[str], T | None], layer_dev: Callable[[int], str],
                  kv_dev: Callable[[int], str], below: list[int], *, no_alloc: bool = False,
                  op_offload: bool = True) -> Reserve | None:
    """:func:`reserve`, or None when a bound of its sizes (from the scheduled graph: the allocator's walk
    is left out) is at most ``below`` on every backend: llama.cpp keeps the larger of two reserves per
    backend, so this one would decide no size.  The bound: the sum of what the allocator may be asked
    for (:func:`.bound.unproven`); where that fails on the host, the lifetimes' (:func:`.bound.
    lifetime_bound`, dearer): the host runs the layers' split-off parts (experts overridden to it) and
    frees each before the next, where a GPU holds whole layers and the residual stream across them."""
    b = Builder(sh, weights, layer_dev, kv_dev)
    arch_fn(b)
    sched = Scheduler(backends, n_copies, op_offload)
    sched.split_graph(b.g, keep_forced=not no_alloc)
    sizer = GraphAllocator(backends)
    failed = unproven(sizer, sched.nodes, sched.node_ids, sched.leafs, sched.leaf_ids, below)
    if failed is None:
        return None
    if failed == sched.cpu:
        bound = lifetime_bound(sizer, sched.nodes, sched.node_ids, sched.leafs, sched.leaf_ids)
        if all(x <= y for x, y in zip(bound, below, strict=True)):
            return None
    return _allocated(b.g, sh, backends, n_copies, sched, None)


def reserve_graph(g: Graph, sh: Shape, backends: list[Backend], n_copies: int, *, no_alloc: bool = False,
                  op_offload: bool = True) -> Reserve:
    """The reserve of a built graph (scheduled and allocated); a kept graph's scheduler passes take
    equal layers' results from the first (:mod:`.sched_layers`) and its walk jumps whole periods of
    equal layers (:mod:`.jumps`)."""
    kept = kept_codes(g)
    sched = (Scheduler(backends, n_copies, op_offload) if kept is None
             else LayerScheduler(backends, n_copies, op_offload, cached_refs(g, kept[0])))
    sched.split_graph(g, keep_forced=not no_alloc)
    return _allocated(g, sh, backends, n_copies, sched, kept)


def _allocated(g: Graph, sh: Shape, backends: list[Backend], n_copies: int, sched: Scheduler,
               kept: tuple[LayerCodes, dict[int, int]] | None) -> Reserve:
    """The scheduled graph allocated: its reserve."""
    galloc = (GraphAllocator(backends) if kept is None or shares_allocators(backends)
              else JumpingAllocator(backends, kept[0], g.nodes, kept[1], sched.splits))
    sizes = galloc.run(sched.nodes, sched.node_ids, sched.leafs, sched.leaf_ids)
    copies = [0] * len(backends)
    weight_copies = [0] * len(backends)
    for sp in sched.splits:
        for inp in sp.inputs:
            copies[sp.backend] += nbytes(inp) * n_copies
            if inp.weights:
                weight_copies[sp.backend] += nbytes(inp) * n_copies
    return Reserve(sh.n_tokens, sizes, galloc.peaks, copies, weight_copies, len(g.nodes), len(sched.splits))


