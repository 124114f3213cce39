"""Layers in blocks over the GPUs, each layer's routed experts on its own GPU or on the CPU: the
fastest plan's layer split (llama.cpp's ``-ts``, which its ``--fit`` chooses too), chosen with the
experts.

With the command's split (by free memory) every GPU holds about as many layers as the others, more
than its memory leaves room for with their experts, so the experts the fill moves land on another
GPU than their layer (two graph splits a token each, as on the CPU) and fewer layers are whole.  Here
each GPU takes a block of layers in llama.cpp's order (a layer costs its GPU what follows it there:
its weights but the free routed experts, and its KV cache; a whole layer its experts too) and, in
its block, makes whole the layers its budget allows beyond their base, those that save the most per
byte first (:class:`_Blocks`: every layer left on the CPU costs two graph splits a token whatever
its size, so smaller ones save more per byte).  The blocks are chosen by a dynamic programme over
the GPUs and the first layer of each block (:func:`best_layout`), for the shortest token by the
estimate's own figures as a straight line (:class:`Speeds`: the bytes each device reads over its
effective bandwidth, the splits): so a fast card takes more layers than a slow one, a card may be
left empty where that saves a split, and the output layer stays on the last GPU.

Budgets come from the plan with every free routed expert on the CPU: a GPU's capacity minus its
margin minus what the projection puts there that does not follow a layer (the output layer, compute
buffers).  The compute buffers grow once a GPU holds experts, so the search projects the result and
lowers the budget of a GPU over its limit by what it is over (:func:`best_layout` again).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from offload_planner.core.devices import DeviceSet
from offload_planner.core.memory import Projection, alloc_size, kv_buffers, pad
from offload_planner.core.placement import CPU
from offload_planner.core.plan import Plan
from offload_planner.core.roles import Role
from offload_planner.core.speed.efficiency import Efficiencies
from offload_planner.core.speed.hardware import Hardware
from offload_planner.core.speed.rates import _bandwidth
from offload_planner.core.speed.reads import expert_fraction, token_bytes
from offload_planner.core.speed.splits import _split_seconds


@dataclass(frozen=True)
class LayerCost:
    index: int
    base: int  # bytes on its GPU with its free routed experts on the CPU (weights that follow it, KV)
    experts: int  # bytes of its free routed experts on its GPU
    names: tuple[str, ...]  # those experts
    base_tok: int = 0  # bytes a token reads of what follows it (its weights; no KV at depth 0)
    experts_tok: int = 0  # bytes a token reads of its free experts (n_expert_used / n_expert)


@dataclass(frozen=True)
class Layout:
    units: tuple[int, ...]  # units (layers, the output last) per GPU: the -ts
    whole: frozenset[int]  # layers whose free routed experts are on their GPU

    def moves(self, layers: Sequence[LayerCost], gpus: Sequence[str]) -> dict[str, str]:
        """Each whole layer's free experts onto its GPU."""
        out: dict[str, str] = {}
        il0 = 0
        for g, n in zip(gpus, self.units, strict=True):
            for lc in layers[il0:il0 + n]:
                if lc.index in self.whole:
                    out.update(dict.fromkeys(lc.names, g))
            il0 += n
        return out


def may_split(plan: Plan) -> bool:
    """The search may choose the layer split: every unit on a GPU (-ngl all), -sm layer and no -ts of
    the user's (their split is a pin)."""
    po = plan.placement_options
    if po.split_mode != "layer" or any(po.tensor_split) or not plan.devices.gpus:
        return False
    units = plan.base_placement().unit_devices
    return CPU not in units and len(units) == plan.model.summary.n_layer + 1


def layer_costs(plan: Plan, proj: Projection, free: dict[int, list[str]]) -> list[LayerCost]:
    """Per layer (0..n_layer-1, llama.cpp's order) what it puts on its GPU with ``free`` (its routed
    experts the search may move, now on the CPU) there, what those experts would add, and what a
    token reads of both."""
    placement = proj.placement
    model, devices = plan.model, plan.devices
    n = model.summary.n_layer
    frac = expert_fraction(model)
    base, tok = [0] * n, [0] * n
    for p in placement.items:
        il = p.tensor.layer
        if il is None or p.copy or p.device is None or il >= n or p.device != placement.layer_device(il):
            continue
        dev = devices.by_name(p.device)
        if dev is not None and dev.is_gpu:
            base[il] += pad(alloc_size(p.tensor, dev), dev.alignment)
            tok[il] += token_bytes(p, frac) if p.tensor.role is not Role.NEXTN else 0
    for il in range(min(n, model.summary.n_layer_trunk)):
        for b in kv_buffers(model, placement, proj.context, plan.context, devices, cached=range(il, il + 1)):
            if b.device != CPU:
                base[il] += b.bytes
    out = []
    for il in range(n):
        names = tuple(free.get(il, ()))
        dev = devices.by_name(placement.layer_device(il))
        assert dev is not None
        size = sum(pad(alloc_size(model.tensor(x), dev), dev.alignment) for x in names)
        etok = sum(int(model.tensor(x).nbytes * frac) for x in names)
        out.append(LayerCost(il, base[il], size, names, tok[il], etok))
    return out


