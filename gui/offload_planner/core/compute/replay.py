"""Incremental reserve: re-simulate only the part of a graph that a placement change touches.

:func:`offload_planner.core.compute.reserve.reserve` builds, schedules and allocates the whole graph (a
DeepSeek-V3 reserve is ~6000 nodes: ~60 ms).  A planner edit (moving one layer's experts) changes
the devices of a few tensors; everything before the change is the same computation, and after it
the computation is the same again as soon as its state is.  So a *reference* run is recorded once
per graph topology (shape, backends, weight set) and later placements are replayed against it:

1. devices: the weights, KV caches, per-layer ``rope_freqs`` and forced ``norm`` nodes whose device
   differs from the reference;
2. scheduler passes 1-4 on a window of the node list bounded by nodes that pass 1 assigns the same
   backend in both runs (every sweep of pass 2 restarts at an assigned node, so nothing outside the
   window can change; pass 3 must be idle and pass 4 only give views their source's backend, as in
   the reference, else the replay refuses);
3. pass 5 (splits and input copies) replayed from the start of the split holding the first affected
   node until its state (current backend, whether the split has inputs, the copies created since)
   equals the reference's at the same node; the reference's splits follow;
4. the allocator replayed from the reference checkpoint at the first replayed split's start (blocks,
   running maxima and peak labels, live tensors with their remaining child and view counts) until,
   in the unchanged tail, the same tensors are live on the same backends with the same counts as at
   the reference checkpoint at the same node.  From there every backend's allocator sees the
   reference's events (allocations, in-place reuses, frees: recorded per backend), only at other
   offsets: a backend whose blocks and live offsets equal the reference's takes the reference's
   maximum of the tail (and the first allocation reaching it); another replays the reference's events
   on its own blocks until they do (a move shifts which of two same-sized blocks holds the residual
   stream, which the walk can carry to the next device boundary: the events replay in a fraction of
   the time of the walk, and only on the backends that differ).
   Child counts at the start are the reference's corrected by the difference of the two windows;
   when that difference would change a decision before the start (a tensor used before and in the
   window with another count), the replay refuses.

A refusal (or an unsupported case: pipeline parallelism, the dry run, pass 3 at work, a different
topology) runs the full simulation, recorded as the new reference.  ``tests/core/test_compute_
incremental.py`` checks replays against the full simulation on random placements.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import compress, count
from operator import is_not

from offload_planner.core.compute.allocator import DynAllocator, GraphAllocator, peak_label
from offload_planner.core.compute.ggml import (
    INPLACE_OPS,
    LAYER_SUFFIX,
    OUTPUT,
    VIEW_OPS,
    Graph,
    T,
    nbytes,
    same_layout,
    view_tensor,
)
from offload_planner.core.compute.graph import Builder, Shape, WeightWhere
from offload_planner.core.compute.reserve import Reserve, reserve
from offload_planner.core.compute.scheduler import Backend, Scheduler, Split
from offload_planner.core.placement import Placed

CPU = "CPU"
_CK_STRIDE = 8


class _Refuse(Exception):
    """The replay cannot prove itself equal to the full run: run it in full."""


# --- the reference run ---------------------------------------------------------------------------------


class _RecDyn(DynAllocator):
    def __init__(self, alignment: int, events: list[tuple[int, int, str]], rec: _RecAlloc) -> None:
        super().__init__(alignment)
        self.events = events
        self.rec = rec

    def alloc(self, size: int) -> int:
        off = super().alloc(size)
        self.events.append((self.rec.pos, off + self.align(size), self.rec.where))
        return off


class _RecAlloc(GraphAllocator):
    """``GraphAllocator.run`` that also keeps a checkpoint at every split start."""

    def __init__(self, backends: list[Backend]) -> None:
        super().__init__(backends)
        self.pos = -1
        self.events: list[list[tuple[int, int, str]]] = [[] for _ in backends]
        self.allocs = [_RecDyn(b.alignment, self.events[i], self) for i, b in enumerate(backends)]
        self.objs: dict[int, T] = {}
        self.cand: set[int] = set()  # allocated, maybe live (counts only fall after the counting pass)
        # per backend, every allocator event in walk order (position of the node in tail_pos):
        # (0 alloc, t, t, size, 0, peak label) | (1 in place, t, parent, psize, nsize, "")
        # | (2 free, t, t, size, 0, "")
        self.tail: list[list[_Event]] = [[] for _ in backends]
        self.tail_pos: list[list[int]] = [[] for _ in backends]

    def allocate(self, t: T, bid: int) -> None:
        self.objs[id(t)] = t
        self.cand.add(id(t))
        super().allocate(t, bid)

    def on_alloc(self, t: T, bid: int, size: int) -> None:
        self.tail_pos[bid].append(self.pos)
        self.tail[bid].append((0, t, t, size, 0, self.where))

    def on_inplace(self, t: T, p: T, bid: int, psize: int, nsize: int) -> None:
        self.tail_pos[bid].append(self.pos)
        self.tail[bid].append((1, t, p, psize, nsize, ""))

    def on_free(self, t: T, bid: int, size: int) -> None:
        self.tail_pos[bid].append(self.pos)
        self.tail[bid].append((2, t, t, size, 0, ""))

    def run_rec(self, nodes: list[T], node_ids: list[int], leafs: list[T], leaf_ids: list[int],
                checkpoints: set[int]) -> tuple[list[int], dict[int, _Checkpoint]]:
        if self.count(nodes, node_ids, leafs, leaf_ids):
            raise _Refuse("inputs allocated by the counting pass")
        cks: dict[int, _Checkpoint] = {}
        for pos, (n, bid) in enumerate(zip(nodes, node_ids, strict=True)):
            if pos in checkpoints:
                live = {}
                dead = []
                own, objs = self.own, self.objs
                for i in self.cand:
                    t = objs[i]
                    if i in own and (t.n_children or t.n_views):
                        assert t.alloc is not None
                        live[t] = (t.alloc, t.n_children, t.n_views)
                    else:
                        dead.append(i)
                self.cand.difference_update(dead)
                cks[pos] = _Checkpoint([[list(b) for b in a.blocks] for a in self.allocs],
                                       [a.max_size for a in self.allocs], list(self.peaks), self.layer,
                                       live)
            self.pos = pos
            self.step(n, bid)
        return [a.max_size for a in self.allocs], cks


_Event = tuple[int, T, T, int, int, str]


@dataclass
class _Checkpoint:
    blocks: list[list[list[int]]]
    max_size: list[int]
    peaks: list[str]
    layer: str
    live: dict[T, tuple[tuple[int, int], int, int]]
    suffix: list[tuple[int, str]] | None = None  # per backend: max end at or after, first label
    _live_on: list[list[tuple[T, int]]] | None = None

    def live_on(self, b: int, n_backends: int, first: dict[T, int]) -> list[tuple[T, int]]:
        """The live tensors on backend ``b`` and their offsets, the latest created first (where two
        states differ: long-lived inputs rarely move)."""
        if self._live_on is None:
            self._live_on = [[] for _ in range(n_backends)]
            for t, ((tb, off), _, _) in sorted(self.live.items(), key=lambda e: -first.get(e[0], -1)):
                self._live_on[tb].append((t, off))
        return self._live_on[b]


class _Ref:
    """One recorded full run of one reserve graph."""

    def __init__(self, sh: Shape, arch_fn: Callable[[Builder], None], backends: list[Backend],
                 op_offload: bool, weights: Callable[[str], T | None], layer_dev: Callable[[int], str],
                 kv_dev: Callable[[int], str], items: Sequence[Placed], unit_devices: list[str],
                 keep_forced: bool = True) -> None:
        self.sh, self.backends, self.op_offload = sh, backends, op_offload
        self.unit_devices = list(unit_devices)
        self.items = list(items)  # kept alive: later placements are compared with them by identity
        b = Builder(sh, weights, layer_dev, kv_dev)
        arch_fn(b)
        g = self.g = b.g
        self.sched = Scheduler(backends, 1, op_offload)
        self.ids, self.cpu = self.sched.ids, self.sched.cpu
        # the dry run (``keep_forced=False``) drops the forced backends, as split_graph does
        forced = g.forced if keep_forced else {}
        self._devices(g.leafs)
        self._forced(g.nodes, forced, layer_dev)
        self._passes_1_4(g, forced)
        self._uses_in_graph(g.nodes)
        self._pass5(g.nodes)
        self.sched.build_copy(g)
        self._positions()
        self._record_allocator()

    def _devices(self, leafs: list[T]) -> None:
        """Which tensors carry a device, where it comes from, and which placement item gives it."""
        self.dev_of: list[tuple[T, int, object]] = []  # (tensor, kind, key): 0 weight, 1 kv, 2 layer
        names = {id(t): t for t in leafs}
        for t in names.values():
            if t.weights and t.name.startswith("rope_freqs-"):
                self.dev_of.append((t, 2, int(t.name.rsplit("-", 1)[1])))
            elif t.weights:
                self.dev_of.append((t, 0, t.name))
            elif t.dev is not None and t.name.startswith(("cache_k_l", "cache_v_l")):
                self.dev_of.append((t, 1, int(t.name[9:])))
            elif t.dev is not None:
                raise _Refuse(f"unknown device-carrying tensor {t.name}")
        self.layer_dev_of = [e for e in self.dev_of if e[1] != 0]
        # the weight leafs each placement item gives its device to (as weight_where names them)
        item_of: dict[str, int] = {}
        for i, it in enumerate(self.items):
            if it.device is not None:
                item_of["output.weight" if it.copy else it.tensor.name] = i
        if "output.weight" not in item_of and "token_embd.weight" in item_of:
            item_of["output.weight"] = item_of["token_embd.weight"]
        self.leafs_of_item: dict[int, list[T]] = {}
        for t, kind, key in self.dev_of:
            if kind == 0:
                assert isinstance(key, str)
                if key not in item_of:
                    raise _Refuse("weight without a placement item")
                self.leafs_of_item.setdefault(item_of[key], []).append(t)

    def _forced(self, nodes: list[T], forced: dict[int, str], layer_dev: Callable[[int], str]) -> None:
        """The nodes forced onto a backend: norms onto their layer's device, the rest the CPU's."""
        self.forced: list[tuple[T, int]] = []  # (node, layer) of forced norms; -1: always CPU
        by_id = {id(n): n for n in nodes}
        self.forced_dev: dict[T, str] = {}
        for i, dev in forced.items():
            n = by_id.get(i)
            if n is None:
                continue
            self.forced_dev[n] = dev
            if n.name.rsplit("-", 1)[0] in ("norm", "l_last"):
                il = int(n.name.rsplit("-", 1)[1])
                if layer_dev(il) != dev:
                    raise _Refuse("forced device")
                self.forced.append((n, il))
            elif dev != CPU:
                raise _Refuse("forced device")

    def _passes_1_4(self, g: Graph, forced: dict[int, str]) -> None:
        """Scheduler passes 1-4, keeping pass 1's assignments; refused where pass 3 assigns or pass 4
        does more than give views their source's backend."""
        nodes, leafs, sched, ids = g.nodes, g.leafs, self.sched, self.ids
        for t in leafs + nodes:
            t.bid = ids[forced[id(t)]] if id(t) in forced else -1
        for t in leafs + nodes:
            if t.bid == -1:
                t.bid = sched.backend_of(t)
        self.gidx = {n: i for i, n in enumerate(nodes)}
        self.p1 = [n.bid for n in nodes]
        if any(t.bid == -1 for t in leafs):
            raise _Refuse("unassigned leaf")
        sched.expand(nodes)
        p2 = [n.bid for n in nodes]
        sched.pass3(nodes)
        if [n.bid for n in nodes] != p2:
            raise _Refuse("pass 3 assigns")
        self.orig_src = [tuple(n.src) for n in nodes]
        sched.pass4(nodes)
        for i, n in enumerate(nodes):
            if n.op in VIEW_OPS:
                assert n.view_src is not None
                want = self.p1[i] if self.p1[i] != -1 else n.view_src.bid
            else:
                want = p2[i]
            if n.bid != want:
                raise _Refuse("pass 4 assigns")

    def _uses_in_graph(self, nodes: list[T]) -> None:
        """Real nodes, consumers and views of every tensor in the graph's node order."""
        self.real = [i for i, n in enumerate(nodes) if n.op not in VIEW_OPS]
        self.ridx = {gi: r for r, gi in enumerate(self.real)}
        self.consumers: dict[T, list[int]] = {}
        self.views: dict[T, list[int]] = {}
        # (tensor, backend) -> the last node on that backend reading it: where a copy of it there
        # can still be made or used (pass 5 copies sources for the real nodes' backends)
        self.last_on: dict[tuple[T, int], int] = {}
        for i, n in enumerate(nodes):
            for s in self.orig_src[i]:
                if s is not None:
                    self.consumers.setdefault(s, []).append(i)
                    if n.op not in VIEW_OPS:
                        self.last_on[(s, n.bid)] = i
            if n.view_src is not None:
                self.views.setdefault(n.view_src, []).append(i)

    def _positions(self) -> None:
        """Positions in the scheduler's graph (split starts with their copies, nodes), and the uses of
        every tensor there."""
        sched = self.sched
        self.ss: list[int] = []
        self.split_at = {sp.i_start: k for k, sp in enumerate(self.splits)}
        self.sp: dict[int, int] = {}
        pos = 0
        for sp in self.splits:
            self.ss.append(pos)
            pos += 2 * len(sp.inputs)
            for gi in range(sp.i_start, sp.i_end):
                self.sp[gi] = pos
                pos += 1
        assert pos == len(sched.nodes)
        self.sched_nodes, self.sched_ids = sched.nodes, sched.node_ids
        self.uses: dict[T, list[int]] = {}
        self.first: dict[T, int] = {t: -1 for t in sched.leafs}
        for p, n in enumerate(self.sched_nodes):
            self.first.setdefault(n, p)
            for s in n.src:
                if s is not None:
                    self.uses.setdefault(s, []).append(p)
                    self.first.setdefault(s, p)
        self.view_nodes: dict[T, list[T]] = {}
        for n in self.sched_nodes:
            if n.view_src is not None and n.op != "NONE":
                self.view_nodes.setdefault(n.view_src, []).append(n)

    def _record_allocator(self) -> None:
        """The allocator run with checkpoints and events, each checkpoint's maximum of the rest, the
        copies and the reserve."""
        sched, backends = self.sched, self.backends
        galloc = _RecAlloc(backends)
        # checkpoints at every split start and every _CK_STRIDE positions: a replay starts at the last
        # one before its first difference and stops at the first one where the state is the same again
        self.ckpos = sorted(set(self.ss) | set(range(0, len(self.sched_nodes), _CK_STRIDE)))
        self.sizes, self.cks = galloc.run_rec(self.sched_nodes, self.sched_ids, sched.leafs, sched.leaf_ids,
                                              set(self.ckpos))
        self.peaks = list(galloc.peaks)
        self.tail, self.tail_pos = galloc.tail, galloc.tail_pos
        self.size_cache: dict[tuple[T, int], int] = {}
        for evs in galloc.events:
            best: tuple[int, str] = (-1, "")
            k = len(evs)
            for p in reversed(self.ckpos):
                while k and evs[k - 1][0] >= p:
                    k -= 1
                    if evs[k][1] >= best[0]:
                        best = (evs[k][1], evs[k][2])
                ck = self.cks[p]
                if ck.suffix is None:
                    ck.suffix = []
                ck.suffix.append(best)
        self.copies = [0] * len(backends)
        self.wcopies = [0] * len(backends)
        for sp in self.splits:
            for inp in sp.inputs:
                self.copies[sp.backend] += nbytes(inp)
                if inp.weights:
                    self.wcopies[sp.backend] += nbytes(inp)
        self.reserve = Reserve(self.sh.n_tokens, self.sizes, self.peaks, self.copies, self.wcopies,
                               len(self.g.nodes), len(self.splits))

    def _pass5(self, nodes: list[T]) -> None:
        """``Scheduler._pass5`` recording the state before every node and where copies were made."""
        sched = self.sched
        n_nodes = len(nodes)
        self.cur_before: list[int] = [-2] * n_nodes
        self.ne_before: list[bool] = [False] * n_nodes
        self.split_before: list[int] = [-1] * n_nodes
        self.created: dict[tuple[T, int], int] = {}  # copy key -> node index that made it
        self.copy_of: dict[tuple[T, int], T] = {}
        self.input_pos: list[list[int]] = []
        first = next((k for k, n in enumerate(nodes) if n.op not in VIEW_OPS), len(nodes))
        split = Split(nodes[first].bid if first < len(nodes) else sched.cpu, 0)
        splits = self.splits = sched.splits = [split]
        self.input_pos.append([])
        cur = split.backend
        for i in range(first, n_nodes):
            n = nodes[i]
            if n.op in VIEW_OPS:
                continue
            self.cur_before[i], self.ne_before[i] = cur, bool(split.inputs)
            self.split_before[i] = len(splits) - 1
            need_new = n.bid == cur and bool(split.inputs) and any(
                s is not None and s.weights and s.bid != cur and not sched.supports(s, cur) for s in n.src)
            if n.bid != cur or need_new:
                split.i_end = i
                split = Split(n.bid, i)
                splits.append(split)
                self.input_pos.append([])
                cur = n.bid
            for j, s in enumerate(n.src):
                if s is None or s.bid == cur or sched.supports(s, cur):
                    continue
                key = (id(s), cur)
                if key not in sched.copies:
                    sched.copies[key] = [sched.input_copy(s, 0)]
                    self.created[(s, cur)] = i
                    self.copy_of[(s, cur)] = sched.copies[key][0]
                    split.inputs.append(s)
                    self.input_pos[-1].append(i)
                n.src[j] = sched.copies[key][0]
        split.i_end = len(nodes)
        self.created_sorted = [(gi, key) for key, gi in self.created.items()]  # in node order


