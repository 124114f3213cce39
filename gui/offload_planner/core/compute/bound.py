"""An upper bound of a reserve's compute buffers without the allocator's walk.

``ggml_dyn_tallocr`` takes a block from its free list or from the end, and gives freed blocks back
(merged with the end when they touch it): its highest end never passes the sum of the (aligned) sizes
it was asked for.  On a backend the graph allocator asks for each tensor it owns at most once: the
nodes on that backend, the sources of those nodes (graph inputs are allocated at their first use,
on the reader's backend), the graph's leafs on theirs.  So the sum of those sizes, each tensor counted
once per backend, bounds what the reserve reaches there.

The incremental replay (:mod:`.replay`) uses it to leave out the one-token reserve where the prompt
reserve is larger on every backend anyway: llama.cpp keeps the larger of the two per backend, and a
one-token graph's tensors are a few rows each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from offload_planner.core.compute.allocator import GraphAllocator
from offload_planner.core.compute.ggml import T


def owned(t: T) -> bool:
    """The graph allocator gives ``t`` memory (it is no view and has no buffer of its own)."""
    return t.view_src is None and t.dev is None


class Bound:
    """Sums of aligned sizes per backend, each (tensor, backend) counted once; ``size`` is the graph
    allocator's (``GraphAllocator.size``, or a cache of it)."""

    def __init__(self, sizer: GraphAllocator, size: Callable[[T, int], int] | None = None) -> None:
        self.aligns = [a.alignment for a in sizer.allocs]
        self.size = sizer.size if size is None else size
        self.sizes = [0] * len(self.aligns)
        self.seen: set[tuple[T, int]] = set()

    def add(self, t: T, b: int) -> None:
        if (t, b) not in self.seen:
            self.seen.add((t, b))
            a = self.aligns[b]
            self.sizes[b] += -(-self.size(t, b) // a) * a

    def add_nodes(self, nodes: Sequence[T], ids: Sequence[int], srcs: Callable[[T], Sequence[T | None]],
                  allocated: Callable[[T], bool] = owned) -> None:
        """Every node on its backend and its sources on the node's backend (those the allocator owns)."""
        add = self.add
        for n, b in zip(nodes, ids, strict=True):
            if allocated(n):
                add(n, b)
            for s in srcs(n):
                if s is not None and allocated(s):
                    add(s, b)


def graph_bound(sizer: GraphAllocator, nodes: Sequence[T], ids: Sequence[int],
                leafs: Sequence[T]) -> list[int]:
    """The bound of a scheduled graph (its nodes with their sources as scheduled, backend ids, leafs;
    a leaf the allocator owns is counted on every backend)."""
    bound = Bound(sizer)
    bound.add_nodes(nodes, ids, lambda n: n.src)
    for leaf in leafs:
        if owned(leaf):
            for b in range(len(bound.sizes)):
                bound.add(leaf, b)
    return bound.sizes


def bound_below(sizer: GraphAllocator, nodes: Sequence[T], ids: Sequence[int], leafs: Sequence[T],
                leaf_ids: Sequence[int], below: Sequence[int]) -> bool:
    """A bound of a scheduled graph's reserve is at most ``below`` on every backend: its nodes and their
    sources as :func:`graph_bound` counts them, each leaf the allocator owns on its own backend (the
    allocator gives a leaf memory there, before the walk).

    A quick give-up (never a wrong yes): at once where a backend running some of the nodes has nothing
    in ``below``; at the first backend past ``below``; and at each tenth of the nodes, where a
    backend's sum over its nodes so far, scaled to all of its nodes, is past it (a backend's nodes
    repeat layer after layer: the bound would not hold).  The nodes are summed from the last: a
    backend holding the output layer alone (the one-token graph's logits and norms against a prompt
    reserve of a few rows) fails there, at once."""
    per = Counter(ids)
    if any(not below[b] for b in per):  # a backend with nodes here and an empty prompt reserve
        return False
    bound = Bound(sizer)
    sizes, add = bound.sizes, bound.add
    for leaf, b in zip(leafs, leaf_ids, strict=True):
        if owned(leaf):
            add(leaf, b)
    if any(x > y for x, y in zip(sizes, below, strict=True)):
        return False
    base, seen = list(sizes), [0] * len(sizes)
    step = max(len(nodes) // 10, 1)
    for k, (n, b) in enumerate(zip(reversed(nodes), reversed(ids), strict=True), 1):  # the output first
        seen[b] += 1
        if owned(n):
            add(n, b)
        for s in n.src:
            if s is not None and owned(s):
                add(s, b)
        if sizes[b] > below[b]:
            return False
        if k % step == 0 and any(c and z + (x - z) * per[i] // c > y for i, (x, y, z, c)
                                 in enumerate(zip(sizes, below, base, seen, strict=True))):
            return False
    return True