def speeds(plan: Plan, hw: Hardware, eff: Efficiencies) -> Speeds:
    """The estimate's figures (:mod:`estimate`) the layout weighs: effective bandwidths and splits."""
    gpus = [g.name for g in plan.devices.gpus]
    spb = [1.0 / (_bandwidth(hw[g], eff)[0] * 1e9) for g in gpus]
    detour = [_split_seconds(plan, hw, eff, [(g, CPU), (CPU, g)]) for g in gpus]
    boundary = _split_seconds(plan, hw, eff, [(gpus[0], gpus[-1])]) if len(gpus) > 1 else 0.0
    return Speeds(tuple(spb), 1.0 / (_bandwidth(hw[CPU], eff)[0] * 1e9), tuple(detour), boundary)


def budgets(plan: Plan, proj: Projection, layers: Sequence[LayerCost], devices: DeviceSet,
            margins: dict[str, int]) -> list[int]:
    """Per GPU (llama.cpp's order): capacity minus margin minus what does not follow a layer."""
    placement = proj.placement
    follows = dict.fromkeys((g.name for g in devices.gpus), 0)
    for lc in layers:
        d = placement.layer_device(lc.index)
        if d in follows:
            follows[d] += lc.base
    out = []
    for g in devices.gpus:
        fixed = proj.device(g.name).resident() - follows[g.name]
        out.append((g.capacity or 0) - margins[g.name] - fixed)
    return out


@dataclass(frozen=True)
class Speeds:
    """Seconds a token per byte it reads: per GPU (llama.cpp's order) and on the CPU; seconds of the
    two graph splits a layer's experts on the CPU cost (per GPU), and of a split between two GPUs."""

    gpu: tuple[float, ...]
    cpu: float
    detour: tuple[float, ...]
    boundary: float


def _classes(layers: Sequence[LayerCost]) -> list[tuple[int, int]]:
    """(expert bytes, expert bytes a token reads) of the layers' kinds (layers with free experts)."""
    return sorted({(lc.experts, lc.experts_tok) for lc in layers if lc.experts})


_NEVER = 1 << 62  # the size of a kind no block makes whole (it would not save time there)