# --- the replay ----------------------------------------------------------------------------------------


@dataclass
class _Move:
    dev: dict[T, str]  # device-carrying tensors whose device changed
    forced: dict[T, str]  # forced nodes whose device changed


def _diff_items(ref: _Ref, items: Sequence[Placed], unit_devices: list[str],
                offload_kqv: bool) -> _Move | None:
    """The devices that changed, from the placement items that differ from the reference's by identity
    (``Placed`` is frozen; the reference keeps its items alive); None when the items do not line up
    (another count, or a changed item of another tensor or loaded state)."""
    ref_items = ref.items
    if len(items) != len(ref_items):
        return None
    dev: dict[T, str] = {}
    leafs_of = ref.leafs_of_item
    for i in compress(count(), map(is_not, items, ref_items)):
        p, q = items[i], ref_items[i]
        if p.tensor is not q.tensor or p.copy != q.copy or p.device is None or q.device is None:
            return None
        for t in leafs_of.get(i, ()):
            if p.device != t.dev:
                dev[t] = p.device
    return _layer_diff(ref, dev, unit_devices, offload_kqv)


def _layer_diff(ref: _Ref, dev: dict[T, str], unit_devices: list[str], offload_kqv: bool) -> _Move:
    """``dev`` (the weights' changes) with the changes of the KV caches, rope factors and forced
    norms that follow the layers' devices."""
    forced: dict[T, str] = {}
    if unit_devices != ref.unit_devices:
        for t, kind, key in ref.layer_dev_of:
            assert isinstance(key, int)
            new = unit_devices[key] if kind == 2 or offload_kqv else CPU
            if new != t.dev:
                dev[t] = new
        for n, il in ref.forced:
            if unit_devices[il] != ref.unit_devices[il]:
                forced[n] = unit_devices[il]
    return _Move(dev, forced)


