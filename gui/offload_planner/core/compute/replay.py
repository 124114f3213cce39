"""Steps 1-3 of the incremental reserve (:mod:`.incremental`): the devices that changed, the backends
they change (passes 1-4) and the splits (pass 5), and the sched window they make."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from offload_planner.core.compute.allocator import GraphAllocator
from offload_planner.core.compute.bound import Bound, owned
from offload_planner.core.compute.ggml import (
    CPU,
    VIEW_OPS,
    T,
    nbytes,
)
from offload_planner.core.compute.graph import WeightWhere
from offload_planner.core.compute.rec_alloc import Refuse
from offload_planner.core.compute.recording import Reference
from offload_planner.core.compute.replay_alloc import replay_alloc
from offload_planner.core.compute.reserve import Reserve
from offload_planner.core.compute.scheduler import Split
from offload_planner.core.compute.stats import stats
from offload_planner.core.item_changes import changed_items
from offload_planner.core.placement import Placed

# --- the replay ----------------------------------------------------------------------------------------

#: a change whose affected nodes span more of the graph than this share, and are more than this share
#: of the nodes in their span, is simulated in full: the replay would walk nearly all of it, with its
#: bookkeeping (the --fit search's step that gives a device all the remaining layers, with their
#: experts, against the reference of the step before: 0.86 and 0.27 on DeepSeek-V3); a few layers moved
#: far apart are replayed (the reference's events between them, periods jumped)
FAR_SPAN = 0.5
FAR_DENSITY = 0.15


class Far(Exception):
    """The change touches most of the graph: run it in full (no reference recorded for it)."""


@dataclass
class Move:
    dev: dict[T, str]  # device-carrying tensors whose device changed
    forced: dict[T, str]  # forced nodes whose device changed


def diff_items(ref: Reference, items: Sequence[Placed], unit_devices: list[str],
                offload_kqv: bool) -> Move | None:
    """The devices that changed, from the placement items that differ from the reference's by identity
    (``Placed`` is frozen; the reference keeps its items alive); None when the items do not line up
    (another count, or a changed item of another tensor or loaded state)."""
    ref_items = ref.items
    if len(items) != len(ref_items):
        return None
    dev: dict[T, str] = {}
    leafs_of = ref.leafs_of_item
    for i in changed_items(items, ref_items):
        p, q = items[i], ref_items[i]
        if p.tensor is not q.tensor or p.copy != q.copy or p.device is None or q.device is None:
            return None
        for t in leafs_of.get(i, ()):
            if p.device != t.dev:
                dev[t] = p.device
    return _layer_diff(ref, dev, unit_devices, offload_kqv)


def _layer_diff(ref: Reference, dev: dict[T, str], unit_devices: list[str], offload_kqv: bool) -> Move:
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
    return Move(dev, forced)


def diff(ref: Reference, where: WeightWhere, unit_devices: list[str],
          offload_kqv: bool) -> Move:
    dev: dict[T, str] = {}
    forced: dict[T, str] = {}
    layers_changed = unit_devices != ref.unit_devices
    for t, kind, key in ref.dev_of:
        if kind == 0:
            assert isinstance(key, str)
            w = where.get(key)
            if w is None:
                raise Refuse("weight set")
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
    return Move(dev, forced)


def replay(ref: Reference, mv: Move, below: list[int] | None = None) -> Reserve | None:
    """The reserve of the reference's graph with the devices of ``mv``, replayed (steps 2-4); None
    when ``below`` is given and a bound of its sizes (:mod:`.bound`) is at most ``below`` on every
    backend (the caller keeps the larger reserve per backend: this one cannot be it)."""
    if not mv.dev and not mv.forced:
        return ref.reserve
    return _Replay(ref, mv).run(below)


class _Replay:
    """One replay: the backends that change (passes 1-4), the splits that change (pass 5), the sched
    window they make, and the allocator over it."""

    def __init__(self, ref: Reference, mv: Move) -> None:
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
                raise Refuse("pass 3 would assign")
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
        bid, supported = self.bid, self.supported
        created, cs, last_on = ref.created, ref.created_sorted, ref.last_on
        cur_before, ne_before, orig_src = ref.cur_before, ref.ne_before, ref.orig_src
        start, split = self._first_split(fa)
        self.new_splits = [split]
        cur = split.backend
        kc = _first_at(cs, start)
        ref_made: set[tuple[T, int]] = set()
        self.x = len(nodes)
        for i in range(start, len(nodes)):
            if cur_before[i] == -2:  # a view (pass 5 skips them)
                continue
            n = nodes[i]
            while kc < len(cs) and cs[kc][0] < i:
                ref_made.add(cs[kc][1])
                kc += 1
            if i > fb and cur == cur_before[i] and bool(split.inputs) == ne_before[i] \
                    and all(last_on.get(key, -1) < i for key in ref_made.symmetric_difference(made)):
                self.x = i  # copies made in one run only: no later node on their backend reads them
                break
            nb = bid.get(n, n.bid)
            src = orig_src[i]
            if nb != cur or (split.inputs and _weight_elsewhere(src, cur, bid, supported)):
                split.i_end = i
                split = Split(nb, i)
                self.new_splits.append(split)
                cur = nb
            out = list(src)
            for j, s in enumerate(src):
                if s is None or bid.get(s, s.bid) == cur or supported(s, cur):
                    continue
                key = (s, cur)
                cp = made.get(key)
                if cp is None:
                    if key in created and created[key] < start:
                        cp = ref.copy_of[key]
                    else:
                        cp = ref.copy(s, cur)
                        made[key] = cp
                        split.inputs.append(s)
                out[j] = cp
            if out != n.src:  # (the reference's own copies are the same objects)
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

    def window(self, fa: int) -> tuple[int, list[T], list[int], list[tuple[int, int, int]]]:
        """The new sched window, the reference position it starts at, and the runs of it that are the
        reference's nodes (window index, reference position, length: the nodes before the first
        affected one in a split whose copies changed); when the first split keeps the reference's
        inputs, it starts at the first affected node (the copies and nodes before it are the
        reference's)."""
        ref, kk, bid, made = self.ref, self.kk, self.bid, self.made
        wnodes: list[T] = []
        wids: list[int] = []
        runs: list[tuple[int, int, int]] = []
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
                    wnodes.append(ref.dep(inp))
                    wids.append(bid.get(inp, inp.bid))  # (``B`` inlined)
                    cp = made.get((inp, sp.backend))
                    wnodes.append(ref.copy(inp, sp.backend) if cp is None else cp)
                    wids.append(sp.backend)
            hi = min(sp.i_end, self.x)
            mid = max(lo, min(hi, fa))
            if mid - lo > 1 and ref.sp[mid - 1] - ref.sp[lo] == mid - 1 - lo:
                r = ref.sp[lo]
                runs.append((len(wnodes), r, mid - lo))
                wnodes += ref.sched_nodes[r:r + mid - lo]
                wids += ref.sched_ids[r:r + mid - lo]
                lo = mid
            for n in self.nodes[lo:hi]:
                wnodes.append(n)
                wids.append(bid.get(n, n.bid))  # (``B`` inlined)
        return wa, wnodes, wids, runs

    def run(self, below: list[int] | None = None) -> Reserve | None:
        ref = self.ref
        self.assign()
        moved = self._free_leafs()
        affected = self.affected()
        if not affected:
            return replay_alloc_same(ref, self.bid, self.newdev)
        fa, fb = min(affected), max(affected)
        if fb - fa > FAR_SPAN * len(self.nodes) and len(affected) > FAR_DENSITY * (fb - fa):
            raise Far
        if below is not None and self._below_any(below, affected):
            stats["left_out"] += 1
            stats["left_out_early"] += 1
            return None
        self.pass5(fa, fb)
        wa, wnodes, wids, runs = self.window(fa)
        if below is not None and self._below(below, wnodes, wids, runs):
            stats["left_out"] += 1
            return None
        if moved:
            sizes, peaks = self._alloc_from_start(wa, wnodes, wids)
        else:
            sizes, peaks = replay_alloc(ref, wa, self.ref_end, wnodes, wids, runs, self.newsrc, self.newdev)
        copies, wcopies = self._copies()
        splits = self.kept + self.new_splits + self.tail_splits
        return Reserve(ref.sh.n_tokens, sizes, peaks, copies, wcopies, len(self.nodes), len(splits))

    def _free_leafs(self) -> bool:
        """Pass 4 on the reference's free leafs (:meth:`Reference._free_leafs`): each takes its reader's
        new backend; True when one moves."""
        moved = False
        for t, i in self.ref.free_leafs:
            b = self.B(self.nodes[i])
            if b != t.bid:
                self.bid[t] = b
                moved = True
        return moved

    def _alloc_from_start(self, wa: int, wnodes: list[T], wids: list[int]) -> tuple[list[int], list[str]]:
        """A free leaf moved: the graph allocator places the leafs before any node, so its walk is redone
        from the start over the new sched graph (the reference's nodes around the window, the window's
        with their new sources), the scheduler's passes kept."""
        ref = self.ref
        nodes = ref.sched_nodes[:wa] + wnodes + ref.sched_nodes[self.ref_end:]
        ids = ref.sched_ids[:wa] + wids + ref.sched_ids[self.ref_end:]
        leafs = ref.sched.leafs
        saved = {n: n.src for n in self.newsrc}
        try:
            for n, src in self.newsrc.items():
                n.src = list(src)
            galloc = GraphAllocator(ref.backends)
            sizes = galloc.run(nodes, ids, leafs, [self.B(t) for t in leafs])
        finally:
            for n, src in saved.items():
                n.src = src
        stats["from_start"] += 1
        return sizes, galloc.peaks

    def _copies(self) -> tuple[list[int], list[int]]:
        """Per backend, the bytes the new graph's splits copy (all, and weights only): the reference's
        with its splits ``kept`` to ``km`` replaced by the new ones."""
        ref = self.ref
        c0, w0 = ref.copies_before(len(self.kept))
        c1, w1 = ref.copies_before(self.km + 1)
        copies = [a - b + x for a, b, x in zip(ref.copies, c1, c0, strict=True)]
        wcopies = [a - b + x for a, b, x in zip(ref.wcopies, w1, w0, strict=True)]
        known = ref.input_bytes
        for sp in self.new_splits:
            for inp in sp.inputs:
                nb = known.get(inp)
                if nb is None:
                    nb = known[inp] = nbytes(inp)
                copies[sp.backend] += nb
                if inp.weights:
                    wcopies[sp.backend] += nb
        return copies, wcopies

    def _below_any(self, below: list[int], affected: set[int]) -> bool:
        """Before pass 5: :meth:`early_bound` is at most ``below`` on every backend."""
        if any(x > y for x, y in zip(self.ref.alloc_bound(), below, strict=True)):
            return False
        return all(x <= y for x, y in zip(self.early_bound(affected), below, strict=True))

    def early_bound(self, affected: set[int]) -> list[int]:
        """A bound of this run's reserve (:mod:`.bound`) after passes 1-4: the reference's, plus each
        affected node and its sources on its backend in this run, plus the copies of
        :meth:`new_copies` on theirs.  A node outside ``affected`` keeps its backend, its sources'
        backends and locations, and so its copies: it asks what it asked in the reference.  Each
        node's part is kept with the reference (``node_bound``); a tensor two affected nodes share is
        counted for each (a looser bound: the one-token graph's tensors are a few rows each)."""
        ref, nodes, bid = self.ref, self.nodes, self.bid
        per, extra = ref.node_bound, [0] * len(ref.backends)
        for gi in affected:
            n = nodes[gi]
            b = bid.get(n, n.bid)  # (``B`` inlined)
            v = per.get((gi, b))
            if v is None:
                v = per[(gi, b)] = self._node_bound(gi, b)
            extra[b] += v
        aligns = ref.aligns
        for s, b in self.new_copies(affected):
            a = aligns[b]
            extra[b] += -(-ref.size(ref.copy(s, b), b) // a) * a
        return [r + w for r, w in zip(ref.alloc_bound(), extra, strict=True)]

    def _node_bound(self, gi: int, b: int) -> int:
        """The aligned sizes on ``b`` of node ``gi`` and its sources that the graph allocator owns,
        each once (in a buffer or a view: not; a move changes the device of tensors that have one)."""
        ref, a = self.ref, self.ref.aligns[b]
        ts = {t for t in (self.nodes[gi], *ref.orig_src[gi]) if t is not None and owned(t)}
        return sum(-(-ref.size(t, b) // a) * a for t in ts)

    def new_copies(self, affected: set[int]) -> set[tuple[T, int]]:
        """The split-input copies (source, backend) that pass 5 may make in this run and the reference
        did not: a real node on ``b`` reading ``s`` from elsewhere (pass 5's test, on this run's
        backends) needs one; a node outside ``affected`` has the reference's backend and sources'
        backends and locations, so its copies are the reference's."""
        ref, nodes, bid, supported = self.ref, self.nodes, self.bid, self.supported
        copy_of, cur_before, orig_src = ref.copy_of, ref.cur_before, ref.orig_src
        out: set[tuple[T, int]] = set()
        for gi in affected:
            if cur_before[gi] == -2:  # a view: pass 5 copies nothing for it
                continue
            n = nodes[gi]
            b = bid.get(n, n.bid)  # (``B`` inlined)
            for s in orig_src[gi]:
                if s is not None and bid.get(s, s.bid) != b and not supported(s, b) and (s, b) not in copy_of:
                    out.add((s, b))
        return out

    def _below(self, below: list[int], wnodes: list[T], wids: list[int],
               runs: list[tuple[int, int, int]]) -> bool:
        """The allocator's bound on the new graph is at most ``below`` on every backend: the
        reference's bound plus the window's tensors outside its runs of the reference's nodes (the
        rest of the new graph is the reference's).  Not where the reference's bound alone is above
        ``below`` on some backend (the window adds sizes, never takes any off): no window is summed."""
        ref, newdev, newsrc = self.ref, self.newdev, self.newsrc
        if any(r > x for r, x in zip(ref.alloc_bound(), below, strict=True)):
            return False

        def allocated(t: T) -> bool:
            return t.view_src is None and newdev.get(t, t.dev) is None

        def srcs(n: T) -> list[T | None]:
            s = newsrc.get(n)
            return n.src if s is None else s

        bound = Bound(ref.sizer, ref.size)
        j = 0
        for js, _, n in [*runs, (len(wnodes), 0, 0)]:
            bound.add_nodes(wnodes[j:js], wids[j:js], srcs, allocated)
            j = js + n
        return all(r + w <= x for r, w, x in zip(ref.alloc_bound(), bound.sizes, below, strict=True))


def _weight_elsewhere(src: Sequence[T | None], cur: int, bid: dict[T, int],
                      supported: Callable[[T, int], bool]) -> bool:
    """A weight among ``src`` that is neither on backend ``cur`` nor usable from there (pass 5 starts a
    new split for its node)."""
    for s in src:
        if s is not None and s.weights and bid.get(s, s.bid) != cur and not supported(s, cur):
            return True
    return False


def _first_at(cs: list[tuple[int, tuple[T, int]]], start: int) -> int:
    lo, hi = 0, len(cs)
    while lo < hi:
        mid = (lo + hi) // 2
        if cs[mid][0] < start:
            lo = mid + 1
        else:
            hi = mid
    return lo


def replay_alloc_same(ref: Reference, bid: dict[T, int], newdev: dict[T, str]) -> Reserve:
    """No node changed backend or source: the sched graph is the reference's (with other devices on
    leafs that are never allocated)."""
    for t in bid:
        if t.location is None:
            raise Refuse("backend of an allocated tensor")
    return ref.reserve


