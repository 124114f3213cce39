"""The reference run's allocator walk (:mod:`.recording`): the graph allocator recording per-backend
events and checkpoints of its state (free blocks, maxima and peak labels, live tensors with the counts
to come), and each checkpoint's maxima to come (:class:`Rest`), made when a replay first asks."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

from offload_planner.core.compute.allocator import DynAllocator, GraphAllocator, peak_label
from offload_planner.core.compute.ggml import T
from offload_planner.core.compute.periods import Event, Jumped
from offload_planner.core.compute.scheduler import Backend, Split


class Refuse(Exception):
    """The replay cannot prove itself equal to the full run: run it in full."""


# --- the recording walk -----------------------------------------------------------------------------


class RecDyn(DynAllocator):
    def __init__(self, alignment: int, events: list[tuple[int, int, str]], rec: RecAlloc) -> None:
        super().__init__(alignment)
        self.events = events
        self.rec = rec
        self.shared: list[list[int]] | None = None  # the checkpoints' copy of ``blocks`` while unchanged

    def alloc(self, size: int) -> int:
        self.shared = None
        before = self.max_size
        off = super().alloc(size)
        if self.max_size != before:
            self.rec.grown = True  # (only then may the peaks move)
        self.events.append((self.rec.pos, off + self.align(size), self.rec.where))  # where: on_alloc's
        return off

    def free(self, offset: int, size: int) -> None:
        self.shared = None
        super().free(offset, size)


class RecAlloc(GraphAllocator):
    """``GraphAllocator.run`` that also keeps a checkpoint at every split start."""

    def __init__(self, backends: list[Backend]) -> None:
        super().__init__(backends)
        self.pos = -1
        self.grown = True  # a maximum moved since the last checkpoint: its max_size and peaks are new
        self.events: list[list[tuple[int, int, str]]] = [[] for _ in backends]
        self.recs = [RecDyn(b.alignment, self.events[i], self) for i, b in enumerate(backends)]
        self.allocs = list(self.recs)
        self.objs: dict[int, T] = {}
        self.cand: set[int] = set()  # allocated, maybe live (counts only fall after the counting pass)
        # per backend, every allocator event in walk order (position of the node in tail_pos):
        # (0 alloc, t, t, size, 0, peak label) | (1 in place, t, parent, psize, nsize, "")
        # | (2 free, t, t, size, 0, "")
        self.tail: list[list[Event]] = [[] for _ in backends]
        self.tail_pos: list[list[int]] = [[] for _ in backends]
        self.cks: dict[int, Checkpoint] = {}
        self.jumped: Jumped | None = None  # the stretches a jumping walk wrote from an earlier period
        # one list per distinct state (DeepSeek-V3: ~100 among ~5,000 backends' states at ~1,000
        # checkpoints): fewer objects for the cycle collector to walk; the replay only reads them
        self.states: dict[tuple[tuple[int, ...], ...], list[list[int]]] = {}
        self.max_sizes: list[int] = []  # the maxima and peak labels of the last checkpoint
        self.peak_list: list[str] = []

    # a tensor the walk allocates (a new block or its parent's, ``frees_tail`` on) becomes a candidate
    # for the checkpoints' live tensors here, where ``allocate`` makes it owned

    def on_alloc(self, t: T, bid: int, size: int) -> None:
        self.tail_pos[bid].append(self.pos)
        # the peak label the walk gives this allocation (the counting pass's: none), also its event's
        cur = self.cur
        where = self.where = "" if cur is None else peak_label(cur, self.layer)
        self.tail[bid].append((0, t, t, size, 0, where))
        i = id(t)
        if i not in self.cand:
            self.objs[i] = t
            self.cand.add(i)

    def on_inplace(self, t: T, p: T, bid: int, psize: int, nsize: int) -> None:
        self.tail_pos[bid].append(self.pos)
        self.tail[bid].append((1, t, p, psize, nsize, ""))
        i = id(t)
        if i not in self.cand:
            self.objs[i] = t
            self.cand.add(i)

    def on_free(self, t: T, bid: int, size: int) -> None:
        self.tail_pos[bid].append(self.pos)
        self.tail[bid].append((2, t, t, size, 0, ""))

    def run_rec(self, nodes: list[T], node_ids: list[int], leafs: list[T], leaf_ids: list[int],
                checkpoints: set[int]) -> tuple[list[int], dict[int, Checkpoint]]:
        if self.count(nodes, node_ids, leafs, leaf_ids):
            raise Refuse("inputs allocated by the counting pass")
        cks = self.cks
        snap = self.snap
        for pos, (n, bid) in enumerate(zip(nodes, node_ids, strict=True)):
            if pos in checkpoints:
                cks[pos] = snap()
            self.pos = pos
            self.step(n, bid)
        return [a.max_size for a in self.allocs], cks

    def snap(self) -> Checkpoint:
        """The checkpoint of the walk's state here (before the next node)."""
        own, objs, cand = self.own, self.objs, self.cand
        live = {}
        dead = []
        for i in cand:
            t = objs[i]
            if i in own and (t.n_children or t.n_views):
                assert t.alloc is not None
                live[t] = (t.alloc, t.n_children, t.n_views)
            else:
                dead.append(i)
        if dead:
            cand.difference_update(dead)
        for a in self.recs:
            if a.shared is None:
                a.shared = _shared(self.states, a.blocks)
        if self.grown:  # else the lists of the checkpoint before (the replay only reads them)
            self.grown = False
            self.max_sizes, self.peak_list = [a.max_size for a in self.recs], list(self.peaks)
        blocks = [a.shared for a in self.recs if a.shared is not None]
        return Checkpoint(blocks, self.max_sizes, self.peak_list, self.layer, live)