def _diff(ref: _Ref, where: WeightWhere, unit_devices: list[str],
          offload_kqv: bool) -> _Move:
    dev: dict[T, str] = {}
    forced: dict[T, str] = {}
    layers_changed = unit_devices != ref.unit_devices
    for t, kind, key in ref.dev_of:
        if kind == 0:
            assert isinstance(key, str)
            w = where.get(key)
            if w is None:
                raise _Refuse("weight set")
            new = w[2]
        elif not layers_changed:
            continue
        else:
            assert isinstance(key, int)
            new = unit_devices[key] if kind == 2 or offload_kqv else CPU
        if new != t.dev:
            dev[t] = new
    if layers_changed:
        for n, il in ref.forced:
            if unit_devices[il] != ref.unit_devices[il]:
                forced[n] = unit_devices[il]
    return _Move(dev, forced)


def replay(ref: _Ref, mv: _Move) -> Reserve:
    """The reserve of the reference's graph with the devices of ``mv``, replayed (steps 2-4)."""
    if not mv.dev and not mv.forced:
        return ref.reserve
    return _Replay(ref, mv).run()


class _Replay:
    """One replay: the backends that change (passes 1-4), the splits that change (pass 5), the sched
    window they make, and the allocator over it."""

    def __init__(self, ref: _Ref, mv: _Move) -> None:
        self.ref, self.mv, self.newdev = ref, mv, mv.dev
        self.nodes = ref.g.nodes
        self.ids, self.cpu = ref.ids, ref.cpu
        self.bid: dict[T, int] = {}  # new final backend where it differs from the reference
        self.made: dict[tuple[T, int], T] = {}  # copies this run makes
        self.newsrc: dict[T, list[T | None]] = {}  # sources of the nodes pass 5 walked
        # pass 5: the reference's split it starts in (-1: from the first node), the reference's splits
        # before it, the new ones, the node where the state is the reference's again, the reference's
        # split there, the splits after it and the reference position the window ends at
        self.kk, self.kept, self.new_splits, self.x = -1, list[Split](), list[Split](), 0
        self.km, self.tail_splits, self.ref_end = 0, list[Split](), 0

    # --- where a tensor is -----------------------------------------------------------------------

    def loc(self, t: T) -> str | None:
        b = t.view_src if t.view_src is not None else t
        return self.newdev.get(b, b.dev)

    def from_buffer(self, t: T) -> int:
        lo = self.loc(t)
        return -1 if lo is None else self.ids.get(lo, self.cpu)

    def B(self, t: T) -> int:
        return self.bid.get(t, t.bid)

    def supported(self, t: T, b: int) -> bool:
        lo = self.loc(t)
        if lo is not None:
            return self.ids.get(lo, self.cpu) == b
        x = self.B(t) if self.B(t) != -1 or t.view_src is None else self.B(t.view_src)
        return x == b

    def pass1(self, t: T) -> int:
        ref, mv, ids, cpu = self.ref, self.mv, self.ids, self.cpu
        if t in mv.forced:
            return ids[mv.forced[t]]
        if t in ref.forced_dev:
            return ids[ref.forced_dev[t]]
        x = self.from_buffer(t)
        if x != -1:
            return x
        if t.flags & 1:
            return cpu
        if t.op in ("ROPE", "FLASH_ATTN_EXT"):
            return -1
        for s in ref.orig_src[ref.gidx[t]]:
            if s is not None and s.weights:
                sb = self.from_buffer(s)
                if ref.op_offload and sb == cpu:
                    for k in range(cpu):
                        if ref.backends[k].offloads(t):
                            return k
                return sb
        return -1

    # --- passes 1-4 ------------------------------------------------------------------------------

    def assign(self) -> None:
        """Pass 1 on what the changed devices touch, passes 2-3 on the window of nodes between two
        that pass 1 assigns as in the reference, pass 4 on the views."""
        ref, nodes, bid = self.ref, self.nodes, self.bid
        touched: set[int] = set()
        for t in self.newdev:
            if t not in ref.gidx:
                bid[t] = self.from_buffer(t)  # a leaf: weights, caches
            touched.update(ref.consumers.get(t, ()))
            touched.update(ref.views.get(t, ()))
        for n in self.mv.forced:
            touched.add(ref.gidx[n])
        p1 = {gi: self.pass1(nodes[gi]) for gi in touched}
        changed_r = sorted(ref.ridx[gi] for gi, b in p1.items() if b != ref.p1[gi] and gi in ref.ridx)
        if changed_r:
            self._expand(p1, changed_r[0], changed_r[-1])
        self._views(p1)

    def _expand(self, p1: dict[int, int], lo: int, hi: int) -> None:
        """Pass 2 (GPU backends expand up and down) between the nearest nodes pass 1 assigns."""
        ref, nodes, real, cpu = self.ref, self.nodes, self.ref.real, self.cpu
        a = lo - 1
        while a >= 0 and ref.p1[real[a]] == -1:
            a -= 1
        z = hi + 1
        while z < len(real) and ref.p1[real[z]] == -1:
            z += 1
        a, z = max(a, 0), min(z, len(real) - 1)
        win = [real[r] for r in range(a, z + 1)]
        cur_b = {gi: p1.get(gi, ref.p1[gi]) for gi in win}
        for order, skip_cpu in ((win, True), (win[::-1], True), (win, False), (win[::-1], False)):
            c = -1
            for gi in order:
                x = cur_b[gi]
                if x != -1:
                    c = -1 if (skip_cpu and x == cpu) else x
                elif c != -1:
                    cur_b[gi] = c
        for gi, x in cur_b.items():
            if x == -1:
                raise _Refuse("pass 3 would assign")
            if x != nodes[gi].bid:
                self.bid[nodes[gi]] = x

    def _views(self, p1: dict[int, int]) -> None:
        """Location-pinned views from pass 1, the others take their source's backend (pass 4)."""
        ref, nodes, bid = self.ref, self.nodes, self.bid
        vcand = {gi for gi in p1 if nodes[gi].op in VIEW_OPS}
        for t in list(bid):
            vcand.update(gi for gi in ref.views.get(t, ()) if nodes[gi].op in VIEW_OPS)
        for gi in vcand:
            v = nodes[gi]
            x = p1.get(gi, ref.p1[gi])
            if x == -1:
                assert v.view_src is not None
                x = self.B(v.view_src)
            if x != v.bid:
                bid[v] = x
            else:
                bid.pop(v, None)

    def affected(self) -> set[int]:
        """Nodes whose backend or sources' backends change."""
        ref, nodes = self.ref, self.nodes
        out: set[int] = set()
        for t in self.bid:
            if t in ref.gidx:
                out.add(ref.gidx[t])
            out.update(ref.consumers.get(t, ()))
        for t in self.newdev:
            out.update(ref.consumers.get(t, ()))
            for gi in ref.views.get(t, ()):
                out.update(ref.consumers.get(nodes[gi], ()))
        return out

    # --- pass 5 ----------------------------------------------------------------------------------

    def _first_split(self, fa: int) -> tuple[int, Split]:
        """From the first real node at or after the first affected one, in the split current there
        with the inputs it had then (the nodes before it did what they did in the reference)."""
        ref, nodes, real = self.ref, self.nodes, self.ref.real
        r0 = bisect.bisect_left(real, fa)
        start = real[r0] if r0 < len(real) else len(nodes)
        # (the first real node makes the first split with its own backend: from there as the full pass)
        self.kk = ref.split_before[start] if start < len(nodes) and r0 > 0 else -1
        if self.kk >= 0:
            rs, pos = ref.splits[self.kk], ref.input_pos[self.kk]
            split = Split(rs.backend, rs.i_start, 0,
                          [inp for inp, p in zip(rs.inputs, pos, strict=True) if p < start])
            self.kept = ref.splits[:self.kk]
        else:  # from the first node, as the full pass does
            start = real[0] if real else len(nodes)
            split = Split(self.B(nodes[start]) if start < len(nodes) else self.cpu, 0)
            self.kept = []
        return start, split

    def pass5(self, fa: int, fb: int) -> None:
        """Splits and input copies from the split holding the first affected node until the state
        is the reference's (``self.x``: the node where it is, or the end)."""
        ref, nodes, made, newsrc = self.ref, self.nodes, self.made, self.newsrc
        B, supported = self.B, self.supported
        created, cs, last_on = ref.created, ref.created_sorted, ref.last_on
        start, split = self._first_split(fa)
        self.new_splits = [split]
        cur = split.backend
        kc = _first_at(cs, start)
        ref_made: set[tuple[T, int]] = set()
        self.x = len(nodes)
        for i in range(start, len(nodes)):
            n = nodes[i]
            if n.op in VIEW_OPS:
                continue
            while kc < len(cs) and cs[kc][0] < i:
                ref_made.add(cs[kc][1])
                kc += 1
            if i > fb and cur == ref.cur_before[i] and bool(split.inputs) == ref.ne_before[i] \
                    and all(last_on.get(key, -1) < i for key in ref_made.symmetric_difference(made)):
                self.x = i  # copies made in one run only: no later node on their backend reads them
                break
            nb = B(n)
            src = ref.orig_src[i]
            need_new = nb == cur and bool(split.inputs) and any(
                s is not None and s.weights and B(s) != cur and not supported(s, cur) for s in src)
            if nb != cur or need_new:
                split.i_end = i
                split = Split(nb, i)
                self.new_splits.append(split)
                cur = nb
            out = list(src)
            for j, s in enumerate(src):
                if s is None or B(s) == cur or supported(s, cur):
                    continue
                key = (s, cur)
                cp = made.get(key)
                if cp is None:
                    if key in created and created[key] < start:
                        cp = ref.copy_of[key]
                    else:
                        cp = ref.copy_of.get(key) or ref.sched.input_copy(s, 0)
                        made[key] = cp
                        split.inputs.append(s)
                out[j] = cp
            newsrc[n] = out
        self._join(split)

    def _join(self, split: Split) -> None:
        """The split current at ``x`` continues into the reference's split there."""
        ref, x = self.ref, self.x
        if x < len(self.nodes):
            self.km = ref.split_before[x]
            rs = ref.splits[self.km]
            split.inputs += [inp for inp, p in zip(rs.inputs, ref.input_pos[self.km], strict=True) if p >= x]
            split.i_end = rs.i_end
            self.tail_splits = ref.splits[self.km + 1:]
            # x may start the reference's next split: its copies come first
            self.ref_end = ref.ss[self.km + 1] if rs.i_end == x else ref.sp[x]
        else:
            split.i_end = len(self.nodes)
            self.km = len(ref.splits) - 1
            self.tail_splits = []
            self.ref_end = len(ref.sched_nodes)

    # --- the sched window and the result ---------------------------------------------------------

    def window(self, fa: int) -> tuple[int, list[T], list[int]]:
        """The new sched window and the reference position it starts at; when the first split keeps
        the reference's inputs, it starts at the first affected node (the copies and nodes before
        it are the reference's)."""
        ref, kk, B = self.ref, self.kk, self.B
        wnodes: list[T] = []
        wids: list[int] = []
        same_head = kk >= 0 and self.new_splits[0].inputs == ref.splits[kk].inputs
        if same_head:  # a reference split starting at fa has its copies first
            stats["late_start"] += 1
            ks = ref.split_at.get(fa)
            wa = ref.sp[fa] if ks is None else ref.ss[ks]
        else:
            wa = ref.ss[kk] if kk >= 0 else 0
        for idx, sp in enumerate(self.new_splits):
            lo = sp.i_start
            if idx == 0 and same_head:
                lo = fa
            else:
                for inp in sp.inputs:
                    wnodes.append(view_tensor(inp, "NONE", inp))
                    wids.append(B(inp))
                    wnodes.append(self.made.get((inp, sp.backend)) or ref.copy_of[(inp, sp.backend)])
                    wids.append(sp.backend)
            for gi in range(lo, min(sp.i_end, self.x)):
                wnodes.append(self.nodes[gi])
                wids.append(B(self.nodes[gi]))
        return wa, wnodes, wids

    def run(self) -> Reserve:
        ref = self.ref
        self.assign()
        affected = self.affected()
        if not affected:
            return _replay_alloc_same(ref, self.bid, self.newdev)
        fa, fb = min(affected), max(affected)
        self.pass5(fa, fb)
        wa, wnodes, wids = self.window(fa)
        sizes, peaks = _replay_alloc(ref, wa, self.ref_end, wnodes, wids, self.newsrc, self.newdev)
        copies, wcopies = list(ref.copies), list(ref.wcopies)
        for sign, group in ((-1, ref.splits[len(self.kept):self.km + 1]), (1, self.new_splits)):
            for sp in group:
                for inp in sp.inputs:
                    copies[sp.backend] += sign * nbytes(inp)
                    if inp.weights:
                        wcopies[sp.backend] += sign * nbytes(inp)
        splits = self.kept + self.new_splits + self.tail_splits
        return Reserve(ref.sh.n_tokens, sizes, peaks, copies, wcopies, len(self.nodes), len(splits))


