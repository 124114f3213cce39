"""Whole periods of equal layers jumped in a from-scratch allocation walk over a kept graph
(:mod:`.template`: the ``--fit`` search's dry runs far from every recorded reference).

The allocator's walk over a layer does the same as over the layer before when three things are the
same: the layer's graph (ops, shapes, strides, flags, and where each source comes from: the layer
before, the same layer, or one tensor shared by all layers), how the scheduler placed it (each node's
backend, and the split-input copies inserted into it), and the allocator's state where the layer
starts.  The first two are compared here, per layer ``j`` and ``j + q`` (``q`` = 1 or 2 layers: gpt-oss
alternates sliding-window and full attention): the graph once per topology (:class:`LayerCodes`,
positions relative to the layer), the placement per walk (backends of the layer's nodes as one list
slice, the copies from the scheduler's splits).  The state at a layer start is every backend's free
blocks, the counts (children, views) and offsets of the tensors of the layer before (the only ones a
later layer refers to other than by a shared tensor) and the set of other live tensors.

When the state at the start of layer ``l`` equals, shifted by ``q`` layers, the state at ``l - q`` and
the layers from ``l - q - 1`` on repeat with period ``q`` up to ``e`` (and the layer after, whose uses
decide the counts of ``e - 1``'s tensors), the walk from ``l`` to ``e`` repeats the one from ``l - q``
to ``l`` period after period: the same offsets, the same frees, no new maximum (so no new peak label).
It goes on at ``e`` with the tensors of layer ``e - 1`` allocated where their peers of ``l - 1`` are;
the child and view counts of the jumped nodes' sources are brought down as the walk would (a shared
tensor that would be freed, or taken over in place, inside the jump makes the walk restart without
jumps; so does any count that does not come out as the shift says).  Tensors flagged as outputs (the
pipeline-parallel input copies) are never freed nor taken over and are left out of the state.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from offload_planner.core.compute.allocator import GraphAllocator, layer_suffix
from offload_planner.core.compute.ggml import OUTPUT, T
from offload_planner.core.compute.periods import layer_starts
from offload_planner.core.compute.scheduler import Backend, Split
from offload_planner.core.compute.stats import stats

QS = (1, 2, 3, 4)


@dataclass(frozen=True)
class LayerCodes:
    """A graph's layers as the builder left it: the first node of each (by position), an id of each
    layer's structure (equal ids: the same graph, relative to the layer), and whether a layer has a
    node used two or more layers later (its counts differ from its peers': never jumped)."""

    starts: list[int]
    codes: list[int]
    pinned: list[bool]


def layer_codes(nodes: Sequence[T], srcs: Sequence[Sequence[T | None]], flags: Sequence[int],
                leafs: Sequence[T]) -> LayerCodes:
    """The codes of a graph whose nodes have the sources ``srcs`` and the flags ``flags`` (as built)."""
    node_index = {id(n): u for u, n in enumerate(nodes)}
    starts = layer_starts(nodes)
    ids: dict[tuple[object, ...], int] = {}
    codes: list[int] = []
    pinned = [False] * len(starts)
    other = _Other({id(t): k for k, t in enumerate(leafs)}, starts, pinned)
    get = node_index.get
    for li, a in enumerate(starts):
        b = starts[li + 1] if li + 1 < len(starts) else len(nodes)
        prev = starts[li - 1] if li > 0 else 0
        layer: list[tuple[object, ...]] = []
        for u in range(a, b):
            n = nodes[u]
            refs: list[object] = []
            for x in (n.view_src, *srcs[u]):
                k = None if x is None else get(id(x))
                refs.append(None if x is None else u - k if k is not None and k >= prev else other(x, k))
            layer.append((n.op, n.type.name, *n.ne, *n.nb, flags[u], n.view_offs, n.weights, n.dev is None,
                          *refs))
        codes.append(ids.setdefault(tuple(layer), len(ids)))
    return LayerCodes(starts, codes, pinned)


@dataclass
class _Other:
    """A source that is neither in its node's layer nor in the one before: another node (its position,
    negated; its layer is pinned), a weight or cache (its shape), a leaf shared by all (its position)."""

    leaf_index: dict[int, int]
    starts: list[int]
    pinned: list[bool]

    def __call__(self, x: T, k: int | None) -> object:
        if k is not None:
            m = bisect.bisect_right(self.starts, k) - 1
            if m >= 0:
                self.pinned[m] = True
            return ~k
        if x.weights or x.dev is not None:
            return ("w", x.type.name, tuple(x.ne), tuple(x.nb), x.dev is None, x.weights)
        return ("l", self.leaf_index[id(x)])


#: codes by graph topology (the template's key): a template handed to a recorded reference is built
#: again for the next walk, with the same codes
_CODES: OrderedDict[tuple[object, ...], LayerCodes] = OrderedDict()


def has_codes(key: tuple[object, ...]) -> bool:
    return key in _CODES


def cached_codes(key: tuple[object, ...], nodes: Sequence[T], srcs: Sequence[Sequence[T | None]],
                 flags: Sequence[int], leafs: Sequence[T]) -> LayerCodes:
    c = _CODES.get(key)
    if c is None or (len(c.starts) > 0 and c.starts[-1] >= len(nodes)):
        c = _CODES[key] = layer_codes(nodes, srcs, flags, leafs)
        if len(_CODES) > 4:
            _CODES.popitem(last=False)
    _CODES.move_to_end(key)
    return c


class Restart(Exception):
    """The jump did not come out as the shift says: walk again without jumps."""


class JumpingAllocator(GraphAllocator):
    """``GraphAllocator.run`` over a scheduled kept graph, jumping whole periods of equal layers."""

    def __init__(self, backends: list[Backend], codes: LayerCodes, graph_nodes: list[T],
                 node_index: dict[int, int], splits: list[Split]) -> None:
        """``node_index``: id -> position of the graph's nodes (kept with the graph)."""
        super().__init__(backends)
        self.outputs: set[int] = set()
        self.codes = codes
        self.graph_nodes = graph_nodes
        self.node_index = node_index
        self.splits = splits

    def run(self, nodes: list[T], node_ids: list[int], leafs: list[T], leaf_ids: list[int]) -> list[int]:
        try:
            return self._run(nodes, node_ids, leafs, leaf_ids)
        except Restart:
            stats["walk_restarts"] += 1
            plain = GraphAllocator(self.backends)
            sizes = plain.run(nodes, node_ids, leafs, leaf_ids)
            self.peaks, self.allocs = plain.peaks, plain.allocs
            return sizes

    # --- the per-walk layout of the layers

    def layout(self) -> tuple[list[int], list[tuple[object, ...]], list[int]]:
        """Sched positions of the layer starts, per layer the copies inserted into it, and the backend
        of every graph node."""
        c = self.codes
        starts = c.starts
        gn = self.graph_nodes
        node_index = self.node_index
        n_layers = len(starts)
        inserted: list[list[object]] = [[] for _ in range(n_layers)]
        pos: list[int] = []
        added = 0
        si = 0
        splits = self.splits
        for li, a in enumerate(starts):
            while si < len(splits) and splits[si].i_start <= a:
                sp = splits[si]
                if sp.i_start > (starts[li - 1] if li > 0 else -1) and li > 0:
                    inserted[li - 1].append(self._ins(sp, li - 1, node_index))
                added += 2 * len(sp.inputs)
                si += 1
            pos.append(a + added)
        while si < len(splits):
            if n_layers:
                inserted[-1].append(self._ins(splits[si], n_layers - 1, node_index))
            si += 1
        bids = [n.bid for n in gn]
        return pos, [tuple(x) for x in inserted], bids

    def _ins(self, sp: Split, li: int, node_index: dict[int, int]) -> tuple[object, ...]:
        starts = self.codes.starts
        a = starts[li]
        prev = starts[li - 1] if li > 0 else 0
        out: list[object] = [sp.i_start - a, sp.backend]
        for x in sp.inputs:
            k = node_index.get(id(x))
            if k is not None:
                out.append(("r", a - k, x.bid) if k >= prev else ("a", k, x.bid))
            elif x.weights or x.dev is not None:
                out.append(("w", x.type.name, tuple(x.ne), tuple(x.nb), x.bid))
            else:
                out.append(("x", id(x), x.bid))
        return tuple(out)

    def same(self, j: int, q: int, ins: list[tuple[object, ...]], bids: list[int]) -> bool:
        """Layer ``j`` walks as layer ``j + q`` (the layer after ``j + q`` existing)."""
        c = self.codes
        s = c.starts
        if j < 0 or j + q + 1 >= len(s) or c.pinned[j] or c.pinned[j + q]:
            return False
        if c.codes[j] != c.codes[j + q] or ins[j] != ins[j + q]:
            return False
        return bids[s[j]:s[j + 1]] == bids[s[j + q]:s[j + q + 1]]

    # --- the walk

    def _run(self, nodes: list[T], node_ids: list[int], leafs: list[T], leaf_ids: list[int]) -> list[int]:
        self.count(nodes, node_ids, leafs, leaf_ids)
        pos, ins, bids = self.layout()
        self.outputs = {id(t) for t in (*nodes, *leafs) if t.flags & OUTPUT}
        seen: dict[int, tuple[object, ...]] = {}
        i, n, li = 0, len(nodes), 0
        while True:
            stop = pos[li] if li < len(pos) else n
            for k in range(i, stop):
                self.step(nodes[k], node_ids[k])
            if li >= len(pos):
                return [a.max_size for a in self.allocs]
            i = stop
            to = self._at(li, nodes, pos, ins, bids, seen)
            if to is not None:
                i, li = pos[to], to
            li += 1

    def periodic(self, a: int, b: int, q: int, ins: list[tuple[object, ...]], bids: list[int]) -> bool:
        """Layers ``a`` to ``b`` (included) each walk as the one ``q`` on."""
        return all(self.same(j, q, ins, bids) for j in range(a, b + 1))

    def state(self, li: int, nodes: list[T], pos: list[int]) -> tuple[object, ...]:
        """The allocator's state at the start of layer ``li`` (see the module)."""
        own, outputs = self.own, self.outputs
        window = nodes[pos[li - 1]:pos[li]]
        wids = {id(t) for t in window}
        mine = tuple((t.n_children, t.n_views, t.alloc if id(t) in own and id(t) not in outputs else None)
                     for t in window)
        others = frozenset(x for x in own if x not in wids and x not in outputs)
        blocks = tuple(tuple(map(tuple, a.blocks)) for a in self.allocs)
        return blocks, mine, others

    def _at(self, li: int, nodes: list[T], pos: list[int], ins: list[tuple[object, ...]], bids: list[int],
            seen: dict[int, tuple[object, ...]]) -> int | None:
        """At the start of layer ``li`` (walked up to it): the layer start to go on from after a jump,
        or None (the state noted when a later layer may compare with it)."""
        if li < 1:
            return None
        run, state = self.run_from(li, 1, nodes, pos, ins, bids, seen)
        if run is not None:
            to = self.jump(li, run[1], run[0], nodes, pos)
            if to != li:
                stats["walk_jumps"] += 1
                return to
        self.note(li, state, nodes, pos, ins, bids, seen)
        return None

    def run_from(self, li: int, periods: int, nodes: list[T], pos: list[int], ins: list[tuple[object, ...]],
                 bids: list[int], seen: dict[int, tuple[object, ...]]
                 ) -> tuple[tuple[int, int, tuple[object, ...]] | None, tuple[object, ...] | None]:
        """At the start of layer ``li`` (``li >= 1``): the first period ``q`` (of ``QS``) whose state
        ``seen`` ``q`` layers before is the state now, the layers on repeat with it, and that runs for at
        least ``periods`` periods: ``(q, the last layer start the run reaches, the state)``, or None; and
        the state if it was computed (None: no period's layers were on repeat)."""
        state: tuple[object, ...] | None = None
        for q in QS:
            before = seen.get(li - q)
            if before is None or not self.periodic(li - q - 1, li, q, ins, bids):
                continue
            if state is None:
                state = self.state(li, nodes, pos)
            if before != state:
                continue
            end = li + q
            while end + q < len(pos) and self.periodic(end - q + 1, end, q, ins, bids):
                end += q
            if end - li >= periods * q:
                return (q, end, state), state
        return None, state

    def note(self, li: int, state: tuple[object, ...] | None, nodes: list[T], pos: list[int],
             ins: list[tuple[object, ...]], bids: list[int], seen: dict[int, tuple[object, ...]]) -> None:
        """Note the state at the start of layer ``li`` (``state``, or computed when None) where a later
        layer may compare with it (the layer before walks as one a period on)."""
        if any(self.same(li - 1, q, ins, bids) for q in QS):
            seen[li] = state if state is not None else self.state(li, nodes, pos)

    def jump(self, li: int, end: int, q: int, nodes: list[T], pos: list[int]) -> int:
        """From the start of layer ``li`` towards that of ``end``, stopping before a period that uses a
        shared tensor for the last time: the counts brought down as the walk would, the last jumped
        layer's tensors allocated where their peers of layer ``li - 1`` are.  Returns the layer start
        reached (``li``: none jumped, nothing changed)."""
        own, outputs = self.own, self.outputs
        w0 = nodes[pos[li - 1]:pos[li]]
        counts = [(t.n_children, t.n_views) for t in w0]
        live = [id(t) in own and id(t) not in outputs for t in w0]
        w0_ids = {id(t) for t in w0}
        others = {x for x in own if x not in w0_ids and x not in outputs}
        m = min(self._periods_allowed(nodes[pos[li]:pos[li + q]], others), (end - li) // q)
        if m == 0:
            return li
        cur = li + m * q
        _count_down_periods(nodes, pos, li, cur, q, others)
        w1 = nodes[pos[cur - 1]:pos[cur]]
        if len(w1) != len(w0) or [(t.n_children, t.n_views) for t in w1] != counts:
            raise Restart
        for t0, t1, lv in zip(w0, w1, live, strict=True):
            if lv:
                own.discard(id(t0))
                own.add(id(t1))
                t1.alloc = t0.alloc
        self._label(nodes, pos[cur])
        return cur

    def _periods_allowed(self, period: list[T], others: set[int]) -> int:
        """How many periods like ``period`` (each uses the same shared tensors as often) the walk may
        skip: none with an output to allocate, and none that uses a shared tensor for the last time."""
        own, outputs = self.own, self.outputs
        uses: dict[int, list[int]] = {}
        for nd in period:
            if id(nd) in outputs and id(nd) not in own and nd.view_src is None and nd.dev is None:
                return 0  # an output allocated here: never freed, the state moves on
            for p in nd.src:
                if p is not None and id(p) in others:
                    e = uses.get(id(p))
                    if e is None:
                        uses[id(p)] = [p.n_children, 1]
                    else:
                        e[1] += 1
        return min(((n - 1) // k for n, k in uses.values()), default=1 << 30)

    def _label(self, nodes: list[T], p: int) -> None:
        """The layer the walk names its peaks with at position ``p`` (the last named node before)."""
        for k in range(p - 1, -1, -1):
            il = layer_suffix(nodes[k].name)
            if il is not None:
                self.layer = f" (layer {il})"
                return


def _count_down_periods(nodes: list[T], pos: list[int], li: int, cur: int, q: int, others: set[int]) -> None:
    """``_count_down`` over the periods from layer ``li`` to ``cur``: the first and the last walked, each
    one between them taken as the first did to the counts that outlive the jump (the tensors the
    periods share (``others``) and the views of them from before the jump; a tensor of a jumped layer
    other than the last is never read again, nor are the counts of one the allocator does not own).
    Where a shared count would come down to zero (a view's last use, or a restart) every period is
    walked."""
    m = (cur - li) // q
    if m <= 2:
        _count_down(nodes[pos[li]:pos[cur]], others)
        return
    first = nodes[pos[li]:pos[li + q]]
    shared = _shared_counts(first, {id(t) for t in nodes[pos[li - 1]:pos[li + q]]}, others)
    before = [(t.n_children, t.n_views) for t in shared]
    _count_down(first, others)
    k = m - 2
    per = [(c0 - t.n_children, v0 - t.n_views) for t, (c0, v0) in zip(shared, before, strict=True)]
    if any(t.n_children - (k + 1) * dc <= 0 < dc or t.n_views - (k + 1) * dv < 0
           for t, (dc, dv) in zip(shared, per, strict=True)):
        _count_down(nodes[pos[li + q]:pos[cur]], others)
        return
    for t, (dc, dv) in zip(shared, per, strict=True):
        t.n_children -= k * dc
        t.n_views -= k * dv
    _count_down(nodes[pos[cur - q]:pos[cur]], others)


def _shared_counts(period: list[T], inside: set[int], others: set[int]) -> list[T]:
    """The tensors whose counts a period's walk brings down and a later one reads: the shared tensors
    (``others``) its nodes read or whose views it ends, and the views of them from outside it
    (``inside``: the ids of the period's nodes and the layer's before)."""
    out: dict[int, T] = {}
    for nd in period:
        for p in nd.src:
            if p is None:
                continue
            vs = p.view_src
            if vs is not None and id(vs) in others:
                out[id(vs)] = vs
                if id(p) not in inside:
                    out[id(p)] = p
            elif id(p) in others:
                out[id(p)] = p
    return list(out.values())


def _count_down(span: list[T], others: set[int]) -> None:
    """The child and view counts the walk's steps over ``span`` bring down (no allocation, no free: a
    shared tensor (``others``) whose count would reach zero restarts the walk)."""
    for nd in span:
        for p in nd.src:
            if p is None:
                continue
            p.n_children -= 1
            if p.n_children or p.n_views:
                continue
            vs = p.view_src
            if vs is None:
                if id(p) in others:
                    raise Restart
                continue
            vs.n_views -= 1
            if vs.n_views == 0 and vs.n_children == 0 and id(vs) in others:
                raise Restart
