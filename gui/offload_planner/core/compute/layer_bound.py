"""A bound of the one-token reserve under any move of one layer's tensors, kept per reference.

The replay leaves the one-token reserve out where :meth:`.replay._Replay.early_bound` (the reference's
allocator bound, plus each affected node and its sources on the node's new backend, plus the copies
pass 5 may make for them) is at most the prompt reserve on every backend; that needs passes 1-4 on
the one-token graph first (about a tenth of a dense layer's move).  A move of tensors of one layer
``L`` alone (its weights, KV caches, rope factors; its forced norms) affects only nodes of a set
known from the reference: the consumers of those tensors and of their views, and the real nodes of
pass 2's window between the nearest nodes that pass 1 assigns as in the reference around them (pass 1
changes only the consumers), with their views and those views' and nodes' consumers.  Each of them
lands on some backend: counting every one on every backend, with a copy of each of their sources on
every backend, bounds ``early_bound`` for any such move whatever its devices.  Kept with the reference
per layer (made at the first move of the layer that asks, once: about 0.3 ms a layer on Llama-3.2-3B,
1 ms on Qwen3-235B), it decides such a move with a few look-ups.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from offload_planner.core.compute.bound import copy_sizes, owned
from offload_planner.core.compute.ggml import VIEW_OPS, T
from offload_planner.core.compute.recording import Reference


@dataclass
class LayerBounds:
    layer_of: dict[T, int]  # device-carrying tensor -> its layer (weights "blk.L.", KV caches, rope factors)
    forced_layer: dict[T, int]  # forced norm -> its layer
    tensors: dict[int, list[T]]  # layer -> its device-carrying tensors
    norms: dict[int, list[T]]  # layer -> its forced norms
    # layer -> per backend, what any move of its tensors alone may add (made at the layer's first move)
    extra: dict[int, list[int]] = field(default_factory=dict)
    # each node's part and each source's copy sizes (the layers' windows share nodes)
    parts: dict[int, tuple[list[int], list[T]]] = field(default_factory=dict)
    copies: dict[T, list[int]] = field(default_factory=dict)

    def of(self, ref: Reference, il: int) -> list[int] | None:
        """Layer ``il``'s bound (None for no layer)."""
        got = self.extra.get(il)
        if got is None and il in self.tensors:
            got = _extra(ref, self.tensors[il], self.norms.get(il, []), self.parts, self.copies)
            self.extra[il] = got
        return got


def below_for_layer_move(ref: Reference, dev: dict[T, str], forced: dict[T, str], below: list[int]) -> bool:
    """The one-token reserve of ``ref``'s graph with ``dev``'s and ``forced``'s changes, all of one layer,
    is at most ``below`` on every backend (False where the changes are of more than one layer, or of a
    tensor of none, or the bound is above ``below`` somewhere)."""
    lb = _bounds(ref)
    layers = {lb.layer_of.get(t, -1) for t in dev} | {lb.forced_layer.get(n, -1) for n in forced}
    if len(layers) != 1:
        return False
    extra = lb.of(ref, layers.pop())
    if extra is None:
        return False
    return all(r + x <= y for r, x, y in zip(ref.alloc_bound(), extra, below, strict=True))


def _bounds(ref: Reference) -> LayerBounds:
    got: LayerBounds | None = getattr(ref, "_layer_bounds", None)
    if got is None:
        got = _make(ref)
        ref._layer_bounds = got  # type: ignore[attr-defined]
    return got


def _layer_of_weight(name: str) -> int:
    if not name.startswith("blk."):
        return -1
    head = name[4:].split(".", 1)[0]
    return int(head) if head.isdigit() else -1


def _make(ref: Reference) -> LayerBounds:
    layer_of: dict[T, int] = {}
    for t, _, key in ref.dev_of:  # (weights by name, the rest by their layer)
        il = _layer_of_weight(key) if isinstance(key, str) else key if isinstance(key, int) else -1
        if il >= 0:
            layer_of[t] = il
    forced_layer = {n: il for n, il in ref.forced if il >= 0}
    tensors: dict[int, list[T]] = {}
    for t, il in layer_of.items():
        tensors.setdefault(il, []).append(t)
    norms: dict[int, list[T]] = {}
    for n, il in forced_layer.items():
        norms.setdefault(il, []).append(n)
    return LayerBounds(layer_of, forced_layer, tensors, norms)


