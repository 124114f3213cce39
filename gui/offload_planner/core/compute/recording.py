"""The reference run of the incremental reserve: one full simulation of a reserve graph, recorded
with everything a replay compares against (devices, pass 1-4 assignments, pass 5 state before every
node, sched positions, allocator checkpoints and per-backend events).  See :mod:`.incremental`; the
allocator's recording walk and its checkpoints are :mod:`.rec_alloc`.

On a kept graph whose layers are coded (:mod:`.template`), passes 1-4 take equal layers' results from
the first (:mod:`.sched_layers`) and the allocator's walk jumps whole periods of equal layers, writing
what it records of them from the period before (:mod:`.rec_jumps`); a checkpoint's live tensors so
written, and every checkpoint's maxima to come, are made when a replay first asks for them."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from offload_planner.core.compute.allocator import GraphAllocator, layer_suffix
from offload_planner.core.compute.bound import any_placement_bound, copy_sizes, graph_bound, located_copies
from offload_planner.core.compute.ggml import (
    CACHE_PREFIXES,
    CPU,
    INPUT,
    VIEW_OPS,
    Graph,
    T,
    nbytes,
    view_tensor,
)
from offload_planner.core.compute.graph import Builder, Shape
from offload_planner.core.compute.periods import find_periods
from offload_planner.core.compute.rec_alloc import RecAlloc, Refuse, Rest, Walker
from offload_planner.core.compute.reserve import Reserve
from offload_planner.core.compute.sched_layers import LayerRefs, LayerScheduler
from offload_planner.core.compute.scheduler import Backend, Scheduler, Split
from offload_planner.core.item_changes import kept_copy
from offload_planner.core.placement import Placed

_CK_STRIDE = 8
#: a replay's tail stops at every this many checkpoints (and at the layer starts), where it compares
#: its state with the reference's and may keep it for later tails (``Reference.tail_memo``)
TAIL_STRIDE = 4


# --- the reference run ---------------------------------------------------------------------------------


#: `` (layer N)`` and N of a node name with a layer suffix (None: without), by name: the references of a
#: graph, and of the graphs copied from it, name their nodes alike
_NAME_TAGS: dict[str, tuple[str, int] | None] = {}
_UNSEEN = ("", -1)


def _name_tag(name: str) -> tuple[str, int] | None:
    """``layer_suffix``'s tag and layer of ``name``, remembered (a few graphs' names at most)."""
    il = layer_suffix(name)
    tk = None if il is None else (f" (layer {il})", int(il))
    if len(_NAME_TAGS) > 200_000:
        _NAME_TAGS.clear()
    _NAME_TAGS[name] = tk
    return tk


class LastOn:
    """(tensor, backend) -> the last real (non-view) node on that backend reading the tensor, as
    ``dict.get`` (a replay asks for a few): from the tensor's consumers and the nodes' backends."""

    def __init__(self, consumers: dict[T, list[int]], real_bids: list[int | None]) -> None:
        """``real_bids``: per node its backend, None for a view."""
        self.consumers, self.real_bids = consumers, real_bids
        self.memo: dict[tuple[T, int], int] = {}

    def get(self, key: tuple[T, int], default: int) -> int:
        got = self.memo.get(key)
        if got is None:
            t, b = key
            bids = self.real_bids
            got = self.memo[key] = next((i for i in reversed(self.consumers.get(t, ())) if bids[i] == b), -1)
        return default if got == -1 else got


class Reference:
    """One recorded full run of one reserve graph."""

    def __init__(self, sh: Shape, arch_fn: Callable[[Builder], None], backends: list[Backend],
                 op_offload: bool, weights: Callable[[str], T | None], layer_dev: Callable[[int], str],
                 kv_dev: Callable[[int], str], items: Sequence[Placed], unit_devices: list[str],
                 keep_forced: bool = True, graph: Graph | None = None, walker: Walker | None = None,
                 layers: LayerRefs | None = None) -> None:
        """``graph``: the graph already built for these devices (:mod:`.template`; this takes it over);
        ``walker``: makes the recording walk (:mod:`.rec_jumps`: one that jumps periods of equal layers),
        a plain one without; ``layers``: the graph's layers (:mod:`.sched_layers`: the scheduler's passes
        1-4 take equal layers' results from the first)."""
        self.sh, self.backends, self.op_offload = sh, backends, op_offload
        self.walker, self.layers = walker, layers
        self.unit_devices = list(unit_devices)
        self.items = kept_copy(items)  # kept alive: later placements are compared with them by identity
        if graph is None:
            b = Builder(sh, weights, layer_dev, kv_dev)
            arch_fn(b)
            graph = b.g
        g = self.g = graph
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
            elif t.dev is not None and t.name.startswith(CACHE_PREFIXES):
                self.dev_of.append((t, 1, int(t.name[9:])))
            elif t.dev is not None:
                raise Refuse(f"unknown device-carrying tensor {t.name}")
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
                    raise Refuse("weight without a placement item")
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
                    raise Refuse("forced device")
                self.forced.append((n, il))
            elif dev != CPU:
                raise Refuse("forced device")

    def _passes_1_4(self, g: Graph, forced: dict[int, str]) -> None:
        """Scheduler passes 1-4, keeping pass 1's assignments; refused where pass 3 assigns or pass 4
        does more than give views their source's backend."""
        nodes, layers = g.nodes, self.layers
        p2 = self._passes_1_2(g, forced) if layers is None else self._layer_passes_1_2(g, forced, layers)
        self.gidx = {n: i for i, n in enumerate(nodes)}
        self.orig_src = [tuple(n.src) for n in nodes]
        if layers is None:
            self.sched.pass4(nodes)
        else:
            LayerScheduler(self.backends, 1, self.op_offload, layers).pass4_layers(nodes)
        if any(t.bid != nodes[i].bid for t, i in self.free_leafs):
            raise Refuse("free leaf")
        for i, n in enumerate(nodes):
            if n.op in VIEW_OPS:
                assert n.view_src is not None
                want = self.p1[i] if self.p1[i] != -1 else n.view_src.bid
            else:
                want = p2[i]
            if n.bid != want:
                raise Refuse("pass 4 assigns")

    def _passes_1_2(self, g: Graph, forced: dict[int, str]) -> list[int]:
        """Passes 1-3 (``self.p1``: pass 1's backends of the nodes); the nodes' backends after pass 2,
        which are theirs (refused where pass 3 assigns one)."""
        nodes, leafs, sched, ids = g.nodes, g.leafs, self.sched, self.ids
        for t in leafs + nodes:
            t.bid = ids[forced[id(t)]] if id(t) in forced else -1
        for t in leafs + nodes:
            if t.bid == -1:
                t.bid = sched.backend_of(t)
        self.p1 = [n.bid for n in nodes]
        self._free_leafs(g)
        sched.expand(nodes)
        p2 = [n.bid for n in nodes]
        sched.pass3(nodes)
        if [n.bid for n in nodes] != p2:
            raise Refuse("pass 3 assigns")
        return p2

    def _free_leafs(self, g: Graph) -> None:
        """The leafs pass 1 leaves without a backend (refused unless each is a tensor the graph allocator
        owns, read by one real node: DSA's zeros, :mod:`.dsa`): pass 4 gives each its reader's backend,
        which a replay follows (``free_leafs``: (leaf, its reader's node index))."""
        self.free_leafs: list[tuple[T, int]] = []
        unassigned = [t for t in g.leafs if t.bid == -1]
        if not unassigned:
            return
        index = {id(t): k for k, t in enumerate(unassigned)}
        readers: list[list[int]] = [[] for _ in unassigned]
        for i, n in enumerate(g.nodes):
            for src in n.src:
                k = None if src is None else index.get(id(src))
                if k is not None:
                    readers[k].append(i)
        for t, rd in zip(unassigned, readers, strict=True):
            if t.flags & INPUT or t.weights or t.dev is not None or t.view_src is not None or len(rd) != 1 \
                    or g.nodes[rd[0]].op in VIEW_OPS:
                raise Refuse("unassigned leaf")
            self.free_leafs.append((t, rd[0]))

    def _layer_passes_1_2(self, g: Graph, forced: dict[int, str], layers: LayerRefs) -> list[int]:
        """:meth:`_passes_1_2` a layer at a time (:mod:`.sched_layers`: equal layers' results taken from
        the first)."""
        p1, p2, unassigned = LayerScheduler(self.backends, 1, self.op_offload, layers).passes_1_2(g, forced)
        self.p1 = p1
        self._free_leafs(g)
        if unassigned:  # pass 3 gives every real node pass 2 left unassigned a backend
            raise Refuse("pass 3 assigns")
        for n, b in zip(g.nodes, p2, strict=True):
            n.bid = b
        return p2

    def _uses_in_graph(self, nodes: list[T]) -> None:
        """Real nodes, consumers and views of every tensor in the graph's node order."""
        self.real = [i for i, n in enumerate(nodes) if n.op not in VIEW_OPS]
        self.ridx = {gi: r for r, gi in enumerate(self.real)}
        consumers: dict[T, list[int]] = {}
        views: dict[T, list[int]] = {}
        for i, (n, srcs) in enumerate(zip(nodes, self.orig_src, strict=True)):
            for s in srcs:
                if s is not None:
                    if (c := consumers.get(s)) is None:
                        consumers[s] = [i]
                    else:
                        c.append(i)
            if (vs := n.view_src) is not None:
                if (v := views.get(vs)) is None:
                    views[vs] = [i]
                else:
                    v.append(i)
        # (tensor, backend) -> the last node on that backend reading it: where a copy of it there
        # can still be made or used (pass 5 copies sources for the real nodes' backends)
        real_bids = [None if n.op in VIEW_OPS else n.bid for n in nodes]
        self.consumers, self.views, self.last_on = consumers, views, LastOn(consumers, real_bids)

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
            width = sp.i_end - sp.i_start
            self.sp.update(zip(range(sp.i_start, sp.i_end), range(pos, pos + width), strict=True))
            pos += width
        assert pos == len(sched.nodes)
        self.sched_nodes, self.sched_ids = sched.nodes, sched.node_ids
        uses: dict[T, list[int]] = {}
        first: dict[T, int] = {t: -1 for t in sched.leafs}
        # `` (layer N)`` of the nodes named for a layer (what the allocator's peak labels say)
        layer_tags: dict[T, str] = {}
        view_nodes: dict[T, list[T]] = {}
        starts: list[int] = []  # periods.layer_starts of the sched nodes
        last = -1
        set_first, name_tag = first.setdefault, _NAME_TAGS.get
        for p, n in enumerate(self.sched_nodes):  # one pass, each map filled in node order
            set_first(n, p)
            for s in n.src:
                if s is not None:
                    if (u := uses.get(s)) is None:
                        uses[s] = [p]
                    else:
                        u.append(p)
                    set_first(s, p)
            if (tk := name_tag(n.name, _UNSEEN)) is _UNSEEN:
                tk = _name_tag(n.name)
            if tk is not None:
                layer_tags[n] = tk[0]
                if tk[1] > last:
                    last = tk[1]
                    starts.append(p)
            if n.view_src is not None and n.op != "NONE":
                if (v := view_nodes.get(n.view_src)) is None:
                    view_nodes[n.view_src] = [n]
                else:
                    v.append(n)
        self.uses, self.first, self.layer_tags, self.view_nodes = uses, first, layer_tags, view_nodes
        self.layer_starts = starts

    def _record_allocator(self) -> None:
        """The allocator run with checkpoints and events, each checkpoint's maximum of the rest, the
        copies and the reserve."""
        sched, backends = self.sched, self.backends
        galloc = (RecAlloc(backends) if self.walker is None
                  else self.walker(backends, self.g.nodes, self.splits, self.layer_tags))
        # checkpoints at every split start, layer start and every _CK_STRIDE positions: a replay starts
        # at the last one before its first difference and stops at the first one where the state is the
        # same again (a tail may jump whole periods of layers from a layer start: see .periods)
        starts = self.layer_starts
        self.ckpos = sorted(set(self.ss) | set(starts) | set(range(0, len(self.sched_nodes), _CK_STRIDE)))
        self.sizes, self.cks = galloc.run_rec(self.sched_nodes, self.sched_ids, sched.leafs, sched.leaf_ids,
                                              set(self.ckpos))
        self.peaks = list(galloc.peaks)
        self.tail, self.tail_pos = galloc.tail, galloc.tail_pos
        galloc.allocs.clear()
        galloc.recs.clear()  # they point back at it: a cycle, left to the cycle collector otherwise
        self.periods = find_periods(starts, self.tail, self.tail_pos, galloc.jumped)
        # where a replay's tail stops: positions and their checkpoints' indices
        at_start = set(starts)
        stops = [(p, c) for c, p in enumerate(self.ckpos) if c % TAIL_STRIDE == 0 or p in at_start]
        self.tail_stops = [p for p, _ in stops]
        self.tail_stop_ck = [c for _, c in stops]
        # states replays' tails passed (see replay_alloc._tail): the maximum from there on and its label
        self.tail_memo: dict[tuple[object, ...], tuple[int, str]] = {}
        self.size_cache: dict[tuple[T, int], int] = {}
        self.sizer = GraphAllocator(backends)  # (only its ``size``: it is never walked)
        self.aligns = [b.alignment for b in backends]
        # split-input copies and their dependency nodes that replays made and the reference has not:
        # made once and kept with the reference (a move and the next meet the same ones), sizes cached
        self.extra_copies: dict[tuple[T, int], T] = {}
        self.extra_deps: dict[T, T] = {}
        self._kept: set[T] = set()
        # per (node index, backend): the aligned sizes of the node and its sources that the graph
        # allocator owns, each once (``_Replay.early_bound``)
        self.node_bound: dict[tuple[int, int], int] = {}
        self.walk_facts: dict[T, tuple[str, tuple[T, ...], bool, tuple[T, ...]]] = {}  # replay_alloc
        # the same for a node with other sources than here (copies pass 5 made in a replay), by both
        self.walk_facts_new: dict[tuple[T | None, ...], tuple[str, tuple[T, ...], bool, tuple[T, ...]]] = {}
        rest = Rest(galloc.events)
        for p, ck in self.cks.items():
            ck.rest = (rest, p)
        self.copies = [0] * len(backends)
        self.wcopies = [0] * len(backends)
        for sp in self.splits:
            for inp in sp.inputs:
                self.copies[sp.backend] += nbytes(inp)
                if inp.weights:
                    self.wcopies[sp.backend] += nbytes(inp)
        self.reserve = Reserve(self.sh.n_tokens, self.sizes, self.peaks, self.copies, self.wcopies,
                               len(self.g.nodes), len(self.splits))
        self._split_sums: list[tuple[list[int], list[int]]] | None = None
        self.input_bytes: dict[T, int] = {}  # ``nbytes`` of split inputs a replay's splits copy
        self._bound: list[int] | None = None
        self._any_bound: list[int] | None = None
        self._located: dict[bool, list[int]] = {}

    def copies_before(self, k: int) -> tuple[list[int], list[int]]:
        """Per backend, the bytes the splits before split ``k`` copy (all, and weights only): prefix
        sums made when a replay first asks (a replay takes the reference's splits it re-splits off)."""
        if self._split_sums is None:
            n = len(self.backends)
            c, w = [0] * n, [0] * n
            sums = [(list(c), list(w))]
            for sp in self.splits:
                for inp in sp.inputs:
                    c[sp.backend] += nbytes(inp)
                    if inp.weights:
                        w[sp.backend] += nbytes(inp)
                sums.append((list(c), list(w)))
            self._split_sums = sums
        return self._split_sums[k]

    def size(self, t: T, b: int) -> int:
        """``GraphAllocator.size``, cached for the reference's tensors and the copies kept with it."""
        k = (t, b)
        v = self.size_cache.get(k)
        if v is None:
            v = self.sizer.size(t, b)
            if t in self.first or t in self._kept:
                self.size_cache[k] = v
        return v

    def copy(self, s: T, b: int) -> T:
        """The split-input copy of ``s`` on backend ``b``: the reference's, or one kept for replays."""
        key = (s, b)
        cp = self.copy_of.get(key) or self.extra_copies.get(key)
        if cp is None:
            cp = self.extra_copies[key] = self.sched.input_copy(s, 0)
            self._kept.add(cp)
        return cp

    def dep(self, inp: T) -> T:
        """A split input's dependency node (``build_copy``'s ``view_tensor(inp, "NONE", inp)``), kept."""
        d = self.extra_deps.get(inp)
        if d is None:
            d = self.extra_deps[inp] = view_tensor(inp, "NONE", inp)
        return d

    def alloc_bound(self) -> list[int]:
        """Per backend, a bound of what the allocator reaches on this graph (:mod:`.bound`)."""
        if self._bound is None:
            self._bound = graph_bound(GraphAllocator(self.backends), self.sched_nodes, self.sched_ids,
                                      self.sched.leafs)
        return self._bound

    def below_any_placement(self, below: list[int]) -> bool:
        """This graph's reserve is at most ``below`` on every backend under any placement that builds
        the graph (:func:`.bound.any_placement_bound` plus :func:`.bound.located_copies`): a caller that
        keeps the larger of two reserves may leave this one out before looking at what a move
        changes.  The copies of KV views come first, then of weights, then the rest (a pass over the
        whole graph): a big model's KV views alone are above any prompt reserve, so the rest is never
        made for it (a first look costs it about a replay)."""
        for part in (self._located_bound(True), self._located_bound(False)):
            if any(x > y for x, y in zip(part, below, strict=True)):
                return False
        return all(x <= y for x, y in zip(self.any_bound(), below, strict=True))

    def any_bound(self) -> list[int]:
        """Per backend, the bound of :meth:`below_any_placement`."""
        if self._any_bound is None:
            rest = any_placement_bound(self.sizer, self.g.nodes, self.orig_src, self.sched.leafs)
            self._any_bound = [x + y for x, y in zip(self._located_bound(False), rest, strict=True)]
        return self._any_bound

    def _located_bound(self, kv_only: bool) -> list[int]:
        """Per backend, the copies of KV views (``kv_only``) or of all tensors in a buffer (weights and
        KV views) that pass 5 may make under some placement."""
        got = self._located.get(kv_only)
        if got is None:
            nodes, out = self.g.nodes, []
            for t, kind, _ in self.dev_of:
                if kind == 1 or not kv_only:
                    out.append(t)
                    out += (nodes[i] for i in self.views.get(t, ()))
            readers = [(s, self.consumers.get(s, [])) for s in out]
            copied = located_copies(nodes, readers, self._pinned_by)
            got = self._located[kv_only] = copy_sizes(self.sizer, copied)
        return got

    def _pinned_by(self, i: int) -> T | None:
        """Node ``i``'s first weight source where pass 1 gives the node that weight's backend whatever
        the placement (``Scheduler.backend_of``: not forced, in no buffer, no input, no op that pass 1
        leaves open, no op offload), else None."""
        n = self.g.nodes[i]
        if n in self.forced_dev or n.location is not None or n.flags & INPUT:
            return None
        if n.op in ("ROPE", "FLASH_ATTN_EXT"):
            return None
        first = next((s for s in self.orig_src[i] if s is not None and s.weights), None)
        if first is None or (self.op_offload and any(b.offloads(n) for b in self.backends)):
            return None
        return first

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