class _Blocks:
    """Per layer and GPU the cost of a block of layers on that GPU, worked out once.  Per GPU the
    kinds of layers (by their experts) are ranked by the time a whole one saves there per byte, the
    first first: ``kind_at[g][layer]`` is the layer's rank (-1: no free experts)."""

    def __init__(self, layers: Sequence[LayerCost], room: Sequence[int], sp: Speeds) -> None:
        self.layers, self.room, self.sp = layers, room, sp
        kinds = _classes(layers)
        self.n_kinds = len(kinds)
        kind = {k: i for i, k in enumerate(kinds)}
        kind_of = [kind.get((lc.experts, lc.experts_tok), -1) if lc.experts else -1 for lc in layers]
        self.bases = [lc.base for lc in layers]
        self.kind_at: list[list[int]] = []
        self.sizes: list[list[int]] = []  # per GPU, by rank: bytes (_NEVER: whole saves nothing there)
        self.gain: list[list[float]] = []  # per GPU, by rank: seconds a token one whole layer saves
        for spg, detour in zip(sp.gpu, sp.detour, strict=True):
            gains = [tok * (sp.cpu - spg) + detour for _, tok in kinds]
            order = sorted(range(len(kinds)), key=lambda i: (-gains[i] / kinds[i][0], i))
            rank = {i: r for r, i in enumerate(order)}
            self.kind_at.append([rank[i] if i >= 0 else -1 for i in kind_of])
            self.sizes.append([kinds[i][0] if gains[i] > 0 else _NEVER for i in order])
            self.gain.append([gains[i] for i in order])
        #: per GPU and layer: its seconds a token there with its experts on the CPU
        self.step = [[lc.base_tok * spg + (lc.experts_tok * sp.cpu + detour if lc.experts else 0.0)
                      for lc in layers] for spg, detour in zip(sp.gpu, sp.detour, strict=True)]

    def whole_counts(self, g: int, left: int, counts: Sequence[int]) -> list[int]:
        """How many layers of each rank are whole in a block on GPU ``g`` with ``left`` bytes beside
        its layers' base: the kinds that save the most per byte first (small layers, as each layer
        on the CPU costs two splits whatever its size)."""
        out = []
        for size, n in zip(self.sizes[g], counts, strict=True):
            t = min(n, left // size)
            left -= t * size
            out.append(t)
        return out


def best_layout(layers: Sequence[LayerCost], room: Sequence[int], sp: Speeds) -> Layout | None:
    """The block split with the shortest token (:class:`Speeds`, a straight line in the bytes each
    device reads): each GPU in llama.cpp's order takes the next layers; in each block the whole layers
    are those its room allows beyond the layers' base, smallest first.  None: the layers do not fit
    even with every free expert on the CPU."""
    bl = _Blocks(layers, room, sp)
    n, k = len(layers), len(room)
    extend = _extend2 if bl.n_kinds <= 2 else _extend
    inf = float("inf")
    best = [0.0] + [inf] * n  # best[e]: layers 0..e-1 on the GPUs so far
    parent: list[list[int]] = []
    for g in range(k):
        nxt, par = list(best), list(range(n + 1))  # an empty block: as before
        if g == k - 1 and k > 1:  # but the output layer is on the last GPU: one split to it
            nxt[n] += sp.boundary
        if g == k - 1:  # only the blocks that end with the last layer count
            _last_block(bl, g, best, nxt, par)
        else:
            for s0 in range(n):
                if best[s0] != inf:
                    extend(bl, g, s0, best[s0] + (sp.boundary if s0 else 0.0), nxt, par)
        best = nxt
        parent.append(par)
    if best[n] == inf:
        return None
    return _rebuild(bl, parent, n)


def _extend(bl: _Blocks, g: int, s0: int, t0: float, nxt: list[float], par: list[int]) -> None:
    """Every block from layer ``s0`` on GPU ``g`` that fits: ``nxt[e]`` improved where it is faster."""
    room, bases, step, kind_of = bl.room[g], bl.bases, bl.step[g], bl.kind_at[g]
    sizes, gain = bl.sizes[g], bl.gain[g]
    base, t = 0, t0
    counts = [0] * len(sizes)
    for e in range(s0, len(bases)):
        base += bases[e]
        if base > room:
            return
        t += step[e]
        if kind_of[e] >= 0:
            counts[kind_of[e]] += 1
        left, v = room - base, t
        for size, c, gj in zip(sizes, counts, gain, strict=True):
            w = min(c, left // size)
            left -= w * size
            v -= w * gj
        if v < nxt[e + 1]:
            nxt[e + 1], par[e + 1] = v, s0


def _last_block(bl: _Blocks, g: int, best: list[float], nxt: list[float], par: list[int]) -> None:
    """The blocks of the last GPU: every start, to the last layer (grown from the end)."""
    n = len(bl.bases)
    room, bases, step, kind_of = bl.room[g], bl.bases, bl.step[g], bl.kind_at[g]
    gain = bl.gain[g]
    base, t = 0, 0.0
    counts = [0] * bl.n_kinds
    for s0 in range(n - 1, -1, -1):
        base += bases[s0]
        if base > room:
            return
        t += step[s0]
        if kind_of[s0] >= 0:
            counts[kind_of[s0]] += 1
        if best[s0] == float("inf"):
            continue
        v = best[s0] + (bl.sp.boundary if s0 else 0.0) + t
        v -= sum(w * gj for w, gj in zip(bl.whole_counts(g, room - base, counts), gain, strict=True))
        if v < nxt[n]:
            nxt[n], par[n] = v, s0


def _extend2(bl: _Blocks, g: int, s0: int, t0: float, nxt: list[float], par: list[int]) -> None:
    """:func:`_extend` for at most two kinds of layers (most models), written out: the search runs it
    for every block of every GPU."""
    room, bases, step, kind_of = bl.room[g], bl.bases, bl.step[g], bl.kind_at[g]
    sz = [*bl.sizes[g], _NEVER, _NEVER]
    gn = [*bl.gain[g], 0.0, 0.0]
    sa, sb, ga, gb = sz[0], sz[1], gn[0], gn[1]
    base, t, ca, cb = 0, t0, 0, 0
    for e in range(s0, len(bases)):
        base += bases[e]
        if base > room:
            return
        t += step[e]
        i = kind_of[e]
        if i == 0:
            ca += 1
        elif i == 1:
            cb += 1
        left = room - base
        wa = left // sa
        if wa > ca:
            wa = ca
        wb = (left - wa * sa) // sb
        if wb > cb:
            wb = cb
        v = t - wa * ga - wb * gb
        if v < nxt[e + 1]:
            nxt[e + 1], par[e + 1] = v, s0


def _rebuild(bl: _Blocks, parent: list[list[int]], n: int) -> Layout:
    """The blocks and their whole layers from the choices made (the first layers of each kind in a
    block are whole)."""
    units: list[int] = []
    whole: set[int] = set()
    e = n
    for g in range(len(parent) - 1, -1, -1):
        s0 = parent[g][e]
        units.append(e - s0)
        block = bl.layers[s0:e]
        counts = [sum(1 for x in range(s0, e) if bl.kind_at[g][x] == i) for i in range(bl.n_kinds)]
        left = bl.room[g] - sum(lc.base for lc in block)
        todo = bl.whole_counts(g, left, counts)
        for x, lc in zip(range(s0, e), block, strict=True):
            i = bl.kind_at[g][x]
            if i >= 0 and todo[i]:
                todo[i] -= 1
                whole.add(lc.index)
        e = s0
    units.reverse()
    units[-1] += 1  # the output layer stays on the last GPU
    return Layout(tuple(units), frozenset(whole))