def _first_at(cs: list[tuple[int, tuple[T, int]]], start: int) -> int:
    lo, hi = 0, len(cs)
    while lo < hi:
        mid = (lo + hi) // 2
        if cs[mid][0] < start:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _replay_alloc_same(ref: _Ref, bid: dict[T, int], newdev: dict[T, str]) -> Reserve:
    """No node changed backend or source: the sched graph is the reference's (with other devices on
    leafs that are never allocated)."""
    for t in bid:
        if t.location is None:
            raise _Refuse("backend of an allocated tensor")
    return ref.reserve


def _same_node(n: T, r: T) -> bool:
    """Window node ``n`` does what reference node ``r`` does: the same node, or the dependency
    node of a split input on the same input (created again by the replay)."""
    return n is r or (n.op == "NONE" and r.op == "NONE" and n.view_src is not None
                      and n.view_src is r.view_src and n.src == r.src)


def _replay_alloc(ref: _Ref, wa: int, ref_end: int, wnodes: list[T], wids: list[int],
                  newsrc: dict[T, list[T | None]], newdev: dict[T, str]) -> tuple[list[int], list[str]]:
    """Sizes and peak labels per backend: the allocator over the replay's sched window ``wnodes``
    (which stands for the reference's positions ``wa`` to ``ref_end``), then the reference's nodes."""
    return _AllocReplay(ref, wa, ref_end, wnodes, wids, newsrc, newdev).run()


