"""The reference's recording walk (:class:`.rec_alloc.RecAlloc`) jumping whole periods of equal layers,
as a from-scratch walk over a kept graph does (:mod:`.jumps`), with everything the recording keeps of
the jumped layers written from the period walked before them.

Where :mod:`.jumps` would jump from layer ``L`` (its state there one it had ``q`` layers before,
shifted, and the layers on repeat with period ``q``), this walk goes on through one more period, ``L``
to ``L + q`` (the *source*), keeping the state at every position whose peers in the layers after
hold a checkpoint.  At ``L + q`` the state is the source's start state shifted once more, so the walk
from there repeats the source period after period: it jumps (``JumpingAllocator.jump``: counts
brought down, the last jumped layer's tensors placed where their peers are) and writes for the jumped
positions what a walk would have recorded, each from its peer ``k`` periods back in the source:

- every backend's allocator events (``tail``, ``tail_pos``, ``events``): the source's, at positions
  ``k`` periods on, on the tensors ``k`` periods on (a tensor of the source period or of the layer
  before it, by its position; any other tensor is the same one), peak labels made for the node and
  layer there;
- each checkpoint: the free blocks and live tensors of its peer (tensors mapped the same way, their
  offsets the same; another tensor's child and view counts less ``k`` times what one period uses of
  them, measured between the source's start and end), the maxima and peak labels of the source's end
  (a repeated period reaches no new maximum), and the layer named last before it.

The state at the source's end is compared with its start before the jump (the allocator's free blocks,
every live tensor with its offset and counts, and the state :mod:`.jumps` compares); a jump whose counts
do not come out as the shift says walks the whole graph again without jumps.  The tests compare every
recorded field with a plain recording's on random placements of the big models.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from offload_planner.core.compute.allocator import peak_label
from offload_planner.core.compute.ggml import OUTPUT, T
from offload_planner.core.compute.jumps import JumpingAllocator, LayerCodes, Restart
from offload_planner.core.compute.periods import Jumped
from offload_planner.core.compute.rec_alloc import Checkpoint, Live, RecAlloc, Refuse, Walker
from offload_planner.core.compute.scheduler import Backend, Split
from offload_planner.core.compute.stats import stats

#: a planned jump: (layer L, period q, last layer start the run reaches, the state at L)
_Plan = tuple[int, int, int, tuple[object, ...]]


def jumping_walker(codes: tuple[LayerCodes, dict[int, int]]) -> Walker:
    """The recording walk of a graph whose layers have these codes and node positions
    (``template.GraphTemplate.codes``)."""

    def make(backends: list[Backend], graph_nodes: list[T], splits: list[Split],
             layer_tags: dict[T, str]) -> RecAlloc:
        return JumpingRecAlloc(backends, JumpingAllocator(backends, codes[0], graph_nodes, codes[1], splits),
                               layer_tags)

    return make


class JumpingRecAlloc(RecAlloc):
    """``RecAlloc.run_rec`` jumping periods of equal layers (see the module)."""

    def __init__(self, backends: list[Backend], jumper: JumpingAllocator, layer_tags: dict[T, str]) -> None:
        """``jumper``: decides the jumps on this walk's state; ``layer_tags``: `` (layer N)`` of every
        node named for a layer (``Reference._positions``)."""
        super().__init__(backends)
        self.jumper = jumper
        self.layer_tags = layer_tags

    def run_rec(self, nodes: list[T], node_ids: list[int], leafs: list[T], leaf_ids: list[int],
                checkpoints: set[int]) -> tuple[list[int], dict[int, Checkpoint]]:
        try:
            return self._run_jumping(nodes, node_ids, leafs, leaf_ids, checkpoints)
        except Restart:
            stats["rec_restarts"] += 1
            RecAlloc.__init__(self, self.backends)
            return RecAlloc.run_rec(self, nodes, node_ids, leafs, leaf_ids, checkpoints)

    def _run_jumping(self, nodes: list[T], node_ids: list[int], leafs: list[T], leaf_ids: list[int],
                     checkpoints: set[int]) -> tuple[list[int], dict[int, Checkpoint]]:
        if self.count(nodes, node_ids, leafs, leaf_ids):
            raise Refuse("inputs allocated by the counting pass")
        j = self.jumper
        j.own, j.allocs = self.own, self.allocs
        j.outputs = {id(t) for t in (*nodes, *leafs) if t.flags & OUTPUT}
        pos, ins, bids = j.layout()
        self.nodes, self.index = nodes, dict(zip(map(id, nodes), range(len(nodes)), strict=True))
        self.jumped = Jumped([], self.index, nodes)
        self.ckpos = sorted(checkpoints)
        cks, snap = self.cks, self.snap
        seen: dict[int, tuple[object, ...]] = {}
        extra: set[int] = set()  # the source's positions whose state the jumped layers' checkpoints take
        self.src: dict[int, Checkpoint] = {}
        plan: _Plan | None = None
        i, n, li = 0, len(nodes), 0
        while True:
            stop = pos[li] if li < len(pos) else n
            for k in range(i, stop):
                if k in checkpoints or k in extra:
                    c = snap()
                    if k in checkpoints:
                        cks[k] = c
                    if k in extra:
                        self.src[k] = c
                self.pos = k
                self.step(nodes[k], node_ids[k])
            if li >= len(pos):
                return [a.max_size for a in self.allocs], cks
            i = stop
            to = None
            if plan is not None and li == plan[0] + plan[1]:
                to = self._jump(plan, pos, checkpoints)
                plan, extra = None, set()
                self.src = {}
            if to is None:
                found = self._look(li, pos, ins, bids, seen)
                if found is not None and plan is None:
                    plan = found
                    extra = self._sources(pos[li], pos[li + found[1]], pos[found[2]])
            else:
                i, li = pos[to], to
            li += 1

    def _look(self, li: int, pos: list[int], ins: list[tuple[object, ...]], bids: list[int],
              seen: dict[int, tuple[object, ...]]) -> _Plan | None:
        """At the start of layer ``li``: a jump to plan from it (at least two periods to go: the source
        and one jumped), its state noted where a later layer may compare with it."""
        j, nodes = self.jumper, self.nodes
        if li < 1:
            return None
        run, state = j.run_from(li, 2, nodes, pos, ins, bids, seen)
        j.note(li, state, nodes, pos, ins, bids, seen)
        return None if run is None else (li, *run)

    def _sources(self, p0: int, p1: int, p_end: int) -> set[int]:
        """The source period's positions (``p0`` to ``p1``) whose states the checkpoints up to ``p_end``
        are written from, and ``p0``."""
        d = p1 - p0
        ck = self.ckpos
        out = {p0}
        for c in ck[bisect.bisect_left(ck, p1):bisect.bisect_left(ck, p_end)]:
            out.add(p0 + (c - p0) % d)
        return out

    def _jump(self, plan: _Plan, pos: list[int], checkpoints: set[int]) -> int | None:
        """At the end of the source period: the layer start reached by the jump (everything recorded
        up to it), or None (no jump: the walk goes on)."""
        first, q, end, state0 = plan
        j, nodes, li = self.jumper, self.nodes, first + q
        p0, p1 = pos[first], pos[li]
        if p0 not in self.src or j.state(li, nodes, pos) != state0:
            return None
        at_end = self.snap()
        if p1 in checkpoints:
            self.cks[p1] = at_end
        lo = pos[first - 1]
        deltas = self._deltas(self.src[p0], at_end, lo, p1 - p0)
        if deltas is None:
            return None
        layer = self.layer
        to = j.jump(li, end, q, nodes, pos)
        if to == li:
            return None
        stats["rec_jumps"] += 1
        p2 = pos[to]
        tags = self._tags(p1, p2, layer)
        self._events(p0, p1, p2, lo, tags)
        self._checkpoints(p0, p1, p2, lo, deltas, tags)
        assert self.jumped is not None
        self.jumped.spans.append((p0, p1, p2, lo))
        self.layer = tags[-1]
        own, cand, objs = self.own, self.cand, self.objs
        for t in nodes[pos[to - 1]:p2]:
            if id(t) in own and id(t) not in cand:
                objs[id(t)] = t
                cand.add(id(t))
        return to

    def _deltas(self, c0: Checkpoint, c1: Checkpoint, lo: int, d: int) -> dict[T, tuple[int, int]] | None:
        """Per live tensor outside the period (not shifted): the child and view counts one period uses
        (``c0`` at its start, ``c1`` at its end); None where the two states are not each other shifted."""
        if c0.blocks != c1.blocks or len(c0.live) != len(c1.live):
            return None
        index, nodes, l1 = self.index, self.nodes, c1.live
        out: dict[T, tuple[int, int]] = {}
        for t, e0 in c0.live.items():
            px = index.get(id(t))
            if px is not None and px >= lo:
                if l1.get(nodes[px + d]) != e0:
                    return None
                continue
            e1 = l1.get(t)
            if e1 is None or e1[0] != e0[0]:
                return None
            out[t] = (e0[1] - e1[1], e0[2] - e1[2])
        return out

    def _tags(self, p1: int, p2: int, layer: str) -> list[str]:
        """The layer the walk names at each position from ``p1`` to ``p2`` (after entering its node),
        ``layer`` the one before ``p1``."""
        get, out = self.layer_tags.get, []
        for t in self.nodes[p1:p2]:
            tag = get(t)
            if tag is not None:
                layer = tag
            out.append(layer)
        return out

    def _events(self, p0: int, p1: int, p2: int, lo: int, tags: list[str]) -> None:
        """Every backend's events from ``p1`` to ``p2``: the source's, ``k`` periods on."""
        d = p1 - p0
        index, nodes = self.index, self.nodes
        for tail, tpos, evs in zip(self.tail, self.tail_pos, self.events, strict=True):
            e0, e1 = bisect.bisect_left(tpos, p0), bisect.bisect_left(tpos, p1)
            if e0 == e1:
                continue
            src = tail[e0:e1]
            ps = tpos[e0:e1]
            kinds, xs, ys = [e[0] for e in src], [e[3] for e in src], [e[4] for e in src]
            # the tensors and parents: (the same one, or None) and position (shifted by it)
            ts = [(t, i) if (i := index.get(id(t), -1)) < lo else (None, i) for t in (e[1] for e in src)]
            pars = [(t, i) if (i := index.get(id(t), -1)) < lo else (None, i) for t in (e[2] for e in src)]
            allocs = [p for p, kind in zip(ps, kinds, strict=True) if kind == 0]
            v0 = bisect.bisect_left(evs, p0, key=lambda e: e[0])
            ends = [e[1] for e in evs[v0:v0 + len(allocs)]]
            for k in range(d, p2 - p1 + 1, d):
                labels = [peak_label(nodes[p + k], tags[p + k - p1]) for p in allocs]
                it = iter(labels)
                tail.extend(zip(kinds, [nodes[i + k] if t is None else t for t, i in ts],
                                [nodes[i + k] if t is None else t for t, i in pars], xs, ys,
                                [next(it) if kind == 0 else "" for kind in kinds], strict=True))
                tpos.extend([p + k for p in ps])
                evs.extend(zip([p + k for p in allocs], ends, labels, strict=True))

    def _checkpoints(self, p0: int, p1: int, p2: int, lo: int, deltas: dict[T, tuple[int, int]],
                     tags: list[str]) -> None:
        """The checkpoints after ``p1`` up to ``p2``: their peers' in the source, shifted (the live
        tensors made when first asked for)."""
        d = p1 - p0
        src, ck, cks = self.src, self.ckpos, self.cks
        mx, peaks = self.max_sizes, self.peak_list
        shifted: dict[int, _Shifted] = {}
        for c in ck[bisect.bisect_right(ck, p1):bisect.bisect_left(ck, p2)]:
            k = (c - p0) // d * d
            sh = shifted.get(c - k)
            if sh is None:
                sh = shifted[c - k] = _Shifted(src[c - k], self.index, self.nodes, lo, d, deltas)
            cks[c] = Checkpoint(sh.peer.blocks, mx, peaks, tags[c - 1 - p1], None, sh.at(k))


class _Shifted:
    """A source checkpoint's live tensors, for the checkpoints a whole number of periods on."""

    def __init__(self, peer: Checkpoint, index: dict[int, int], nodes: list[T], lo: int, d: int,
                 deltas: dict[T, tuple[int, int]]) -> None:
        self.peer, self.index, self.nodes, self.lo, self.d, self.deltas = peer, index, nodes, lo, d, deltas

    def at(self, k: int) -> Callable[[], Live]:
        """What makes the live tensors ``k`` positions on (``k`` a multiple of the period)."""
        return lambda: self._live(k)

    def _live(self, k: int) -> Live:
        index, nodes, lo, deltas = self.index, self.nodes, self.lo, self.deltas
        n_k = k // self.d
        live: Live = {}
        for t, e in self.peer.live.items():
            px = index.get(id(t))
            if px is not None and px >= lo:
                live[nodes[px + k]] = e
            else:
                al, nc, nv = e
                dc, dv = deltas[t]
                live[t] = (al, nc - n_k * dc, nv - n_k * dv)
        return live
