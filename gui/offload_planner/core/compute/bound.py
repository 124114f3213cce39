"""An upper bound of a reserve's compute buffers without the allocator's walk.

``ggml_dyn_tallocr`` takes a block from its free list or from the end, and gives freed blocks back
(merged with the end when they touch it): its highest end never passes the sum of the (aligned) sizes
it was asked for.  On a backend the graph allocator asks for each tensor it owns at most once: the
nodes on that backend, the sources of those nodes (graph inputs are allocated at their first use,
on the reader's backend), the graph's leafs on theirs.  So the sum of those sizes, each tensor counted
once per backend, bounds what the reserve reaches there.

The incremental replay (:mod:`.replay`) uses it to leave out the one-token reserve where the prompt
reserve is larger on every backend anyway: llama.cpp keeps the larger of the two per backend, and a
one-token graph's tensors are a few rows each; so does a plain one-shot simulation
(:func:`.reserve.reserve_below`: :func:`unproven`, then on the host :func:`lifetime_bound`, which
follows the tensors' lifetimes where the sum over 60 layers is too loose).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from offload_planner.core.compute.allocator import GraphAllocator
from offload_planner.core.compute.ggml import INPLACE_OPS, INPUT, OUTPUT, VIEW_OPS, T, nbytes, row_size


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


def unproven(sizer: GraphAllocator, nodes: Sequence[T], ids: Sequence[int], leafs: Sequence[T],
             leaf_ids: Sequence[int], below: Sequence[int]) -> int | None:
    """None where a bound of a scheduled graph's reserve is at most ``below`` on every backend, else
    the backend it gave up on.  The bound: its nodes and their sources as :func:`graph_bound` counts
    them, each leaf the allocator owns on its own backend (the allocator gives a leaf memory there,
    before the walk).

    A quick give-up (never a wrong None): at once where a backend running some of the nodes has nothing
    in ``below``; at the first backend past ``below``; and at each tenth of the nodes, where a
    backend's sum over its nodes so far, scaled to all of its nodes, is past it (a backend's nodes
    repeat layer after layer: the bound would not hold).  The nodes are summed from the last: a
    backend holding the output layer alone (the one-token graph's logits and norms against a prompt
    reserve of a few rows) fails there, at once."""
    per = Counter(ids)
    for b in per:
        if not below[b]:  # a backend with nodes here and an empty prompt reserve
            return b
    aligns = [a.alignment for a in sizer.allocs]
    size = sizer.size
    counted: list[set[T]] = [set() for _ in aligns]  # Bound.add inlined: ~10,000 sources a graph
    sizes = [0] * len(aligns)
    for leaf, b in zip(leafs, leaf_ids, strict=True):
        if owned(leaf) and leaf not in counted[b]:
            counted[b].add(leaf)
            sizes[b] += -(-size(leaf, b) // aligns[b]) * aligns[b]
    base, seen = list(sizes), [0] * len(sizes)
    step = max(len(nodes) // 10, 1)
    for k, (n, b) in enumerate(zip(reversed(nodes), reversed(ids), strict=True), 1):  # the output first
        seen[b] += 1
        mine, a = counted[b], aligns[b]
        for t in (n, *n.src):
            if t is not None and t.view_src is None and t.dev is None and t not in mine:
                mine.add(t)
                sizes[b] += -(-size(t, b) // a) * a
        if sizes[b] > below[b]:
            return b
        if k % step == 0:
            for i, (x, y, z, c) in enumerate(zip(sizes, below, base, seen, strict=True)):
                if c and z + (x - z) * per[i] // c > y:
                    return i
    return next((i for i, (x, y) in enumerate(zip(sizes, below, strict=True)) if x > y), None)


def lifetime_bound(sizer: GraphAllocator, nodes: Sequence[T], ids: Sequence[int], leafs: Sequence[T],
                   leaf_ids: Sequence[int]) -> list[int]:
    """A bound of a scheduled graph's reserve per backend that follows the tensors' lifetimes.

    The counting pass allocates the leafs and the graph inputs first, from offset 0: they end below the
    sum of their sizes.  After that, the allocator's top (its free tail's start: the highest end of a
    live block, freed blocks being merged) rises by at most a block's size at each allocation.  So
    wherever every tensor the walk allocated on a backend is freed again (a reset: each layer's
    tensors on the host die before the next layer's expert split there), the top is back under the
    inputs, and the reserve is at most the inputs plus the largest sum of blocks allocated between two
    resets.  A tensor's death is taken at its last reader (or its views' last reader), never where the
    allocator would keep it (an output; no reader; a view without one): such a tensor stays, under
    the top it was allocated at, and every later reset starts from there.  A node that may take over
    a source's block in place (``INPLACE_OPS``) keeps that block alive as long as itself."""
    n_b = len(sizer.allocs)
    aligns = [a.alignment for a in sizer.allocs]
    size = sizer.size

    def block(t: T, b: int) -> int:
        return -(-size(t, b) // aligns[b]) * aligns[b]

    inputs = [0] * n_b
    initial: set[T] = set()
    for leaf, b in zip(leafs, leaf_ids, strict=True):
        if owned(leaf) and leaf not in initial:
            initial.add(leaf)
            inputs[b] += block(leaf, b)
    born: dict[T, tuple[int, int]] = {}  # allocated by the walk: (position, backend)
    last: dict[T, int] = {}  # position of the last reader
    read_views: set[T] = set()
    views: list[tuple[T, T]] = []  # (view, its source) of the views the allocator counts
    for i, (n, b) in enumerate(zip(nodes, ids, strict=True)):
        for s in n.src:
            if s is None:
                continue
            root = s.view_src
            if root is not None:
                read_views.add(s)
                last[root] = i
            elif s.dev is None:  # owned
                last[s] = i
                if s in born or s in initial:
                    continue
                if s.flags & INPUT:
                    initial.add(s)
                    inputs[b] += block(s, b)
                else:
                    born[s] = (i, b)
        root = n.view_src
        if root is None:
            if n.dev is None and n not in initial:
                if n.flags & INPUT:
                    initial.add(n)
                    inputs[b] += block(n, b)
                else:
                    born[n] = (i, b)
        elif n.op != "NONE":
            views.append((n, root))
    never = len(nodes)
    for v, root in views:
        if v not in read_views:
            last[root] = never  # its count of views never comes back to 0
    for t in born:
        if t.flags & OUTPUT or t not in last:
            last[t] = never
    for n in reversed(nodes):  # a block taken over in place lives as long as its new owner
        if n.op in INPLACE_OPS and n in born:
            end = last[n]
            for p in n.src:
                if p is not None and p in last and last[p] < end:
                    last[p] = end
    return _walk_lifetimes(born, last, never, inputs, block)


def _walk_lifetimes(born: dict[T, tuple[int, int]], last: dict[T, int], never: int, inputs: list[int],
                    block: Callable[[T, int], int]) -> list[int]:
    """:func:`lifetime_bound`'s sweep over the allocations (``born``: in walk order) and the deaths in
    walk order (a death at a position comes after that position's allocations)."""
    n_b = len(inputs)
    deaths = sorted((end, b) for t, (_, b) in born.items() if (end := last[t]) < never)
    deaths.append((never, -1))
    floor, peak, kept = list(inputs), list(inputs), list(inputs)
    live, run = [0] * n_b, [0] * n_b
    d = 0
    for t, (i, b) in born.items():
        while deaths[d][0] < i:  # the deaths of earlier positions
            db = deaths[d][1]
            live[db] -= 1
            if not live[db]:
                floor[db], run[db] = kept[db], 0
            d += 1
        run[b] += block(t, b)
        top = floor[b] + run[b]
        if top > peak[b]:
            peak[b] = top
        if last[t] >= never:
            kept[b] = max(kept[b], top)
        else:
            live[b] += 1
    return peak

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