class _AllocReplay:
    """The allocator walk of one replay: its start, state and counts (see the module's step 4)."""

    def __init__(self, ref: _Ref, wa: int, ref_end: int, wnodes: list[T], wids: list[int],
                 newsrc: dict[T, list[T | None]], newdev: dict[T, str]) -> None:
        # location changes of allocatable tensors would change the leaf pass
        for t in newdev:
            if t.location is None:
                raise _Refuse("location")
        self.ref, self.ref_end, self.newsrc, self.newdev = ref, ref_end, newsrc, newdev
        self.sizer = GraphAllocator(ref.backends)
        self.wa, self.wnodes, self.wids = wa, wnodes, wids
        self.w_ref: dict[T, int] = {}
        self.w_new: dict[T, int] = {}
        self.changed: set[T] = set()
        self._move_start(self._first_difference())
        self._restore()

    # --- counts --------------------------------------------------------------------------------

    def srcs(self, n: T) -> tuple[T | None, ...] | list[T | None]:
        s = self.newsrc.get(n)
        return n.src if s is None else s

    def r_ref(self, t: T) -> int:
        """Uses of ``t`` at or after the start in the reference."""
        u = self.ref.uses.get(t)
        return 0 if u is None else len(u) - bisect.bisect_left(u, self.wa)

    def r_new(self, t: T) -> int:
        return self.r_ref(t) - self.w_ref.get(t, 0) + self.w_new.get(t, 0)

    def total_new(self, t: T) -> int:
        u = self.ref.uses.get(t)
        return (0 if u is None else len(u)) - self.w_ref.get(t, 0) + self.w_new.get(t, 0)

    def v_new(self, t: T) -> int:
        return sum(1 for v in self.ref.view_nodes.get(t, ()) if self.total_new(v) == 0 or self.r_new(v) > 0)

    def fixed(self, t: T) -> bool:
        """Never allocated by the graph allocator (it or its view source has a buffer)."""
        b = t.view_src if t.view_src is not None else t
        return self.newdev.get(b, b.dev) is not None

    def NC(self, t: T) -> int:
        c = self.nc.get(t)
        if c is None:
            c = self.nc[t] = self.r_new(t)
        return c

    def NV(self, t: T) -> int:
        c = self.nv.get(t)
        if c is None:
            c = self.nv[t] = self.v_new(t)
        return c

    # --- the start -----------------------------------------------------------------------------

    def _first_difference(self) -> int:
        """The window's start equal to the reference's (same nodes, backends and sources) is not
        replayed: the reference position of the first difference."""
        ref, wnodes, wids, wa = self.ref, self.wnodes, self.wids, self.wa
        rnodes, rids = ref.sched_nodes, ref.sched_ids
        f, lim = 0, min(len(wnodes), self.ref_end - wa)
        while f < lim:
            n, r = wnodes[f], rnodes[wa + f]
            if wids[f] != rids[wa + f] or not _same_node(n, r):
                break
            ns = self.newsrc.get(n)
            if ns is not None and ns != r.src:
                break
            f += 1
        return wa + f

    def _move_start(self, target: int) -> None:
        """Start at the last checkpoint at or before ``target``.  Decisions before the start must not
        depend on the window's difference: a tensor whose count differs and that the allocator
        handles must, if it appeared before the start, have uses left there in both runs (then
        neither run freed it or reused it in place before, and the reference's checkpoint holds it);
        else the start moves back to before its last use (or its creation)."""
        ref = self.ref
        ckpos, uses, first = ref.ckpos, ref.uses, ref.first
        rnodes, rids = ref.sched_nodes, ref.sched_ids
        w0, win0, wid0 = self.wa, self.wnodes, self.wids
        while True:
            c0 = ckpos[bisect.bisect_right(ckpos, target) - 1]
            if c0 < w0:  # before the window: the reference's nodes up to it
                self.wnodes, self.wids = rnodes[c0:w0] + win0, rids[c0:w0] + wid0
            else:
                self.wnodes, self.wids = win0[c0 - w0:], wid0[c0 - w0:]
            wa = self.wa = c0
            self._count_window()
            back = wa
            for t in self.changed:
                if self.fixed(t) or first.get(t, wa) >= wa or (self.r_ref(t) > 0 and self.r_new(t) > 0):
                    continue
                u = uses.get(t, [])
                k = bisect.bisect_left(u, wa)
                back = min(back, u[k - 1] if k else first[t])
            if back == wa:
                return
            if back < 0:
                raise _Refuse("count of an input used before the window")
            stats["moved_back"] += 1
            target = back

    def _count_window(self) -> None:
        """Uses inside the window in each run, and the tensors whose count differs."""
        rnodes = self.ref.sched_nodes
        w_ref: dict[T, int] = {}
        for q in range(self.wa, self.ref_end):
            for s in rnodes[q].src:
                if s is not None:
                    w_ref[s] = w_ref.get(s, 0) + 1
        w_new: dict[T, int] = {}
        for n in self.wnodes:
            for s in self.srcs(n):
                if s is not None:
                    w_new[s] = w_new.get(s, 0) + 1
        self.w_ref, self.w_new = w_ref, w_new
        self.changed = {t for t in set(w_ref) | set(w_new) if w_ref.get(t, 0) != w_new.get(t, 0)}

    def _restore(self) -> None:
        """The allocator state of the reference's checkpoint at the start, with the new counts."""
        ref = self.ref
        ck = self.ck = ref.cks[self.wa]
        self.allocs = []
        for a, blocks, mx in zip(ref.backends, ck.blocks, ck.max_size, strict=True):
            d = DynAllocator(a.alignment)
            d.blocks = [list(b) for b in blocks]
            d.max_size = mx
            self.allocs.append(d)
        self.peaks = list(ck.peaks)
        self.own: dict[T, tuple[int, int]] = {t: al for t, (al, _, _) in ck.live.items()}
        self.nc: dict[T, int] = {}
        self.nv: dict[T, int] = {}
        changed = self.changed
        for t, (_, c, v) in ck.live.items():
            if (self.NC(t) != c or self.NV(t) != v) and t not in changed \
                    and not any(x in changed for x in ref.view_nodes.get(t, ())):
                raise _Refuse("live counts")
        self.where = ck.layer
        self.cur = self.wnodes[0] if self.wnodes else ref.sched_nodes[self.wa]

    # --- the walk ------------------------------------------------------------------------------

    def size(self, t: T, b: int) -> int:
        k = (t, b)
        cache = self.ref.size_cache
        v = cache.get(k)
        if v is None:
            v = self.sizer.size(t, b)
            if t in self.ref.first:
                cache[k] = v
        return v

    def allocate(self, t: T, b: int) -> None:
        own = self.own
        if t in own or t.view_src is not None or self.newdev.get(t, t.dev) is not None:
            return
        if t.op in INPLACE_OPS:
            for p in self.srcs(t):
                if p is None or p not in own or p.flags & OUTPUT:
                    continue
                if p.view_src is not None and p.view_src.flags & OUTPUT:
                    continue
                if not same_layout(t, p) or self.NC(p) != 1 or self.NV(p) != 0:
                    continue
                if p.view_src is not None:
                    continue
                pal = own.pop(p)
                own[t] = pal
                pb, poff = pal
                al = self.allocs[pb]
                psize, nsize = al.align(self.size(p, pb)), al.align(self.size(t, b))
                if psize > nsize:
                    al.free(poff + nsize, psize - nsize)
                return
        al = self.allocs[b]
        before = al.max_size
        own[t] = (b, al.alloc(self.size(t, b)))
        if al.max_size > before:
            self.peaks[b] = peak_label(self.cur, self.where)

    def free(self, t: T) -> None:
        if t.flags & OUTPUT:
            return
        b, off = self.own.pop(t)
        self.allocs[b].free(off, self.size(t, b))

    def release(self, p: T) -> None:
        """One use of ``p`` done: free it (or its view source) when nothing reads it any more."""
        nc, nv, NC, NV = self.nc, self.nv, self.NC, self.NV
        c = NC(p) - 1
        nc[p] = c
        if c or NV(p):
            return
        if p.view_src is not None:
            vs = p.view_src
            v = NV(vs) - 1
            nv[vs] = v
            if v == 0 and NC(vs) == 0 and vs in self.own:
                self.free(vs)
        elif p in self.own:
            self.free(p)

    def run(self) -> tuple[list[int], list[str]]:
        ref, wa, wnodes, wids = self.ref, self.wa, self.wnodes, self.wids
        rnodes, rids, cks = ref.sched_nodes, ref.sched_ids, ref.cks
        allocate, release = self.allocate, self.release
        delta = len(wnodes) - (self.ref_end - wa)
        for q in range(wa, len(rnodes) + delta):
            if q >= wa + len(wnodes):
                qr = q - delta
                ckq = cks.get(qr)
                if ckq is not None and _same_live(ckq, self.own, self.NC, self.NV):
                    return _tails(ref, qr, self.allocs, self.own, self.peaks)
                n, b = rnodes[qr], rids[qr]
            else:
                n, b = wnodes[q - wa], wids[q - wa]
            self.cur = n
            if (m := LAYER_SUFFIX.search(n.name)) is not None:
                self.where = f" (layer {m.group(1)})"
            ss = self.srcs(n)
            for s in ss:
                if s is not None:
                    allocate(s, b)
            allocate(n, b)
            for p in ss:
                if p is not None:
                    release(p)
        return [a.max_size for a in self.allocs], self.peaks