def _shared(states: dict[tuple[tuple[int, ...], ...], list[list[int]]], blocks: list[list[int]]
            ) -> list[list[int]]:
    """A copy of an allocator's free blocks, the same list for equal states."""
    key = tuple(map(tuple, blocks))
    got = states.get(key)
    if got is None:
        got = states[key] = [list(b) for b in blocks]
    return got


#: the live tensors of a checkpoint: (backend, offset), child and view counts to come
Live = dict[T, tuple[tuple[int, int], int, int]]
#: makes a reference's recording walk from its backends, graph nodes, splits and layer tags
Walker = Callable[[list[Backend], list[T], list[Split], dict[T, str]], RecAlloc]


@dataclass
class Checkpoint:
    blocks: list[list[list[int]]]
    max_size: list[int]
    peaks: list[str]
    layer: str
    _live: Live | None  # the live tensors (None: not made yet, see ``_make``)
    #: makes them the first time they are asked for (a checkpoint written from another, :mod:`.rec_jumps`:
    #: a replay asks for a few dozen of a reference's thousand)
    _make: Callable[[], Live] | None = None
    #: the reference's maxima from each allocation on, and this checkpoint's position (see ``suffix``)
    rest: tuple[Rest, int] | None = None
    _suffix: list[tuple[int, str]] | None = None
    _live_on: list[tuple[tuple[T, ...], tuple[int, ...]]] | None = None

    @property
    def suffix(self) -> list[tuple[int, str]] | None:
        """Per backend, the largest end of an allocation at or after this checkpoint and the label of the
        first allocation reaching it ((-1, "") for none); made when first asked for."""
        if self._suffix is None and self.rest is not None:
            self._suffix = self.rest[0].at(self.rest[1])
        return self._suffix

    @property
    def live(self) -> Live:
        """The tensors the graph allocator owns here with a child or view to come: their (backend,
        offset), remaining child and view counts."""
        if self._live is None:
            assert self._make is not None
            self._live, self._make = self._make(), None
        return self._live

    def live_on(self, b: int, n_backends: int, first: dict[T, int]) -> tuple[tuple[T, ...], tuple[int, ...]]:
        """The live tensors on backend ``b`` and their offsets, the latest created first (where two
        states differ: long-lived inputs rarely move)."""
        if self._live_on is None:
            on: list[list[tuple[T, int]]] = [[] for _ in range(n_backends)]
            for t, ((tb, off), _, _) in sorted(self.live.items(), key=lambda e: -first.get(e[0], -1)):
                on[tb].append((t, off))
            self._live_on = [(tuple(t for t, _ in e), tuple(off for _, off in e)) for e in on]
        return self._live_on[b]


class Rest:
    """Per backend, from each of a walk's allocations (``RecAlloc.events``: position, end, label) on, the
    largest end and the label of the first allocation reaching it."""

    def __init__(self, events: list[list[tuple[int, int, str]]]) -> None:
        self.pos = [[e[0] for e in evs] for evs in events]
        self.best: list[list[tuple[int, str]]] = []
        for evs in events:
            best: tuple[int, str] = (-1, "")
            out = [best] * (len(evs) + 1)
            for k in range(len(evs) - 1, -1, -1):
                e = evs[k]
                if e[1] >= best[0]:
                    best = (e[1], e[2])
                out[k] = best
            self.best.append(out)

    def at(self, p: int) -> list[tuple[int, str]]:
        """Per backend, the largest end at or after position ``p`` and its first label."""
        return [best[bisect.bisect_left(pos, p)] for pos, best in zip(self.pos, self.best, strict=True)]
