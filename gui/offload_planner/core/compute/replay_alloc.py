"""Step 4 of the incremental reserve (:mod:`.incremental`): the graph allocator over a replay's
window from the reference's checkpoint, then the reference's per-backend events until each backend
is in the reference's state again."""

from __future__ import annotations

import bisect
from collections.abc import Callable

from offload_planner.core.compute.allocator import DynAllocator, peak_label
from offload_planner.core.compute.ggml import (
    INPLACE_OPS,
    LAYER_SUFFIX,
    OUTPUT,
    T,
    same_layout,
)
from offload_planner.core.compute.periods import Event, PeriodWalk, apply_span
from offload_planner.core.compute.rec_alloc import Checkpoint, Refuse
from offload_planner.core.compute.recording import Reference
from offload_planner.core.compute.stats import stats

#: the shortest stretch of unchanged nodes whose allocator events are taken from the reference
_MIN_STRETCH = 32
#: tail states are kept for later tails at the stops of every this many checkpoints; at most this many
_MEMO_STRIDE = 4
_MEMO_SIZE = 200_000


def replay_alloc(ref: Reference, wa: int, ref_end: int, wnodes: list[T], wids: list[int],
                 runs: list[tuple[int, int, int]], newsrc: dict[T, list[T | None]],
                 newdev: dict[T, str]) -> tuple[list[int], list[str]]:
    """Sizes and peak labels per backend: the allocator over the replay's sched window ``wnodes``
    (which stands for the reference's positions ``wa`` to ``ref_end``; ``runs``: window index,
    reference position and length of parts that are the reference's nodes), then the reference's
    nodes."""
    return _AllocReplay(ref, wa, ref_end, wnodes, wids, runs, newsrc, newdev).run()


def same_node(n: T, r: T) -> bool:
    """Window node ``n`` does what reference node ``r`` does: the same node, or the dependency
    node of a split input on the same input (created again by the replay)."""
    return n is r or (n.op == "NONE" and r.op == "NONE" and n.view_src is not None
                      and n.view_src is r.view_src and n.src == r.src)