def _same_live(ck: _Checkpoint, own: dict[T, tuple[int, int]], NC: Callable[[T], int],
               NV: Callable[[T], int]) -> bool:
    """The same tensors live on the same backends with the same counts as at the reference's
    checkpoint (where they are may differ): from here the allocator sees the reference's events."""
    n_live = 0
    live = ck.live
    for t, al in own.items():
        c, v = NC(t), NV(t)
        if not c and not v:
            continue
        n_live += 1
        e = live.get(t)
        if e is None or e[0][0] != al[0] or e[1] != c or e[2] != v:
            return False
    return n_live == len(live)


def _tails(ref: _Ref, qr: int, allocs: list[DynAllocator], own: dict[T, tuple[int, int]],
           peaks: list[str]) -> tuple[list[int], list[str]]:
    """Per backend, the rest of the walk from reference position ``qr`` (whose live set is the
    reference's): the reference's allocator events on this backend's own blocks and offsets, until
    they equal the reference's at a checkpoint (then the reference's maximum from there on)."""
    ck = ref.cks[qr]
    sizes, labels = [], []
    for b, al in enumerate(allocs):
        own_b = {t: off for t, (tb, off) in own.items() if tb == b}
        size, label = al.max_size, peaks[b]
        if _same_on(ref, ck, b, al, own_b):
            size, label = _with_suffix(ck, b, size, label)
        else:
            size, label = _tail(ref, b, qr, al, own_b, label)
        sizes.append(size)
        labels.append(label)
    return sizes, labels


