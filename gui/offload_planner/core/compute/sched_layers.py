"""The scheduler's passes over a kept graph, layer by layer, each layer's result taken from an earlier
layer of the same structure that the pass met with the same inputs.

``Scheduler.split_graph`` walks the whole graph node by node in every pass (pass 1, the four sweeps of
pass 2, pass 5), though most of a model's layers are the same graph on the same devices.  A kept graph
(:mod:`.template`) knows its layers (:class:`.jumps.LayerCodes`: where each starts and an id of its
structure relative to the layer); here each layer also has the list of the tensors its nodes read
from outside it (the layer before, weights and caches, shared inputs), in the order the nodes first
read them.  Two layers with the same code and these lists lined up are the same computation, node
for node; each pass is, per layer, a function of a few inputs it reads, made explicit here:

- pass 1 (the backend of every node): the devices of the outside tensors and the backends forced on
  the layer's nodes;
- each sweep of pass 2: the layer's backends before it and the backend carried into the layer;
- pass 5 (splits, split inputs, copies): the layer's backends, the outside tensors' backends and
  buffers, which of them already have a copy on which backend, the current backend and whether the
  current split has inputs.

A layer whose inputs to a pass equal those of an earlier layer of the same code (in this call) takes
the earlier result: the backends as a list slice, pass 5's effects (new splits, copies made, sources
rewired to copies) replayed on the layer's own tensors.  Pass 4 (views take their source's backend,
unassigned sources their consumer's) is taken the same way, by the backends of the layer's nodes and
outside tensors; pass 3 runs on the layers where pass 2 left a real node unassigned.  The key
holds everything the pass reads, so the result is the pass's own, exactly; ``stats["sched_layers"]``
counts the layers taken.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

from offload_planner.core.compute.ggml import VIEW_OPS, Graph, T
from offload_planner.core.compute.jumps import LayerCodes
from offload_planner.core.compute.scheduler import Backend, Scheduler, Split
from offload_planner.core.compute.stats import stats

#: a pass 5 effect: (0, position, backend) a new split; (1, ref, backend) a copy made and added to the
#: current split's inputs; (2, position, slot, ref, backend) a source rewired to a copy.  Positions are
#: relative to the layer start; a ref >= 0 is a node of the layer (relative), < 0 ``~k`` the k-th
#: outside tensor
_Effect = tuple[int, ...]


@dataclass(frozen=True)
class LayerRefs:
    """A kept graph's segments (the nodes before the first layer, then each layer; ``-1``: the code of
    the first) and per segment the outside tensors its nodes read (view sources and sources), the
    relative positions of its real (non-view) nodes and its index among the outside tensors."""

    bounds: list[tuple[int, int]]
    codes: list[int]
    ext: list[tuple[T, ...]]
    ext_index: list[dict[int, int]]
    real: list[list[int]]
    ext_vs: list[tuple[T, ...]]  # the view sources of the outside tensors that have one
    ext_ids: list[tuple[int, ...]]


def layer_refs(g: Graph, codes: LayerCodes) -> LayerRefs:
    """The segments of ``g`` (its nodes as the builder left them: sources not rewired)."""
    pos = _ref_positions(g, codes)
    every = [*g.leafs, *g.nodes]
    ext = [tuple(map(every.__getitem__, e)) for e in pos.ext]
    ext_ids = [tuple(map(id, e)) for e in ext]
    return LayerRefs(pos.bounds, pos.codes, ext, [dict(zip(e, range(len(e)), strict=True)) for e in ext_ids],
                     pos.real, [tuple(map(every.__getitem__, v)) for v in pos.ext_vs], ext_ids)


@dataclass(frozen=True)
class _Positions:
    """:class:`LayerRefs` of a topology, the tensors by position among the graph's leafs then nodes (the
    same in every graph the template copies)."""

    bounds: list[tuple[int, int]]
    codes: list[int]
    ext: list[tuple[int, ...]]
    ext_vs: list[tuple[int, ...]]
    real: list[list[int]]


def _positions(g: Graph, codes: LayerCodes) -> _Positions:
    nodes = g.nodes
    starts = codes.starts
    cuts = [0, *starts] if not starts or starts[0] > 0 else list(starts)
    seg_codes = ([-1] if len(cuts) > len(starts) else []) + list(codes.codes)
    bounds = [(a, cuts[k + 1] if k + 1 < len(cuts) else len(nodes)) for k, a in enumerate(cuts)]
    n_leafs = len(g.leafs)
    where = {id(t): k for k, t in enumerate(g.leafs)}
    where.update((id(n), n_leafs + u) for u, n in enumerate(nodes))
    ext: list[tuple[int, ...]] = []
    ext_vs: list[tuple[int, ...]] = []
    real: list[list[int]] = []
    for a, b in bounds:
        lo, hi = n_leafs + a, n_leafs + b
        order: dict[int, None] = {}
        for n in nodes[a:b]:
            for x in (n.view_src, *n.src):
                if x is not None:
                    k = where[id(x)]
                    if not lo <= k < hi:
                        order.setdefault(k)
        ext.append(tuple(order))
        every_vs = (nodes[k - n_leafs] if k >= n_leafs else g.leafs[k] for k in order)
        ext_vs.append(tuple(where[id(t.view_src)] for t in every_vs if t.view_src is not None))
        real.append([u - a for u in range(a, b) if nodes[u].op not in VIEW_OPS])
    return _Positions(bounds, seg_codes, ext, ext_vs, real)


#: positions by layer codes (a topology's, shared by the copies of its graph), a few
_POSITIONS: OrderedDict[int, tuple[LayerCodes, _Positions]] = OrderedDict()


def _ref_positions(g: Graph, codes: LayerCodes) -> _Positions:
    got = _POSITIONS.get(id(codes))
    if got is None or got[0] is not codes:
        got = _POSITIONS[id(codes)] = (codes, _positions(g, codes))
        if len(_POSITIONS) > 4:
            _POSITIONS.popitem(last=False)
    _POSITIONS.move_to_end(id(codes))
    return got[1]


#: segments by kept graph (the graph itself kept to tell a reused id apart), a few
_REFS: OrderedDict[int, tuple[Graph, LayerCodes, LayerRefs]] = OrderedDict()


def cached_refs(g: Graph, codes: LayerCodes) -> LayerRefs:
    """:func:`layer_refs` of a kept graph, worked out at its first walk with these codes."""
    got = _REFS.get(id(g))
    if got is None or got[0] is not g or got[1] is not codes:
        got = _REFS[id(g)] = (g, codes, layer_refs(g, codes))
        if len(_REFS) > 4:
            _REFS.popitem(last=False)
    _REFS.move_to_end(id(g))
    return got[2]


_bid = attrgetter("bid")
_dev = attrgetter("dev")


def _changed(ts: Sequence[T], before: tuple[int, ...]) -> list[tuple[int, int]]:
    """(position, backend) of the tensors whose backend is not the one ``before`` gives."""
    return [(r, x) for r, (x, y) in enumerate(zip(map(_bid, ts), before, strict=True)) if x != y]


class LayerScheduler(Scheduler):
    """``Scheduler.split_graph`` over a kept graph whose layers are known (see the module)."""

    def __init__(self, backends: list[Backend], n_copies: int, op_offload: bool, refs: LayerRefs) -> None:
        super().__init__(backends, n_copies, op_offload)
        self.refs = refs
        self.copied: dict[int, int] = {}  # id(tensor) -> bit mask of the backends holding a copy of it
        self.cur = -1  # pass 5's current backend between segments
        self._pos: dict[int, int] = {}  # id -> position of the nodes of the segment pass 5 walks

    def split_graph(self, g: Graph, *, keep_forced: bool = True) -> None:
        forced = g.forced if keep_forced else {}
        nodes = g.nodes
        _, bids, unassigned = self.passes_1_2(g, forced)
        for n, b in zip(nodes, bids, strict=True):
            n.bid = b
        for s in unassigned:  # pass 3 assigns only real nodes pass 2 left unassigned
            a, b = self.refs.bounds[s]
            self.pass3(nodes[a:b])
        self.pass4_layers(nodes)
        self._pass5_layers(nodes)
        self.build_copy(g)

    # --- pass 1 and pass 2, on a list of the nodes' backends

    def passes_1_2(self, g: Graph, forced: dict[int, str]) -> tuple[list[int], list[int], list[int]]:
        """Pass 1 (the leafs' backends set, the nodes' returned) and pass 2 (the nodes' backends after
        it, and the segments where it left a real node unassigned, for pass 3); the nodes' ``bid``
        untouched."""
        self._leafs_pass1(g.leafs, forced)
        p1 = self._pass1(g.nodes, forced)
        bids = list(p1)
        unassigned: list[int] = []
        for k, (forward, skip_cpu) in enumerate(((True, True), (False, True), (True, False), (False, False))):
            unassigned = self._sweep(bids, k, forward, skip_cpu)
        return p1, bids, unassigned

    def _leafs_pass1(self, leafs: list[T], forced: dict[int, str]) -> None:
        """Pass 1 on the leafs: a forced backend, else the one of the buffer a leaf's data is in (a
        weight or cache: ``from_buffer``, inlined), else ``backend_of``."""
        ids, cpu = self.ids, self.cpu
        get = ids.get
        for t in leafs:
            if id(t) in forced:
                t.bid = self.forced_ids[forced[id(t)]]
            elif t.view_src is None and t.dev is not None:
                t.bid = get(t.dev, cpu)
            else:
                t.bid = self.backend_of(t)

    def _pass1(self, nodes: list[T], forced: dict[int, str]) -> list[int]:
        refs, ids = self.refs, self.forced_ids
        starts = [a for a, _ in refs.bounds]
        on_layer: list[list[tuple[int, str]]] = [[] for _ in starts]
        if forced:
            index = {id(n): u for u, n in enumerate(nodes)}
            for i, dev in forced.items():
                u = index.get(i)
                if u is not None:
                    s = bisect.bisect_right(starts, u) - 1
                    on_layer[s].append((u - starts[s], dev))
        memo: dict[tuple[object, ...], list[int]] = {}
        bids: list[int] = []
        for s, (a, b) in enumerate(refs.bounds):
            # the buffers of the outside tensors (``from_buffer``) and the forced backends
            key = (refs.codes[s], tuple(map(_dev, refs.ext[s])), tuple(map(_dev, refs.ext_vs[s])),
                   tuple(sorted(on_layer[s])))
            got = memo.get(key)
            if got is None:
                got = memo[key] = [ids[forced[id(n)]] if id(n) in forced else self.backend_of(n)
                                   for n in nodes[a:b]]
            else:
                stats["sched_layers"] += 1
            bids.extend(got)
        return bids

    def _sweep(self, bids: list[int], k: int, forward: bool, skip_cpu: bool) -> list[int]:
        """One sweep of pass 2 (``Scheduler.expand``) over the real nodes, segment by segment; returns the
        segments with a real node left unassigned, in order."""
        refs, cpu = self.refs, self.cpu
        memo: dict[tuple[object, ...], tuple[list[int], int, bool]] = {}
        cur = -1
        segs = range(len(refs.bounds)) if forward else range(len(refs.bounds) - 1, -1, -1)
        unassigned: list[int] = []
        for s in segs:
            a, b = refs.bounds[s]
            key = (refs.codes[s], tuple(bids[a:b]), cur)
            got = memo.get(key)
            if got is not None:
                bids[a:b], cur, left = got
                stats["sched_layers"] += 1
            else:
                left = False
                for r in (refs.real[s] if forward else reversed(refs.real[s])):
                    x = bids[a + r]
                    if x != -1:
                        cur = -1 if (skip_cpu and x == cpu) else x
                    elif cur != -1:
                        bids[a + r] = cur
                    else:
                        left = True
                memo[key] = (bids[a:b], cur, left)
            if left:
                unassigned.append(s)
        return unassigned if forward else unassigned[::-1]

    def pass4_layers(self, nodes: list[T]) -> None:
        """``Scheduler.pass4`` a segment at a time: the backends it gives the segment's nodes and the
        outside tensors it reads, by the backends they have before it."""
        refs = self.refs
        memo: dict[tuple[object, ...], tuple[list[tuple[int, int]], list[tuple[int, int]]]] = {}
        for s, (a, b) in enumerate(refs.bounds):
            seg, ext = nodes[a:b], refs.ext[s]
            before, ext_before = tuple(map(_bid, seg)), tuple(map(_bid, ext))
            key = (refs.codes[s], before, ext_before, tuple(map(_bid, refs.ext_vs[s])))
            got = memo.get(key)
            if got is None:
                self.pass4(seg)
                memo[key] = (_changed(seg, before), _changed(ext, ext_before))
                continue
            stats["sched_layers"] += 1
            for r, x in got[0]:
                seg[r].bid = x
            for k, x in got[1]:
                ext[k].bid = x

    # --- pass 5

    def _pass5_layers(self, nodes: list[T]) -> None:
        """``Scheduler._pass5``, a segment at a time (see the module)."""
        refs = self.refs
        first = next((k for k, n in enumerate(nodes) if n.op not in VIEW_OPS), len(nodes))
        split = Split(nodes[first].bid if first < len(nodes) else self.cpu, 0)
        self.splits = [split]
        self.cur = split.backend
        memo: dict[tuple[object, ...], tuple[list[_Effect], int]] = {}
        for s, (a, b) in enumerate(refs.bounds):
            if b <= first:
                continue
            key = self._p5_key(s, nodes, a, b)
            got = memo.get(key)
            if got is None:
                effects: list[_Effect] = []
                self._p5_walk(nodes, s, max(a, first), b, effects)
                memo[key] = (effects, self.cur)
            else:
                stats["sched_layers"] += 1
                self._p5_replay(nodes, s, a, got[0])
                self.cur = got[1]
        self.splits[-1].i_end = len(nodes)

    def _p5_key(self, s: int, nodes: list[T], a: int, b: int) -> tuple[object, ...]:
        """What pass 5 reads of segment ``s``: its nodes' backends, the outside tensors' backends,
        buffers and copies, the current backend and whether the current split has inputs."""
        refs = self.refs
        ext, vs = refs.ext[s], refs.ext_vs[s]
        return (refs.codes[s], tuple(map(_bid, nodes[a:b])), tuple(map(_bid, ext)), tuple(map(_dev, ext)),
                tuple(map(_bid, vs)), tuple(map(_dev, vs)), tuple(map(self.copied.get, refs.ext_ids[s])),
                self.cur, bool(self.splits[-1].inputs))

    def _ref(self, s: int, a: int, t: T, nodes: list[T]) -> int:
        k = self.refs.ext_index[s].get(id(t))
        if k is not None:
            return ~k
        r = self._pos[id(t)] - a
        assert nodes[a + r] is t
        return r

    def _p5_walk(self, nodes: list[T], s: int, lo: int, b: int, effects: list[_Effect]) -> None:
        """``Scheduler._pass5`` over nodes ``lo`` to ``b`` of segment ``s``, noting its effects."""
        a = self.refs.bounds[s][0]
        self._pos = {id(n): u for u, n in enumerate(nodes[a:b], a)}
        split = self.splits[-1]
        cur = self.cur
        for i in range(lo, b):
            n = nodes[i]
            if n.op in VIEW_OPS:
                continue
            need_new = n.bid == cur and bool(split.inputs) and any(
                y is not None and y.weights and y.bid != cur and not self.supports(y, cur) for y in n.src)
            if n.bid != cur or need_new:
                split.i_end = i
                split = Split(n.bid, i)
                self.splits.append(split)
                cur = n.bid
                effects.append((0, i - a, cur))
            for j, x in enumerate(n.src):
                if x is None or x.bid == cur or self.supports(x, cur):
                    continue
                key = (id(x), cur)
                if key not in self.copies:
                    self._copy(x, cur, split)
                    effects.append((1, self._ref(s, a, x, nodes), cur))
                n.src[j] = self.copies[key][0]
                effects.append((2, i - a, j, self._ref(s, a, x, nodes), cur))
        self.cur = cur

    def _copy(self, x: T, cur: int, split: Split) -> None:
        self.copies[(id(x), cur)] = [self.input_copy(x, c) for c in range(self.n_copies)]
        self.copied[id(x)] = self.copied.get(id(x), 0) | (1 << cur)
        split.inputs.append(x)

    def _p5_replay(self, nodes: list[T], s: int, a: int, effects: list[_Effect]) -> None:
        """The effects an earlier segment's walk noted, on segment ``s`` (starting at ``a``)."""
        ext = self.refs.ext[s]
        for e in effects:
            if e[0] == 0:
                split = Split(e[2], a + e[1])
                self.splits[-1].i_end = a + e[1]
                self.splits.append(split)
            elif e[0] == 1:
                self._copy(ext[~e[1]] if e[1] < 0 else nodes[a + e[1]], e[2], self.splits[-1])
            else:
                x = ext[~e[3]] if e[3] < 0 else nodes[a + e[3]]
                nodes[a + e[1]].src[e[2]] = self.copies[(id(x), e[4])][0]