class _AllocReplay:
    """The allocator walk of one replay: its start, state and counts (see the module's step 4)."""

    def __init__(self, ref: Reference, wa: int, ref_end: int, wnodes: list[T], wids: list[int],
                 runs: list[tuple[int, int, int]], newsrc: dict[T, list[T | None]],
                 newdev: dict[T, str]) -> None:
        # location changes of allocatable tensors would change the leaf pass
        for t in newdev:
            if t.location is None:
                raise Refuse("location")
        self.ref, self.ref_end, self.newsrc, self.newdev = ref, ref_end, newsrc, newdev
        self.wa, self.wnodes, self.wids, self.runs = wa, wnodes, wids, runs
        # uses in this run's window minus the reference's: in all of it, and from ``base`` on (the
        # remaining counts are the reference's uses at or after ``base`` corrected by it; ``base``
        # moves on past a skipped stretch)
        self.d_all: dict[T, int] = {}
        self.base, self.d_base = wa, self.d_all
        self.changed: set[T] = set()
        # per backend whose state at the start is patched (``_patches_for``): checkpoint, frees left out,
        # frees added by position
        self.patches: dict[int, tuple[int, set[T], dict[int, list[T]]]] = {}
        self.stop = 0  # where the last stretch stopped (``_skip``)
        self._move_start(self._first_difference())
        self._restore()

    # --- counts --------------------------------------------------------------------------------

    def srcs(self, n: T) -> tuple[T | None, ...] | list[T | None]:
        s = self.newsrc.get(n)
        return n.src if s is None else s

    def r_ref(self, t: T) -> int:
        """Uses of ``t`` at or after the start in the reference."""
        u = self.ref.uses.get(t)
        return 0 if u is None else len(u) - bisect.bisect_left(u, self.base)

    def r_new(self, t: T) -> int:
        return self.r_ref(t) + self.d_base.get(t, 0)

    def total_new(self, t: T) -> int:
        u = self.ref.uses.get(t)
        return (0 if u is None else len(u)) + self.d_all.get(t, 0)

    def v_new(self, t: T) -> int:
        views = self.ref.view_nodes.get(t)
        if not views:
            return 0
        return sum(1 for v in views if self.total_new(v) == 0 or self.r_new(v) > 0)

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
            if wids[f] != rids[wa + f] or not same_node(n, r):
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
        w0, win0, wid0, runs0 = self.wa, self.wnodes, self.wids, self.runs
        d_w = self._diff(0, w0)  # (a start before the window adds the reference's nodes: the same)
        while True:
            c0 = ckpos[bisect.bisect_right(ckpos, target) - 1]
            if c0 < w0:  # before the window: the reference's nodes up to it
                self.wnodes, self.wids = rnodes[c0:w0] + win0, rids[c0:w0] + wid0
                self.runs = [(0, c0, w0 - c0)] + [(j + w0 - c0, r, n) for j, r, n in runs0]
            else:
                self.wnodes, self.wids = win0[c0 - w0:], wid0[c0 - w0:]
                cut = c0 - w0
                self.runs = [(max(j - cut, 0), r + max(cut - j, 0), n - max(cut - j, 0))
                             for j, r, n in runs0 if j + n > cut]
            wa = self.wa = self.base = c0
            # the window's counts less those of its cut start (cheaper than counting the rest again)
            d = d_w if c0 <= w0 else _minus(d_w, self._before(win0, runs0, w0, c0 - w0, c0))
            self.d_all = self.d_base = d
            self.changed = {t for t, d in self.d_all.items() if d}
            back = wa
            late: list[tuple[T, int, bool]] = []  # (tensor, its last use before the start, kept in this run)
            for t in self.changed:
                if self.fixed(t) or first.get(t, wa) >= wa or (self.r_ref(t) > 0 and self.r_new(t) > 0):
                    continue
                u = uses.get(t, [])
                k = bisect.bisect_left(u, wa)
                back = min(back, u[k - 1] if k else first[t])
                late.append((t, u[k - 1] if k else -1, self.r_new(t) > 0))
            if back == wa:
                return
            if self._patches_for(late):
                stats["patched_back"] += 1
                return
            if back < 0:
                raise Refuse("count of an input used before the window")
            stats["moved_back"] += 1
            target = back

    def _patches_for(self, late: list[tuple[T, int, bool]]) -> bool:
        """Instead of moving the start back before the last use of each ``late`` tensor: that tensor
        lives on one backend, whose allocator alone differs at the start (the other backends' states
        are the checkpoint's).  A tensor this run keeps (the reference frees it at its last use before
        the start) and one it frees there (the reference keeps it) are patched into that backend's
        reference events from a checkpoint before the use (``self.patches``, applied by
        :meth:`_restore`).  False (nothing kept) where a case is not this simple: a view or a tensor
        with views, never used before the start, or one whose last use may take it over in place
        (:meth:`_place`), or not allocated at the checkpoint."""
        ref, wa = self.ref, self.wa
        ck_wa = ref.cks[wa]
        patches: dict[int, tuple[int, set[T], dict[int, list[T]]]] = {}
        for t, pos, kept in late:
            if t.flags & OUTPUT:  # never freed nor taken over in place: the same in both runs
                continue
            if pos < 0 or t.view_src is not None or ref.view_nodes.get(t):
                return False
            c = ref.ckpos[bisect.bisect_right(ref.ckpos, pos) - 1]
            got = ref.cks[c].live.get(t)
            if got is None:
                return False
            b = got[0][0]
            if kept and not _frees_at(ref, b, pos, t):
                return False  # the reference's last use took it over in place
            if not kept:
                n = ref.sched_nodes[pos]
                if t not in ck_wa.live or (n.op in INPLACE_OPS and same_layout(n, t)):
                    return False
            c0, drop, add = patches.get(b, (c, set(), {}))
            if kept:
                drop.add(t)
            else:
                add.setdefault(pos, []).append(t)
            patches[b] = (min(c0, c), drop, add)
        self.patches = patches
        return True

    def _patch(self, b: int, c: int, drop: set[T], add: dict[int, list[T]]) -> None:
        """Backend ``b``'s allocator at the start from checkpoint ``c`` and the reference's events from
        there, without the frees of ``drop`` and with frees of ``add`` after the events of their
        positions; the backend's tensors live at the start (and those of ``drop``) with their offsets."""
        ref, wa = self.ref, self.wa
        ck = ref.cks[c]
        al = self.allocs[b] = DynAllocator(ref.backends[b].alignment)
        al.blocks = [list(x) for x in ck.blocks[b]]
        al.max_size = ck.max_size[b]
        own_b = {t: off for t, ((tb, off), _, _) in ck.live.items() if tb == b}
        evs, poss = ref.tail[b], ref.tail_pos[b]
        adds = sorted(add.items(), key=lambda e: e[0])
        events: list[Event] = []
        i = 0
        for k in range(bisect.bisect_left(poss, c), bisect.bisect_left(poss, wa)):
            while i < len(adds) and adds[i][0] < poss[k]:  # after every event of its position
                events += ((2, t, t, ref.size(t, b), 0, "") for t in adds[i][1])
                i += 1
            e = evs[k]
            if not (e[0] == 2 and e[1] in drop):
                events.append(e)
        for _, ts in adds[i:]:
            events += ((2, t, t, ref.size(t, b), 0, "") for t in ts)
        self.peaks[b] = al.apply(events, own_b, ck.peaks[b])
        live_wa = ref.cks[wa].live
        for t in [t for t, (tb, _) in self.own.items() if tb == b]:
            del self.own[t]
        for t, off in own_b.items():
            if t in live_wa or t in drop:
                self.own[t] = (b, off)

    def _diff(self, j: int, r: int) -> dict[T, int]:
        """Uses in the window from index ``j`` on minus the reference's from position ``r`` (where it
        stands) on; the runs that are the reference's nodes cancel and are not counted."""
        d: dict[T, int] = {}
        wnodes, rnodes = self.wnodes, self.ref.sched_nodes
        for js, rs, n in self.runs:
            if js + n <= j:
                continue
            if js > j or rs > r:  # (a run at the window's start may follow reference copies it drops)
                self._count(d, wnodes[j:js], rnodes[r:rs])
            j, r = js + n, rs + n
        self._count(d, wnodes[j:], rnodes[r:self.ref_end])
        return d

    def _before(self, wnodes: list[T], runs: list[tuple[int, int, int]], wa: int, j: int,
                r: int) -> dict[T, int]:
        """``_diff(0, wa)`` less ``_diff(j, r)`` of the window ``wnodes`` (with ``runs``) that starts at
        reference position ``wa``: the uses by its nodes before index ``j`` minus the reference's
        before position ``r`` (the runs cancel)."""
        d: dict[T, int] = {}
        rnodes = self.ref.sched_nodes
        wj, rr = 0, wa
        for js, rs, n in runs:
            if js >= j:
                break
            self._count(d, wnodes[wj:js], rnodes[rr:rs])
            wj, rr = js + n, rs + n
        if wj < j:
            self._count(d, wnodes[wj:j], rnodes[rr:r])
        return d

    def _diff_from(self, j: int, r: int) -> dict[T, int]:
        """``_diff(j, r)``; before a stretch was skipped, from the whole window's counts less those
        before ``j`` where fewer of the window's nodes outside its runs come before ``j`` than after."""
        covered = sum(min(js + n, j) - js for js, _, n in self.runs if js < j)
        total = sum(n for _, _, n in self.runs)
        if self.base == self.wa and j - covered < len(self.wnodes) - j - (total - covered):
            stats["diff_shortcuts"] += 1
            return _minus(self.d_all, self._before(self.wnodes, self.runs, self.wa, j, r))
        return self._diff(j, r)

    def _count(self, d: dict[T, int], new: list[T], old: list[T]) -> None:
        """Uses by ``new`` minus uses by ``old``, of the tensors the allocator handles (one in a
        buffer, or a view of one, is never allocated or freed: its count decides nothing)."""
        newsrc, facts, ref, get = self.newsrc, self.ref.walk_facts, self.ref, d.get
        for n in new:
            ss = newsrc.get(n)
            if ss is None:  # (the walk's facts hold the sources counted: ``rels``)
                f = facts.get(n)
                if f is None:
                    f = facts[n] = _walk_facts(ref, n, n.src)
                for s in f[3]:
                    d[s] = get(s, 0) + 1
                continue
            for x in ss:
                if x is not None and (x.dev if x.view_src is None else x.view_src.dev) is None:
                    d[x] = get(x, 0) + 1
        for n in old:
            f = facts.get(n)
            if f is None:
                f = facts[n] = _walk_facts(ref, n, n.src)
            for s in f[3]:
                d[s] = get(s, 0) - 1

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
        # (a live tensor whose count and views' counts the window leaves has the checkpoint's counts:
        # they are the reference's uses from the start on)
        self.nc: dict[T, int] = {}
        self.nv: dict[T, int] = {}
        self.where = ck.layer
        self.cur = self.wnodes[0] if self.wnodes else ref.sched_nodes[self.wa]
        for b, (c, drop, add) in self.patches.items():
            self._patch(b, c, drop, add)

    # --- the walk ------------------------------------------------------------------------------

    def allocate(self, t: T, b: int) -> None:
        if t in self.own or t.view_src is not None or self.newdev.get(t, t.dev) is not None:
            return
        self._place(t, b)

    def _place(self, t: T, b: int) -> None:
        """``allocate`` of a tensor that the graph allocator owns and has not allocated yet."""
        own = self.own
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
                psize, nsize = al.align(self.ref.size(p, pb)), al.align(self.ref.size(t, b))
                if psize > nsize:
                    al.free(poff + nsize, psize - nsize)
                return
        al = self.allocs[b]
        before = al.max_size
        own[t] = (b, al.alloc(self.ref.size(t, b)))
        if al.max_size > before:
            self.peaks[b] = peak_label(self.cur, self.where)

    def free(self, t: T) -> None:
        if t.flags & OUTPUT:
            return
        b, off = self.own.pop(t)
        self.allocs[b].free(off, self.ref.size(t, b))

    def dead(self, p: T) -> None:
        """``p``'s last use is done (its count is zero now): free it (or its view source) unless views
        of it are still read."""
        nv = self.nv
        v = nv.get(p)
        if v is None:
            v = nv[p] = self.v_new(p) if p in self.ref.view_nodes else 0
        if v:
            return
        vs = p.view_src
        if vs is not None:
            v = self.NV(vs) - 1
            nv[vs] = v
            if v == 0 and self.NC(vs) == 0 and vs in self.own:
                self.free(vs)
        elif p in self.own:
            self.free(p)

    def run(self) -> tuple[list[int], list[str]]:
        ref, wa, wnodes, wids = self.ref, self.wa, self.wnodes, self.wids
        rnodes, rids, cks = ref.sched_nodes, ref.sched_ids, ref.cks
        place, dead, newsrc, nc = self._place, self.dead, self.newsrc, self.nc
        facts, facts_new, uses = ref.walk_facts, ref.walk_facts_new, ref.uses
        allocs, sizes, size = self.allocs, ref.size_cache, ref.size
        delta = len(wnodes) - (self.ref_end - wa)
        stretches = self._stretches()
        q, end, w_end = wa, len(rnodes) + delta, wa + len(wnodes)
        own = self.own
        while q < end:
            if stretches and (st := stretches.get(q - wa)) is not None:
                r1 = self._skip(st[0], st[1], q - wa)
                own = self.own
                if self.stop < st[1]:  # at a use of a tensor whose state differs: again after it
                    self._again(stretches, q - wa, st)
                if r1 > st[0]:
                    q += r1 - st[0]
                    continue
            if q >= w_end:
                qr = q - delta
                ckq = cks.get(qr)
                if ckq is not None and _same_live(ckq, own, self.NC, self.NV):
                    return _tails(ref, qr, allocs, own, self.peaks)
                n, b = rnodes[qr], rids[qr]
            else:
                n, b = wnodes[q - wa], wids[q - wa]
            q += 1
            self.cur = n
            ss = newsrc.get(n)
            if ss is None:
                f = facts.get(n)
                if f is None:
                    f = facts[n] = _walk_facts(ref, n, n.src)
            else:  # (a node with copies among its sources: kept by both, the copies are the reference's)
                key = (n, *ss)
                f = facts_new.get(key)
                if f is None:
                    if len(facts_new) > _MEMO_SIZE:
                        facts_new.clear()
                    f = facts_new[key] = _walk_facts(ref, n, ss)
            tag, cands, mine, rels = f
            if tag:
                self.where = tag
            # (allocate and release inlined where they return at once: most sources are allocated or
            # have a buffer, most releases leave uses to come; ``_place`` inlined for a node that
            # cannot take over a source in place)
            for x in cands:
                if x not in own:
                    place(x, b)
            if mine and n not in own:
                if n.op in INPLACE_OPS:
                    place(n, b)
                else:
                    al = allocs[b]
                    before = al.max_size
                    sz = sizes.get((n, b))
                    own[n] = (b, al.alloc(size(n, b) if sz is None else sz))
                    if al.max_size > before:
                        self.peaks[b] = peak_label(n, self.where)
            for x in rels:
                c = nc.get(x)
                if c is None:  # (its first release since the start or a stretch: ``r_new``)
                    u = uses.get(x)
                    c = ((0 if u is None else len(u) - bisect.bisect_left(u, self.base))
                         + self.d_base.get(x, 0))
                nc[x] = c - 1
                if c == 1:
                    dead(x)
        return [a.max_size for a in allocs], self.peaks

    # --- a stretch of the window the reference walked the same way ------------------------------

    def _stretches(self) -> dict[int, tuple[int, int]]:
        """Window index -> (reference position, end): the runs of the window that are the reference's
        nodes, from their first checkpoint on (a split whose copies changed walks its whole body
        otherwise)."""
        out: dict[int, tuple[int, int]] = {}
        ckpos = self.ref.ckpos
        for j, r, n in self.runs:
            k = bisect.bisect_left(ckpos, r)
            if k < len(ckpos) and r + n - ckpos[k] >= _MIN_STRETCH:
                out[j + ckpos[k] - r] = (ckpos[k], r + n)
        return out

    def _again(self, stretches: dict[int, tuple[int, int]], j0: int, st: tuple[int, int]) -> None:
        """The stretch ``st`` (from window index ``j0``) stopped at ``self.stop``, a use of a tensor whose
        state differs from the reference's: tried again from the first checkpoint after that use (the
        walk has passed it; a count that differed there may now be one the stretch can carry: the
        dense model's ``inp_pos`` copy on the first GPU, which the reference frees at its last layer
        there and a layer moved to the CPU reads again much later)."""
        ckpos = self.ref.ckpos
        k = bisect.bisect_right(ckpos, self.stop)
        if k < len(ckpos) and st[1] - ckpos[k] >= _MIN_STRETCH:
            stretches[j0 + ckpos[k] - st[0]] = (ckpos[k], st[1])

    def _skip(self, r0: int, r1: int, j0: int) -> int:
        """At checkpoint ``r0``, the reference's per-backend events up to ``r1`` (or the first use of
        a tensor whose state differs from the reference's there) applied to this run's allocators;
        returns where the walk goes on (``r0``: not skipped).  A tensor live on the same backend in
        both runs (or in neither) whose count differs does not stop the stretch when both runs still
        use it after it (then neither frees it or reuses it in place there), else only at its last
        use in the stretch (before it, both runs still have that use to come)."""
        ref = self.ref
        uses = ref.uses
        after = self._diff_from(j0 + r1 - r0, r1)
        end = r1
        for t, hard in self._differences(ref.cks[r0]).items():
            u = uses.get(t)
            if not u:
                continue
            k = bisect.bisect_left(u, r0)
            if k == len(u) or u[k] >= end:
                continue
            if not hard:
                k1 = bisect.bisect_left(u, r1)
                n_ref = len(u) - k1
                if n_ref > 0 and n_ref + after.get(t, 0) > 0:
                    continue
                k = k1 - 1  # every use before its last one in the stretch leaves it used in both runs
            end = min(end, u[k])
        self.stop = end
        if end - r0 < _MIN_STRETCH:
            return r0
        stats["skips"] += 1
        per: list[dict[T, int]] = [{} for _ in self.allocs]
        for t, (b, off) in self.own.items():
            per[b][t] = off
        for b, al in enumerate(self.allocs):
            self.peaks[b] = apply_span(ref.periods, b, al, ref.tail[b], ref.tail_pos[b], r0, end, per[b],
                                       self.peaks[b])
        self.own = {t: (b, off) for b, d in enumerate(per) for t, off in d.items()}
        self.base, self.d_base = end, after if end == r1 else self._diff_from(j0 + end - r0, end)
        self.nc.clear()
        self.nv.clear()
        rnodes = ref.sched_nodes
        for q in range(end - 1, r0 - 1, -1):
            if (m := LAYER_SUFFIX.search(rnodes[q].name)) is not None:
                self.where = f" (layer {m.group(1)})"
                break
        return end

    def _differences(self, ck: Checkpoint) -> dict[T, bool]:
        """Tensors whose state differs from the reference's at checkpoint ``ck``: True where it is
        live in one run only or on another backend, False where only its remaining child or view
        count differs or the window changes its count; with the views and view sources of each."""
        NC, NV = self.NC, self.NV
        new_live = {}
        for t, (b, _) in self.own.items():
            c, v = NC(t), NV(t)
            if c or v:
                new_live[t] = (b, c, v)
        out = dict.fromkeys(self.changed, False)
        for t, ((b, _), c, v) in ck.live.items():
            e = new_live.pop(t, None)
            if e is None or e[0] != b:
                out[t] = True
            elif e[1] != c or e[2] != v:
                out.setdefault(t, False)
        out.update(dict.fromkeys(new_live, True))
        views = self.ref.view_nodes
        for t, hard in list(out.items()):
            vs = t.view_src
            for x in ((vs, *views.get(vs, ())) if vs is not None else ()) + tuple(views.get(t, ())):
                if hard:
                    out[x] = True
                else:
                    out.setdefault(x, False)
        return out