def _same_on(ref: _Ref, ck: _Checkpoint, b: int, al: DynAllocator, own_b: dict[T, int]) -> bool:
    if al.blocks != ck.blocks[b]:
        return False
    get = own_b.get
    return all(get(t) == off for t, off in ck.live_on(b, len(ref.backends), ref.first))


def _with_suffix(ck: _Checkpoint, b: int, size: int, label: str) -> tuple[int, str]:
    """The maximum so far combined with the reference's from the checkpoint on (a tie keeps the
    earlier allocation's label, as the allocator does)."""
    assert ck.suffix is not None
    s_max, s_label = ck.suffix[b]
    return (size, label) if size >= s_max else (s_max, s_label)


def _tail(ref: _Ref, b: int, qr: int, al: DynAllocator, own_b: dict[T, int], label: str) -> tuple[int, str]:
    """Backend ``b``'s events from position ``qr`` on; checked against the reference's state at every
    checkpoint after some event (without events neither state changes)."""
    stats["tails"] += 1
    evs, poss, ckpos = ref.tail[b], ref.tail_pos[b], ref.ckpos
    k, n = bisect.bisect_left(poss, qr), len(poss)
    n_ck = len(ckpos)
    alloc, free, pop = al.alloc, al.free, own_b.pop
    while k < n:
        c = bisect.bisect_right(ckpos, poss[k])  # the first checkpoint after the next event
        hi = bisect.bisect_left(poss, ckpos[c], k) if c < n_ck else n
        for kind, t, p, x, y, lab in evs[k:hi]:
            if kind == 0:
                before = al.max_size
                own_b[t] = alloc(x)
                if al.max_size > before:
                    label = lab
            elif kind == 2:
                free(pop(t), x)
            else:
                off = own_b[t] = pop(p)
                if x > y:
                    free(off + y, x - y)
        k = hi
        if c < n_ck:
            ck = ref.cks[ckpos[c]]
            if _same_on(ref, ck, b, al, own_b):
                return _with_suffix(ck, b, al.max_size, label)
    return al.max_size, label