def _affected(ref: Reference, tensors: list[T], norms: list[T]) -> set[int]:
    """A superset of ``_Replay.affected`` for any move of ``tensors`` (and ``norms``' forced devices)."""
    nodes, consumers, views, gidx = ref.g.nodes, ref.consumers, ref.views, ref.gidx
    touched: set[int] = {gidx[n] for n in norms}
    for t in tensors:
        touched.update(consumers.get(t, ()))
        touched.update(views.get(t, ()))
    win: list[int] = []
    real_touched = sorted(ref.ridx[gi] for gi in touched if gi in ref.ridx)
    if real_touched:  # (``_Replay._expand``'s window, from the first and last node pass 1 may change)
        real, p1 = ref.real, ref.p1
        a, z = real_touched[0] - 1, real_touched[-1] + 1
        while a >= 0 and p1[real[a]] == -1:
            a -= 1
        while z < len(real) and p1[real[z]] == -1:
            z += 1
        a, z = max(a, 0), min(z, len(real) - 1)
        win = [real[r] for r in range(a, z + 1)]
    changed: list[T] = [nodes[gi] for gi in win] + tensors  # what may take another backend
    vnodes = {gi for gi in touched if nodes[gi].op in VIEW_OPS}
    for t in changed:
        vnodes.update(gi for gi in views.get(t, ()) if nodes[gi].op in VIEW_OPS)
    out = set(win) | vnodes | touched
    for t in changed + [nodes[gi] for gi in vnodes]:
        out.update(consumers.get(t, ()))
    for t in tensors:
        for gi in views.get(t, ()):
            out.update(consumers.get(nodes[gi], ()))
    return out


def _extra(ref: Reference, tensors: list[T], norms: list[T], parts: dict[int, tuple[list[int], list[T]]],
           copies: dict[T, list[int]]) -> list[int]:
    """Per backend: every possibly affected node with its allocated sources there, and a copy there of
    every source of the real ones (``_Replay.early_bound`` counts each node on one backend, and the
    copies pass 5 may make of their sources).  ``parts`` and ``copies``: each node's part and each
    source's copy sizes, kept over the layers (their windows share nodes)."""
    out = [0] * len(ref.aligns)
    sources: dict[T, None] = {}
    for gi in _affected(ref, tensors, norms):
        got = parts.get(gi)
        if got is None:
            got = parts[gi] = _part(ref, gi)
        for b, x in enumerate(got[0]):
            out[b] += x
        sources.update(dict.fromkeys(got[1]))
    for s in sources:
        cs = copies.get(s)
        if cs is None:
            cs = copies[s] = copy_sizes(ref.sizer, {s: None})
        for b, x in enumerate(cs):
            out[b] += x
    return out


def _part(ref: Reference, gi: int) -> tuple[list[int], list[T]]:
    """Node ``gi`` with its allocated sources per backend (``_Replay._node_bound``, kept with the
    reference as it keeps it), and the sources pass 5 may copy for it (none for a view)."""
    per = ref.node_bound
    sizes = []
    for b, a in enumerate(ref.aligns):
        v = per.get((gi, b))
        if v is None:
            ts = {t for t in (ref.g.nodes[gi], *ref.orig_src[gi]) if t is not None and owned(t)}
            v = per[(gi, b)] = sum(-(-ref.size(t, b) // a) * a for t in ts)
        sizes.append(v)
    return sizes, (_copied(ref, gi) if ref.cur_before[gi] != -2 else [])


def _copied(ref: Reference, gi: int) -> list[T]:
    """The sources of real node ``gi`` that pass 5 may copy under some placement: not the weight pass 1
    puts the node with whatever its device (``Reference._pinned_by``), nor, for a node in a buffer (a
    write into a KV cache: pass 1 puts it with its buffer), a view of that buffer."""
    n = ref.g.nodes[gi]
    pinned = ref._pinned_by(gi)
    base = n.view_src if n.view_src is not None else n
    in_buffer = n.location is not None
    return [s for s in ref.orig_src[gi] if s is not None and s is not pinned
            and not (in_buffer and (s.view_src if s.view_src is not None else s) is base)]
