"""A built reserve graph kept for the next simulation of the same graph on other devices.

Building a DeepSeek-V3 reserve graph (~5,600 nodes, ~7,500 tensors) is about a third of a from-scratch
reserve, and the graph does not depend on the placement: only the devices of the weights, KV caches
and per-layer ``rope_freqs``, and the backends forced onto the layers' norms, do (the same tensors
:class:`.recording.Reference` tracks).  A caller that simulates many placements of one graph (the
``--fit`` search: ~25 dry runs, about a third of them far from any recorded reference) keeps the
graph here and gets it back with those devices set and everything the scheduler and the allocator
change (sources rewired to split-input copies, flags of pipeline-parallel inputs, backend ids, counts,
allocations) restored to what the builder left.

Only the incremental path uses it (its callers simulate one at a time: ``SIMULATION_LOCK``).  A graph
recorded as a reference is handed over (``own``): the reference keeps its state in the tensors.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from offload_planner.core.compute.ggml import CACHE_PREFIXES, CPU, Graph, T
from offload_planner.core.compute.graph import Builder, Shape, WeightWhere
from offload_planner.core.compute.jumps import LayerCodes, cached_codes, has_codes
from offload_planner.core.compute.stats import stats


class Unsupported(Exception):
    """A graph with a device-carrying tensor or forced node this module does not know how to re-place."""


class GraphTemplate:
    """One built graph and what re-placing it needs."""

    def __init__(self, sh: Shape, arch_fn: Callable[[Builder], None], weights: Callable[[str], T | None],
                 layer_dev: Callable[[int], str], kv_dev: Callable[[int], str]) -> None:
        b = Builder(sh, weights, layer_dev, kv_dev)
        arch_fn(b)
        g = self.g = b.g
        self.key: tuple[object, ...] = ()  # set by placed_graph: the codes of its layers are kept by it
        self.index: dict[int, int] = {}
        self.reused = False  # walked again (re-placed) since it was built: its layers are worth coding
        self.src = [tuple(n.src) for n in g.nodes]
        self.flags = [t.flags for t in g.leafs] + [n.flags for n in g.nodes]
        self.weights: list[T] = []  # by their name in the weight table
        self.kv: list[tuple[T, int]] = []  # caches by layer (kv_dev)
        self.per_layer: list[tuple[T, int]] = []  # rope factors by layer (layer_dev)
        for t in g.leafs:
            if t.weights and t.name.startswith("rope_freqs-"):
                self.per_layer.append((t, int(t.name.rsplit("-", 1)[1])))
            elif t.weights:
                self.weights.append(t)
            elif t.dev is not None and t.name.startswith(CACHE_PREFIXES):
                self.kv.append((t, int(t.name[9:])))
            elif t.dev is not None:
                raise Unsupported(f"device-carrying tensor {t.name}")
        by_id = {id(n): n for n in g.nodes}
        # norms forced onto their layer's device (built with ``full_offload``, so all of them: a
        # placement's shape decides which apply), -1: forced onto the CPU
        self.forced: list[tuple[T, int]] = []
        for i, dev in g.forced.items():
            n = by_id.get(i)
            if n is None:
                raise Unsupported("forced leaf")
            kind, _, il = n.name.rpartition("-")
            if kind in ("norm", "l_last"):
                self.forced.append((n, int(il)))
            elif dev == CPU:
                self.forced.append((n, -1))
            else:
                raise Unsupported(f"forced node {n.name}")

    def placed(self, sh: Shape, where: WeightWhere, layer_dev: Callable[[int], str],
               kv_dev: Callable[[int], str]) -> Graph:
        """The graph as the builder leaves it for this shape (which may differ from the template's in
        ``full_offload`` only) and these devices."""
        self.reused = True
        g = self.g
        for n, src in zip(g.nodes, self.src, strict=True):
            n.src = list(src)
        for t, f in zip(g.leafs + g.nodes, self.flags, strict=True):
            t.flags = f
            t.bid, t.alloc, t.n_children, t.n_views = -1, None, 0, 0
        for t in self.weights:
            t.dev = where[t.name][2]
        for t, il in self.kv:
            t.dev = kv_dev(il)
        for t, il in self.per_layer:
            t.dev = layer_dev(il)
        return self._force(sh, layer_dev)

    def _force(self, sh: Shape, layer_dev: Callable[[int], str]) -> Graph:
        g = self.g
        norms = sh.n_tokens < 32 or sh.full_offload  # as Builder.cb forces them
        g.forced = {id(n): (layer_dev(il) if il >= 0 else CPU) for n, il in self.forced if il < 0 or norms}
        return g

    def codes(self) -> tuple[LayerCodes, dict[int, int]] | None:
        """The graph's layers as the builder left them (:mod:`.jumps`, kept for its topology) and the
        position of each node by id; None for the first walk of a topology (coding its layers costs
        more than the jumps save in one walk: a command that simulates once) unless
        :func:`coding_first_walks` says more walks follow."""
        g = self.g
        if not self.reused and not _code_first_walks and not has_codes(self.key):
            return None
        if not self.index:
            self.index = {id(n): u for u, n in enumerate(g.nodes)}
        return cached_codes(self.key, g.nodes, self.src, self.flags[len(g.leafs):], g.leafs), self.index

    def copy(self) -> GraphTemplate:
        """Another template of the same graph, as the builder left it: made from this one's tensors
        (their shapes, ops, names and view sources stay what the builder gave them while a recorded
        reference owns them) with its sources and flags, in about half the time of a build."""
        g = self.g
        m: dict[int, T] = {}
        n_leafs = len(g.leafs)
        leafs = [_copied(t, t.src, f, m) for t, f in zip(g.leafs, self.flags[:n_leafs], strict=True)]
        nodes = [_copied(t, src, f, m)
                 for t, src, f in zip(g.nodes, self.src, self.flags[n_leafs:], strict=True)]
        new = GraphTemplate.__new__(GraphTemplate)
        new.g = Graph(nodes, leafs)
        new.src = [tuple(n.src) for n in nodes]
        new.flags = self.flags
        new.weights = [m[id(t)] for t in self.weights]
        new.kv = [(m[id(t)], il) for t, il in self.kv]
        new.per_layer = [(m[id(t)], il) for t, il in self.per_layer]
        new.forced = [(m[id(n)], il) for n, il in self.forced]
        new.key, new.index, new.reused = self.key, {}, self.reused
        return new

    def built(self, sh: Shape, layer_dev: Callable[[int], str]) -> Graph:
        """The graph just built, for ``sh``: only the forced norms to set (its tensors are as the
        builder left them, on these devices: :meth:`placed` would change nothing else)."""
        return self._force(sh, layer_dev)


def _copied(t: T, src: Sequence[T | None], flags: int, m: dict[int, T]) -> T:
    """A tensor as the builder left ``t`` (sources ``src``, flags ``flags``), its sources and view
    source the copies in ``m`` (shapes shared: nothing changes them after the build)."""
    c = T.__new__(T)
    c.type, c.ne, c.nb, c.op, c.name = t.type, t.ne, t.nb, t.op, t.name
    c.src = [None if s is None else m[id(s)] for s in src]
    vs = t.view_src
    c.view_src = None if vs is None else m[id(vs)]
    c.view_offs, c.flags, c.dev, c.weights = t.view_offs, flags, t.dev, t.weights
    c.bid, c.alloc, c.n_children, c.n_views = -1, None, 0, 0
    m[id(t)] = c
    return c


#: see :func:`coding_first_walks`
_code_first_walks = False


@contextmanager
def coding_first_walks() -> Iterator[None]:
    """A graph's first walk codes its layers (:meth:`GraphTemplate.codes`) for the simulations inside: a
    caller that knows it will walk the graph again (the --fit search's ~25 dry runs) has the first one
    take equal layers from each other too."""
    global _code_first_walks
    was = _code_first_walks
    _code_first_walks = True
    try:
        yield
    finally:
        _code_first_walks = was


#: templates by (model, graph builder, shape with ``full_offload``, loaded weights); a few kept
_TEMPLATES: OrderedDict[tuple[object, ...], GraphTemplate] = OrderedDict()
_SIZE = 4
#: templates handed to a recorded reference, by the same key: the next kept graph of the topology is
#: copied from one (the --fit search's dry run far from the reference just recorded)
_HANDED: OrderedDict[tuple[object, ...], GraphTemplate] = OrderedDict()


def placed_graph(key: tuple[object, ...], sh: Shape, arch_fn: Callable[[Builder], None], where: WeightWhere,
                 weights: Callable[[], Callable[[str], T | None]], layer_dev: Callable[[int], str],
                 kv_dev: Callable[[int], str], *, own: bool = False) -> Graph:
    """The graph of shape ``sh`` (``key``: the model and builder) placed on these devices: the kept
    one re-placed, else built and kept.  The graph is the same whether every layer is offloaded or
    not (only the norms forced onto the layers' devices differ), so one is kept for both.  ``own``:
    the caller keeps the graph's tensors (a recorded reference does): the kept one is handed over,
    or a new one built."""
    full_sh = replace(sh, full_offload=True)
    full = (*key, full_sh, frozenset(where))
    tpl = _TEMPLATES.pop(full, None) if own else _TEMPLATES.get(full)
    if tpl is not None:
        stats["graph_reuses"] += 1
        if own:
            _keep(_HANDED, full, tpl, 2)
        else:
            _TEMPLATES.move_to_end(full)
        return tpl.placed(sh, where, layer_dev, kv_dev)
    handed = None if own else _HANDED.pop(full, None)
    if handed is not None:
        stats["graph_copies"] += 1
        tpl = handed.copy()
        _keep(_TEMPLATES, full, tpl, _SIZE)
        return tpl.placed(sh, where, layer_dev, kv_dev)
    if not own:
        try:
            tpl = GraphTemplate(full_sh, arch_fn, weights(), layer_dev, kv_dev)
        except Unsupported:
            tpl = None
    if tpl is None:
        b = Builder(sh, weights(), layer_dev, kv_dev)
        arch_fn(b)
        return b.g
    tpl.key = full
    _keep(_TEMPLATES, full, tpl, _SIZE)
    return tpl.built(sh, layer_dev)


def _keep(kept: OrderedDict[tuple[object, ...], GraphTemplate], key: tuple[object, ...], tpl: GraphTemplate,
          size: int) -> None:
    kept[key] = tpl
    kept.move_to_end(key)
    if len(kept) > size:
        kept.popitem(last=False)


def kept_codes(g: Graph) -> tuple[LayerCodes, dict[int, int]] | None:
    """The layer codes and node positions of a kept graph (None: a graph built for one simulation, or
    a recorded one)."""
    for tpl in _TEMPLATES.values():
        if tpl.g is g:
            return tpl.codes()
    return None


def handed_codes(g: Graph) -> tuple[LayerCodes, dict[int, int]] | None:
    """The layer codes and node positions of a graph handed to a recorded reference (``own``), as
    :func:`kept_codes` (None: a graph built for it)."""
    for tpl in _HANDED.values():
        if tpl.g is g:
            return tpl.codes()
    return None