# --- the cache of references -----------------------------------------------------------------------------


#: per topology, the recorded references (latest last): a caller that moves far from every one of
#: them (the --fit search jumps between layer splits) gets another
_REFS: OrderedDict[tuple[object, ...], list[_Ref]] = OrderedDict()
_REFS_SIZE = 8
_REFS_PER_KEY = 4
#: per topology, the layer devices of placements simulated without a reference: recording one costs
#: about a simulation more, which only pays off for a caller that comes back near it (a window's
#: edits, the --fit search's next step)
_SEEN: OrderedDict[tuple[object, ...], list[list[str]]] = OrderedDict()
_SEEN_SIZE = 32
_record_at_first_sight = False


def record_at_first_sight(on: bool = True) -> None:
    """Record the reference of a topology the first time it is simulated (a window, which will
    re-project every edit) instead of the second (one-shot commands simulate once)."""
    global _record_at_first_sight
    _record_at_first_sight = on


def _distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Layers (units) on another device."""
    return sum(x != y for x, y in zip(a, b, strict=True))


def _near(units: Sequence[str]) -> int:
    """How many units may differ for a replay to beat recording a new reference."""
    return max(2, len(units) // 8)


def _nearest(key: tuple[object, ...], units: list[str]) -> _Ref | None:
    refs = _REFS.get(key)
    if not refs:
        return None
    _REFS.move_to_end(key)
    best = min(refs, key=lambda r: _distance(r.unit_devices, units))
    return best if _distance(best.unit_devices, units) <= _near(units) else None


def _first_sight(key: tuple[object, ...], units: list[str]) -> bool:
    """True (and remembered) if no placement near this one has been simulated in this topology and
    this one is not to be recorded."""
    if _record_at_first_sight:
        return False
    seen = _SEEN.setdefault(key, [])
    _SEEN.move_to_end(key)
    if any(_distance(u, units) <= _near(units) for u in seen):
        return False
    seen.append(list(units))
    del seen[:-_REFS_PER_KEY]
    if len(_SEEN) > _SEEN_SIZE:
        _SEEN.popitem(last=False)
    return True


def _keep(key: tuple[object, ...], ref: _Ref) -> None:
    refs = _REFS.setdefault(key, [])
    _REFS.move_to_end(key)
    refs.append(ref)
    del refs[:-_REFS_PER_KEY]
    if len(_REFS) > _REFS_SIZE:
        _REFS.popitem(last=False)


#: replays, full runs, refusals; item_diffs: changes found by comparing placement items by identity;
#: late_start: windows starting at the first affected node inside a split; moved_back: replay starts
#: moved back before a use whose count the window changes; tails: backends whose allocator was still
#: in another state than the reference's after the window, replayed from the reference's event list;
#: plain: first simulations of a topology, run without recording a reference
stats = {"replays": 0, "full": 0, "refused": 0, "item_diffs": 0, "late_start": 0, "moved_back": 0,
         "tails": 0, "plain": 0}


def incremental_reserve(key: tuple[object, ...], sh: Shape, arch_fn: Callable[[Builder], None],
                        backends: list[Backend], op_offload: bool, items: Sequence[Placed],
                        where: Callable[[], WeightWhere], weights: Callable[[], Callable[[str], T | None]],
                        layer_dev: Callable[[int], str], kv_dev: Callable[[int], str],
                        unit_devices: list[str], offload_kqv: bool, no_alloc: bool = False) -> Reserve:
    """``reserve`` (one copy) replayed against the recorded reference of the same topology nearest to
    this placement; recorded the second time a placement near it is simulated (or the first:
    :func:`record_at_first_sight`).

    ``items`` are the placement's; ``where`` and ``weights`` make its weight table and weight factory
    (only asked for when the items do not line up with the reference's, or to record one).
    ``no_alloc``: the dry run's reserve (forced backends dropped; ``key`` must tell it apart)."""
    ref = _nearest(key, unit_devices)
    if ref is not None:
        try:
            mv = _diff_items(ref, items, unit_devices, offload_kqv)
            if mv is not None:
                stats["item_diffs"] += 1
            else:
                mv = _diff(ref, where(), unit_devices, offload_kqv)
            r = replay(ref, mv)
            stats["replays"] += 1
            return r
        except Exception:  # _Refuse, or a case the replay does not know: run it in full
            stats["refused"] += 1
    elif _first_sight(key, unit_devices):
        stats["plain"] += 1
        return reserve(sh, arch_fn, backends, 1, weights(), layer_dev, kv_dev, no_alloc=no_alloc,
                       op_offload=op_offload)
    try:
        ref = _Ref(sh, arch_fn, backends, op_offload, weights(), layer_dev, kv_dev, items, unit_devices,
                   keep_forced=not no_alloc)
    except _Refuse:
        stats["full"] += 1
        return reserve(sh, arch_fn, backends, 1, weights(), layer_dev, kv_dev, no_alloc=no_alloc,
                       op_offload=op_offload)
    stats["full"] += 1
    _keep(key, ref)
    return ref.reserve
