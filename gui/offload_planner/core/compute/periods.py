"""Periods of a reference's allocator events: where a replay's tail (:mod:`.replay_alloc`) may jump
whole layers.

A move leaves a backend's allocator in another state than the reference's (the residual stream in
the other of two same-sized blocks) up to the next device boundary, and the tail replays the
reference's events on it layer by layer.  Most layers do the same thing: a backend's events between
the start of layer ``k`` and of layer ``k + 1`` (a *segment*) are those of the segment before, on
other tensors.  Written relative to the tensors allocated at the segment's start (in a canonical
order: those of the segment before that are still allocated, in their order, then the new ones in
the order they were allocated), two such segments are equal as data, and then they are the same
function of the allocator's state (its free blocks and the offsets of the tensors in canonical
order) to the state at their end.

So at record time each backend's segments are encoded and runs of equal segments (period 1 or 2
layers: gpt-oss alternates sliding-window and full attention) are noted.  A tail that reaches the
start of such a run notes its state; after one period, if the state is the same (a fixed point of
the period's function), every further period of the run leaves it the same and allocates at the same
offsets, so its maximum is the first period's (and the first period's labels win the ties, as the
allocator keeps the earlier allocation's): the tail goes on at the run's end, with the tensors
allocated there at the offsets their canonical peers have now.  A layer whose events differ (a
dense layer between MoE ones, a split boundary) ends a run; the tail walks it as before.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from offload_planner.core.compute.allocator import DynAllocator, layer_suffix
from offload_planner.core.compute.ggml import T
from offload_planner.core.compute.stats import stats

#: ``(kind, tensor, parent, size, new size, label)``: see ``rec_alloc.RecAlloc``
Event = tuple[int, T, T, int, int, str]
#: periods (in layers) looked for (a Q4_K_M file gives every third layer's ffn_down more bits)
_PERIODS = (1, 2, 3, 4)


@dataclass
class Periods:
    """Layer starts (positions in the scheduler's graph), and per backend the tensors allocated at
    each (canonical order) and the runs of equal segments."""

    bounds: list[int]
    at: dict[int, int]  # position -> index of the layer start there
    alloc: list[list[tuple[T, ...]]]  # per backend, per layer start: allocated tensors, canonical order
    # per backend: layer start -> (period, end): the segments from it repeat with that period up to the
    # layer start ``end`` (at least two periods on: a walk notes the first, compares after it and jumps
    # the rest)
    runs: list[dict[int, tuple[int, int]]]


def layer_starts(nodes: Sequence[T]) -> list[int]:
    """Positions of the first node named for each layer (layers in increasing order)."""
    out: list[int] = []
    last = -1
    for p, n in enumerate(nodes):
        tag = layer_suffix(n.name)  # LAYER_SUFFIX's match, without the regex
        if tag is not None and (il := int(tag)) > last:
            last = il
            out.append(p)
    return out


#: ``(p0, p1, p2, lo)``: see :class:`Jumped`
Span = tuple[int, int, int, int]


@dataclass(frozen=True)
class Jumped:
    """Stretches of a recording whose events were written from an earlier period (:mod:`.rec_jumps`):
    per stretch ``(p0, p1, p2, lo)``, the source period from ``p0`` to ``p1`` repeated up to ``p2``
    (positions), a tensor at or after ``lo`` among ``nodes`` being, ``k`` positions on (a whole number
    of periods), the node there, any other the same one."""

    spans: list[Span]
    index: dict[int, int]  # id -> position among nodes
    nodes: list[T]

    def shifted(self, ts: tuple[T, ...], k: int, lo: int) -> tuple[T, ...]:
        index, nodes = self.index, self.nodes
        return tuple(nodes[px + k] if (px := index.get(id(t), -1)) >= lo else t for t in ts)


def find_periods(bounds: list[int], tail: list[list[Event]], tail_pos: list[list[int]],
                 jumped: Jumped | None = None) -> Periods:
    """The segments of every backend's events between the layer starts ``bounds``, encoded, and their
    runs.  ``jumped``: the segments of its stretches are their source's, shifted (the same events, on
    the tensors there), not encoded again."""
    at = {p: k for k, p in enumerate(bounds)}
    spans = [] if jumped is None else [sp for sp in jumped.spans if all(p in at for p in sp[:3])]
    alloc: list[list[tuple[T, ...]]] = []
    runs: list[dict[int, tuple[int, int]]] = []
    for evs, poss in zip(tail, tail_pos, strict=True):
        codes, orders = _encode(evs, poss, bounds, at, spans, jumped)
        alloc.append(orders)
        runs.append(_runs(codes))
    return Periods(bounds, at, alloc, runs)


def _encode(evs: list[Event], poss: list[int], bounds: list[int], at: dict[int, int], spans: list[Span],
            jumped: Jumped | None) -> tuple[list[int], list[tuple[T, ...]]]:
    """Per segment (from each layer start to the next, the last to the end) an id of its events
    written relative to the tensors allocated at its start; and those tensors at each start."""
    alive: dict[T, None] = {}
    ids: dict[tuple[object, ...], int] = {}
    codes: list[int] = []
    orders: list[tuple[T, ...]] = []
    k, n = 0, len(evs)
    for s, start in enumerate(bounds):
        span = next((sp for sp in spans if sp[1] <= start < sp[2]), None)
        if span is not None and jumped is not None:
            p0, p1, p2, lo = span
            shift = (start - p0) // (p1 - p0) * (p1 - p0)
            peer = at[start - shift]
            codes.append(codes[peer])
            orders.append(jumped.shifted(orders[peer], shift, lo))
            if s + 1 < len(bounds) and bounds[s + 1] == p2:  # the stretch's end: its state, the events after
                alive = dict.fromkeys(jumped.shifted(orders[at[p0]], p2 - p0, lo))
                k = bisect.bisect_left(poss, p2, k)
            continue
        while k < n and poss[k] < start:
            _step(alive, evs[k])
            k += 1
        order = tuple(alive)
        orders.append(order)
        idx = {t: i for i, t in enumerate(order)}
        end = bounds[s + 1] if s + 1 < len(bounds) else 1 << 62
        enc: list[tuple[int, ...]] = [(len(order),)]
        new = 0
        while k < n and poss[k] < end:
            kind, t, p, x, y, _ = ev = evs[k]
            if kind == 0:
                enc.append((0, x))
            elif kind == 2:
                enc.append((2, idx[t], x))
            else:
                enc.append((1, idx[p], x, y))
            if kind != 2:
                idx[t] = ~new
                new += 1
            _step(alive, ev)
            k += 1
        codes.append(ids.setdefault(tuple(enc), len(ids)))
    return codes, orders


def _step(alive: dict[T, None], ev: Event) -> None:
    kind, t, p = ev[0], ev[1], ev[2]
    if kind != 0:
        del alive[p]
    if kind != 2:
        alive[t] = None


def _runs(codes: list[int]) -> dict[int, tuple[int, int]]:
    """Segment index -> (period, end) for the segments from which at least two periods repeat
    (the longest run; the shorter period where two are as long)."""
    out: dict[int, tuple[int, int]] = {}
    n = len(codes)
    for p in _PERIODS:
        same = 0  # how many segments from k on equal the one p later
        for k in range(n - p - 1, -1, -1):
            same = same + 1 if codes[k] == codes[k + p] else 0
            end = k + (same + p) // p * p
            if end >= n:  # the last segment runs to the graph's end: not a layer start
                end -= p
            if end >= k + 2 * p and end > out.get(k, (0, -1))[1]:
                out[k] = (p, end)
    return out


#: how many of a run's states at layer starts a walk keeps to compare with: the state may come back
#: after a multiple of the run's period (a residual stream alternating between two blocks)
_KEEP = 8


@dataclass
class PeriodWalk:
    """One backend's walk through layer starts: in a run of equal segments, notes its state at each
    and jumps to (nearly) the run's end when the state is one it had a multiple of the period ago."""

    per: Periods
    b: int
    run: tuple[int, int, int] | None = None  # (first layer start, period, end)
    # (layer start, blocks, offsets of its allocated tensors in canonical order, chunks kept)
    seen: list[tuple[int, list[list[int]], list[int | None], int]] = field(default_factory=list)
    #: after a jump: how many chunks of maxima the tail keeps the suffixes of (see :meth:`at`)
    mark: int = 0

    def at(self, pos: int, blocks: list[list[int]], own: dict[T, int], mark: int = 0,
           limit: int = 1 << 62) -> int | None:
        """At position ``pos`` (a layer start, after the events before it): the position to go on
        from (``own`` holding the allocated tensors there; at most ``limit``), or None to walk on.
        ``mark``: how many chunks of maxima the tail has kept: after a jump, ``self.mark`` is the
        count where the repeated state was first seen (a state after it has the jumped periods'
        maximum to come, whose labels are not known, so the tail keeps no suffix for it)."""
        k = self.per.at.get(pos)
        if k is None:
            return None
        run = self.run
        if run is None or not run[0] < k < run[2]:
            self._start(k, blocks, own, mark)
            return None
        offs = [own.get(t) for t in self.per.alloc[self.b][k]]
        for k1, blocks1, offs1, mark1 in reversed(self.seen):
            q = k - k1
            if q % run[1] or blocks != blocks1 or offs != offs1:
                continue
            end = k1 + (run[2] - k1) // q * q
            while end > k and self.per.bounds[end] > limit:
                end -= q
            if end <= k:
                break
            stats["period_jumps"] += 1
            self.mark = mark1
            self._jump(k, end, own, offs)
            self._start(end, blocks, own, mark)
            return self.per.bounds[end]
        stats["period_misses"] += 1
        self.seen.append((k, [list(x) for x in blocks], offs, mark))
        del self.seen[:-_KEEP]
        return None

    def _start(self, k: int, blocks: list[list[int]], own: dict[T, int], mark: int) -> None:
        """At layer start ``k`` outside the current run: the run from it, if any."""
        r = self.per.runs[self.b].get(k)
        self.run = None if r is None else (k, r[0], r[1])
        self.seen = [] if r is None else [(k, [list(x) for x in blocks],
                                           [own.get(t) for t in self.per.alloc[self.b][k]], mark)]

    def _jump(self, k: int, end: int, own: dict[T, int], offs: list[int | None]) -> None:
        """From layer start ``k`` to ``end``: the tensors allocated there take the offsets of their
        canonical peers at ``k``."""
        alloc = self.per.alloc[self.b]
        for t in alloc[k]:
            own.pop(t, None)
        for t, off in zip(alloc[end], offs, strict=True):
            if off is not None:
                own[t] = off


def apply_span(per: Periods, b: int, al: DynAllocator, evs: list[Event], poss: list[int], r0: int, r1: int,
               own: dict[T, int], label: str) -> str:
    """Backend ``b``'s events at positions ``r0`` to ``r1`` applied to ``al`` (``own``: the offsets of
    its tensors), whole periods of layers jumped where the state repeats; returns the peak label
    (``al.max_size`` is the running maximum: a jumped period reaches no more than the one walked, and
    a tie keeps the earlier label)."""
    k = bisect.bisect_left(poss, r0)
    if k == len(poss) or poss[k] >= r1:  # no event: the state stays (and so do a walk's layer starts)
        return label
    bounds = per.bounds
    walk = PeriodWalk(per, b)
    i = bisect.bisect_left(bounds, r0)
    while True:
        stop = bounds[i] if i < len(bounds) and bounds[i] < r1 else r1
        hi = bisect.bisect_left(poss, stop, k)
        if hi > k:
            label = al.apply(evs[k:hi], own, label)
            k = hi
        if stop == r1:
            return label
        to = walk.at(stop, al.blocks, own, limit=r1)
        if to is not None:
            k = bisect.bisect_left(poss, to, k)
            i = per.at[to]
        i += 1