WalkFacts = tuple[str, tuple[T, ...], bool, tuple[T, ...]]


def _walk_facts(ref: Reference, n: T, ss: list[T | None]) -> WalkFacts:
    """What the walk asks of node ``n`` with sources ``ss``, which do not depend on the move (kept with
    the reference per node, for the nodes with their reference sources): its peak label's layer tag
    ("" for none), the sources the graph allocator may have to allocate (no view, no buffer: a move
    changes the device of tensors that have one), whether it may allocate the node itself, and the
    sources whose uses it releases (a tensor in a buffer, or a view of one, is never freed and its
    counts are never asked for)."""
    tag = ref.layer_tags.get(n)
    if tag is None:
        tag = "" if n in ref.first else _layer_tag(n)  # a copy made by a replay: by its name
    cands = tuple(x for x in ss if x is not None and x.view_src is None and x.dev is None)
    rels = tuple(x for x in ss if x is not None and (x.dev if x.view_src is None else x.view_src.dev) is None)
    return tag, cands, n.view_src is None and n.dev is None, rels


def _frees_at(ref: Reference, b: int, pos: int, t: T) -> bool:
    """The reference frees ``t`` on backend ``b`` at position ``pos`` (not taken over in place)."""
    poss, evs = ref.tail_pos[b], ref.tail[b]
    k = bisect.bisect_left(poss, pos)
    while k < len(poss) and poss[k] == pos:
        if evs[k][0] == 2 and evs[k][1] is t:
            return True
        k += 1
    return False


