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

from collections.abc import Callable, Sequence

from offload_planner.core.compute.allocator import GraphAllocator
from offload_planner.core.compute.ggml import VIEW_OPS, T, nbytes, row_size


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



def any_placement_bound(sizer: GraphAllocator, nodes: Sequence[T], srcs: Sequence[Sequence[T | None]],
                        leafs: Sequence[T]) -> list[int]:
    """A bound of the graph's reserve (nodes with their sources before pass 5, leafs) under every
    placement that builds this graph, but for the copies of sources in a buffer
    (:func:`located_copies` adds them): each tensor the allocator owns counted on every backend,
    plus on every backend a split-input copy of each source pass 5 may copy there.  Pass 5 copies a
    source to the backend of a real node reading it from elsewhere (each source once per backend;
    the copy has its shape)."""
    everything = (*leafs, *nodes, *(s for ss in srcs for s in ss))
    mine = dict.fromkeys(t for t in everything if t is not None and owned(t))
    copied: dict[T, None] = {}
    for n, ss in zip(nodes, srcs, strict=True):
        if n.op not in VIEW_OPS:
            copied.update((s, None) for s in ss if s is not None and s.location is None)
    return [x + y for x, y in zip(_sizes(sizer, mine), copy_sizes(sizer, copied), strict=True)]


def _sizes(sizer: GraphAllocator, tensors: dict[T, None]) -> list[int]:
    """Per backend, the aligned sizes ``sizer`` gives each of ``tensors`` there (a backend that is not
    CUDA-like sizes a tensor by its bytes: one sum per alignment)."""
    plain = [nbytes(t) for t in tensors]
    by_align: dict[int, int] = {}
    out = []
    for b, be in enumerate(sizer.backends):
        a = be.alignment
        if be.cuda_like:
            out.append(sum(-(-sizer.size(t, b) // a) * a for t in tensors))
            continue
        if a not in by_align:
            by_align[a] = sum(-(-x // a) * a for x in plain)
        out.append(by_align[a])
    return out


def located_copies(nodes: Sequence[T], readers: Sequence[tuple[T, list[int]]],
                   pinned: Callable[[int], T | None]) -> dict[T, None]:
    """The sources in a buffer (a weight, a KV cache or views of them) that pass 5 may copy under some
    placement: ``readers`` gives each such source with the nodes reading it.  One is left out for a
    reader that can only run where it is: ``pinned(i)`` is node ``i``'s first weight source when pass 1
    always gives the node that weight's backend (not forced, no input, no op offload), and a node in a
    buffer runs there, so a source in the same buffer is never copied for it."""
    out: dict[T, None] = {}
    for s, idx in readers:
        base = s.view_src if s.view_src is not None else s
        for i in idx:
            n = nodes[i]
            if n.op in VIEW_OPS or pinned(i) is s:
                continue
            if n.location is not None and (n.view_src if n.view_src is not None else n) is base:
                continue
            out[s] = None
            break
    return out


def copy_sizes(sizer: GraphAllocator, sources: dict[T, None]) -> list[int]:
    """Per backend, the aligned sizes of a split-input copy of each of ``sources`` there
    (``GraphAllocator.size`` of a copy: its source's shape and type, no op)."""
    out = []
    for be in sizer.backends:
        a, total = be.alignment, 0
        for s in sources:
            size = nbytes(s)
            if be.cuda_like and s.type.quantized and s.ne[0] % 512:
                size += row_size(s.type, 512 - s.ne[0] % 512)
            total += -(-size // a) * a
        out.append(total)
    return out