def _minus(a: dict[T, int], b: dict[T, int]) -> dict[T, int]:
    """``a - b`` per tensor."""
    out = dict(a)
    for t, v in b.items():
        out[t] = out.get(t, 0) - v
    return out


_TAGS: dict[str, str] = {}


def _layer_tag(n: T) -> str:
    """`` (layer N)`` of a node named for a layer, else "" (by name: a replay's copies are new nodes
    with the names of earlier replays' copies)."""
    tag = _TAGS.get(n.name)
    if tag is None:
        m = LAYER_SUFFIX.search(n.name)
        tag = "" if m is None else f" (layer {m.group(1)})"
        if len(_TAGS) > 100_000:
            _TAGS.clear()
        _TAGS[n.name] = tag
    return tag


def _same_live(ck: Checkpoint, own: dict[T, tuple[int, int]], NC: Callable[[T], int],
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


def _tails(ref: Reference, qr: int, allocs: list[DynAllocator], own: dict[T, tuple[int, int]],
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


def _same_on(ref: Reference, ck: Checkpoint, b: int, al: DynAllocator, own_b: dict[T, int]) -> bool:
    if al.blocks != ck.blocks[b]:
        return False
    tensors, offsets = ck.live_on(b, len(ref.backends), ref.first)
    return tuple(map(own_b.get, tensors)) == offsets


def _with_suffix(ck: Checkpoint, b: int, size: int, label: str) -> tuple[int, str]:
    """The maximum so far combined with the reference's from the checkpoint on (a tie keeps the
    earlier allocation's label, as the allocator does)."""
    assert ck.suffix is not None
    s_max, s_label = ck.suffix[b]
    return (size, label) if size >= s_max else (s_max, s_label)


def _tail(ref: Reference, b: int, qr: int, al: DynAllocator, own_b: dict[T, int],
          label: str) -> tuple[int, str]:
    """Backend ``b``'s events from position ``qr`` on; checked at the tail's stops (every few
    checkpoints, and the layer starts: ``Reference.tail_stops``) after some event (without events
    neither state changes) against the reference's state (once equal, equal at every later stop: a
    later stop finds it as well, with the same maximum from there), and every few checkpoints
    against the states earlier tails passed there (``Reference.tail_memo``: the rest of a tail is a
    function of its position, blocks and live offsets; a move moves the residual stream to the other
    of two blocks, and the next move's tail meets the same state).  At a layer start where the
    reference's events repeat, whole periods of layers are jumped when the state repeats too
    (:mod:`.periods`).  The maxima are kept per chunk of events between checkpoints, so each state
    passed can be stored with its maximum from there on."""
    stats["tails"] += 1
    evs, poss, memo = ref.tail[b], ref.tail_pos[b], ref.tail_memo
    stops, stop_ck = ref.tail_stops, ref.tail_stop_ck
    k, n = bisect.bisect_left(poss, qr), len(poss)
    n_st = len(stops)
    s = bisect.bisect_left(stops, qr)
    if s < n_st and stops[s] != qr:  # (the state at the next stop is not this one)
        s = n_st
    size, chunks, seen = al.max_size, list[tuple[int, str]](), list[tuple[tuple[object, ...], int]]()
    rest: tuple[int, str] = (-1, "")
    walk = PeriodWalk(ref.periods, b)
    starts, cks, n_b = ref.periods.at, ref.cks, len(ref.backends)
    while True:
        if s < n_st and stop_ck[s] % _MEMO_STRIDE == 0:
            pos = stops[s]
            key: tuple[object, ...] = (pos, b, tuple(map(tuple, al.blocks)),
                                       tuple(map(own_b.get, cks[pos].live_on(b, n_b, ref.first)[0])))
            if (hit := memo.get(key)) is not None:
                stats["tail_hits"] += 1
                rest = hit
                break
            seen.append((key, len(chunks)))
        if k >= n:
            break
        s = bisect.bisect_right(stops, poss[k])  # the first stop after the next event
        hi = bisect.bisect_left(poss, stops[s], k) if s < n_st else n
        al.max_size = 0  # the chunk's own maximum and the label of its first allocation reaching it
        clabel = al.apply(evs[k:hi], own_b, "")
        chunks.append((al.max_size, clabel))
        k = hi
        if s >= n_st:
            continue
        pos = stops[s]
        if pos in starts and (to := walk.at(pos, al.blocks, own_b, len(chunks))) is not None:
            seen = [e for e in seen if e[1] <= walk.mark]
            s = bisect.bisect_left(stops, to)
            pos = stops[s]
            k = bisect.bisect_left(poss, pos, k)
        # (the blocks first: a cheap test that fails on most stops)
        if al.blocks == (ck := cks[pos]).blocks[b] and _same_on(ref, ck, b, al, own_b):
            assert ck.suffix is not None
            rest = ck.suffix[b]
            break
    return _tail_max(memo, seen, chunks, rest, size, label)


def _tail_max(memo: dict[tuple[object, ...], tuple[int, str]], seen: list[tuple[tuple[object, ...], int]],
              chunks: list[tuple[int, str]], rest: tuple[int, str], size: int, label: str) -> tuple[int, str]:
    """The tail's maximum and its label (the maximum before it, ``size``, wins a tie), and the memo of
    the states it passed with their maxima from there on."""
    suffix = [rest] * (len(chunks) + 1)
    for i in range(len(chunks) - 1, -1, -1):  # a tie keeps the earlier allocation's label
        suffix[i] = chunks[i] if chunks[i][0] >= suffix[i + 1][0] else suffix[i + 1]
    if len(memo) > _MEMO_SIZE:
        memo.clear()
    for seen_key, i in seen:
        memo[seen_key] = suffix[i]
    return (size, label) if size >= suffix[0][0] else suffix[0]
