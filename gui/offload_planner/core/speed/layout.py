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

Packed (:meth:`_Blocks.fill`), a block also tries one or two fewer of its first-ranked whole layers
for larger ones that fill its room better (Kimi-K2: two 10.2 GiB layers in 20.8 GiB where a 8.9
and a 10.2 leave 1.7 unused), then fills the room left with parts: single expert tensors of its
other layers, on their own GPU (such a layer keeps its two splits and reads fewer bytes on the
CPU).  With speculative decoding the layers' expert reads are weighed per step (:func:`weighted`,
:class:`~offload_planner.core.speed.speculation.StepReads`).

Budgets come from the plan with every free routed expert on the CPU: a GPU's capacity minus its
margin minus what the projection puts there that does not follow a layer (the output layer, compute
buffers).  The compute buffers grow once a GPU holds experts, so the search projects the result and
lowers the budget of a GPU over its limit by what it is over (:func:`best_layout` again).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from offload_planner.core.devices import DeviceSet
from offload_planner.core.memory import Projection, alloc_size, kv_buffers, pad
from offload_planner.core.placement import CPU, selected_gpus
from offload_planner.core.plan import Plan
from offload_planner.core.roles import Role
from offload_planner.core.speed.efficiency import Efficiencies
from offload_planner.core.speed.hardware import Hardware
from offload_planner.core.speed.rates import _bandwidth
from offload_planner.core.speed.reads import expert_fraction, token_bytes
from offload_planner.core.speed.speculation import StepReads
from offload_planner.core.speed.splits import _split_seconds


@dataclass(frozen=True)
class LayerCost:
    index: int
    base: int  # bytes on its GPU with its free routed experts on the CPU (weights that follow it, KV)
    experts: int  # bytes of its free routed experts on its GPU
    names: tuple[str, ...]  # those experts
    base_tok: int = 0  # bytes a token reads of what follows it (its weights; no KV at depth 0)
    experts_tok: int = 0  # bytes a token reads of its free experts (n_expert_used / n_expert)
    #: per name of ``names``: its bytes on the layer's GPU and the bytes a token reads of it (a part
    #: of the layer's experts on its GPU, the rest on the CPU: the same two splits, fewer bytes read
    #: on the CPU); empty: the experts move only together
    parts: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Layout:
    units: tuple[int, ...]  # units (layers, the output last) per GPU: the -ts
    whole: frozenset[int]  # layers whose free routed experts are on their GPU
    parts: frozenset[str] = frozenset()  # single expert tensors of other layers on their layer's GPU

    def used(self, layers: Sequence[LayerCost]) -> list[int]:
        """Bytes each GPU's block takes by the layers' costs: their base, whole layers' experts, parts."""
        out, il0 = [], 0
        for n in self.units:
            block = layers[il0:il0 + n]
            out.append(sum(lc.base + (lc.experts if lc.index in self.whole else sum(
                size for x, (size, _) in zip(lc.names, lc.parts, strict=False) if x in self.parts))
                for lc in block))
            il0 += n
        return out

    def moves(self, layers: Sequence[LayerCost], gpus: Sequence[str]) -> dict[str, str]:
        """Each whole layer's free experts, and each part, onto its layer's GPU."""
        out: dict[str, str] = {}
        il0 = 0
        for g, n in zip(gpus, self.units, strict=True):
            for lc in layers[il0:il0 + n]:
                if lc.index in self.whole:
                    out.update(dict.fromkeys(lc.names, g))
                else:
                    out.update(dict.fromkeys((x for x in lc.names if x in self.parts), g))
            il0 += n
        return out


def may_split(plan: Plan) -> bool:
    """The search may choose the layer split: every unit on a GPU (-ngl all), -sm layer and no -ts of
    the user's (their split is a pin)."""
    po = plan.placement_options
    if po.split_mode != "layer" or any(po.tensor_split) or not selected_gpus(plan.devices, po):
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
        parts = tuple((pad(alloc_size(t, dev), dev.alignment), int(t.nbytes * frac))
                      for t in (model.tensor(x) for x in names))
        out.append(LayerCost(il, base[il], sum(p[0] for p in parts), names, tok[il],
                             sum(p[1] for p in parts), parts))
    return out


def weighted(layers: Sequence[LayerCost], reads: StepReads) -> list[LayerCost]:
    """``layers`` with the bytes a token reads of their free experts weighted per step of speculative
    decoding (:class:`StepReads`: the trunk's by the verify batch, NextN blocks' by the draft passes)."""
    out = []
    for lc in layers:
        w = reads.nextn if lc.index >= reads.n_trunk else reads.trunk
        parts = tuple((size, round(tok * w)) for size, tok in lc.parts)
        out.append(replace(lc, experts_tok=sum(t for _, t in parts) if parts else round(lc.experts_tok * w),
                           parts=parts))
    return out


def speeds(plan: Plan, hw: Hardware, eff: Efficiencies) -> Speeds:
    """The estimate's figures (:mod:`estimate`) the layout weighs: effective bandwidths and splits."""
    gpus = [g.name for g in selected_gpus(plan.devices, plan.placement_options)]  # -dev: its GPUs
    spb = [1.0 / (_bandwidth(hw[g], eff)[0] * 1e9) for g in gpus]
    detour = [_split_seconds(plan, hw, eff, [(g, CPU), (CPU, g)]) for g in gpus]
    boundary = _split_seconds(plan, hw, eff, [(gpus[0], gpus[-1])]) if len(gpus) > 1 else 0.0
    return Speeds(tuple(spb), 1.0 / (_bandwidth(hw[CPU], eff)[0] * 1e9), tuple(detour), boundary)


def budgets(plan: Plan, proj: Projection, layers: Sequence[LayerCost], devices: DeviceSet,
            margins: dict[str, int]) -> list[int]:
    """Per GPU the plan fills (llama.cpp's order: -dev's GPUs in its order): capacity minus margin minus
    what does not follow a layer."""
    placement = proj.placement
    gpus = [g for g in selected_gpus(plan.devices, plan.placement_options) if devices.by_name(g.name)]
    follows = dict.fromkeys((g.name for g in gpus), 0)
    for lc in layers:
        d = placement.layer_device(lc.index)
        if d in follows:
            follows[d] += lc.base
    out = []
    for g in gpus:
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


Kind = tuple[int, int, tuple[tuple[int, int], ...]]  # a layer's expert bytes, bytes read, parts


def _classes(layers: Sequence[LayerCost]) -> list[Kind]:
    """(expert bytes, expert bytes a token reads, parts) of the layers' kinds (layers with free
    experts)."""
    return sorted({(lc.experts, lc.experts_tok, tuple(sorted(lc.parts))) for lc in layers if lc.experts})


_NEVER = 1 << 62  # the size of a kind no block makes whole (it would not save time there)
#: whole layers of a block's first kind given up, each, for the later kinds (larger layers a block's
#: room takes better: Kimi-K2's 10.2 and 8.9 GiB layers, two of the larger in 20.8 GiB)
_FEWER = (1, 2)


@dataclass(frozen=True)
class _Piece:
    """Expert tensors of one size of a kind of layers, on a GPU: each saves what a token reads of it
    on the CPU against that GPU (its layer still costs the two splits)."""

    size: int
    gain: float
    rank: int  # its kind's rank on that GPU
    mult: int  # such tensors in one layer of the kind
    part: tuple[int, int]  # (bytes, bytes read): LayerCost.parts of those tensors


@dataclass(frozen=True)
class _Fill:
    """What a block makes of its room beside its layers' base: whole layers per rank, then parts of
    the others (:class:`_Piece`, per piece of the GPU), and the seconds a token they save."""

    saved: float
    whole: tuple[int, ...]
    pieces: tuple[int, ...]


class _Blocks:
    """Per layer and GPU the cost of a block of layers on that GPU, worked out once.  Per GPU the
    kinds of layers (by their experts) are ranked by the time a whole one saves there per byte, the
    first first: ``kind_at[g][layer]`` is the layer's rank (-1: no free experts)."""

    def __init__(self, layers: Sequence[LayerCost], room: Sequence[int], sp: Speeds,
                 slack: int | None = None) -> None:
        self.layers, self.room, self.sp = layers, room, sp
        self.packed = slack is not None
        self.slack = slack or 0
        kinds = _classes(layers)
        self.n_kinds = len(kinds)
        kind = {k: i for i, k in enumerate(kinds)}
        kind_of = [kind.get((lc.experts, lc.experts_tok, tuple(sorted(lc.parts))), -1) if lc.experts else -1
                   for lc in layers]
        self.bases = [lc.base for lc in layers]
        self.kind_at: list[list[int]] = []
        self.sizes: list[list[int]] = []  # per GPU, by rank: bytes (_NEVER: whole saves nothing there)
        self.gain: list[list[float]] = []  # per GPU, by rank: seconds a token one whole layer saves
        self.pieces: list[list[_Piece]] = []  # per GPU: the parts of layers, largest first
        self.min_piece: list[int] = []  # per GPU: the smallest piece (_NEVER: none)
        #: per GPU: the most seconds a byte of the first rank's whole layers, and of anything else, saves
        self.rates: list[tuple[float, float]] = []
        self._memo: dict[tuple[int, ...], _Fill] = {}
        for spg, detour in zip(sp.gpu, sp.detour, strict=True):
            gains = [tok * (sp.cpu - spg) + detour for _, tok, _ in kinds]
            order = sorted(range(len(kinds)), key=lambda i: (-gains[i] / kinds[i][0], i))
            rank = {i: r for r, i in enumerate(order)}
            self.kind_at.append([rank[i] if i >= 0 else -1 for i in kind_of])
            self.sizes.append([kinds[i][0] if gains[i] > 0 else _NEVER for i in order])
            self.gain.append([gains[i] for i in order])
            pieces = [_Piece(size, tok * (sp.cpu - spg), rank[i], kinds[i][2].count((size, tok)), (size, tok))
                      for i in order for size, tok in dict.fromkeys(kinds[i][2]) if tok * (sp.cpu - spg) > 0]
            pieces.sort(key=lambda x: (-x.size, -x.gain, x.rank))
            self.pieces.append(pieces)
            self.min_piece.append(min((x.size for x in pieces), default=_NEVER))
            # seconds a byte saves at most: whole layers of the first rank, then anything else (an
            # upper bound of any fill, as the fractional knapsack's)
            per_byte = [g / size if size < _NEVER else 0.0
                        for g, size in zip(self.gain[-1], self.sizes[-1], strict=True)]
            later = max(per_byte[1:] + [x.gain / x.size for x in pieces], default=0.0)
            first = per_byte[0] if per_byte else 0.0
            self.rates.append((max(first, later) * (1 + 1e-9), later * (1 + 1e-9)))
        #: per GPU and layer: its seconds a token there with its experts on the CPU
        self.step = [[lc.base_tok * spg + (lc.experts_tok * sp.cpu + detour if lc.experts else 0.0)
                      for lc in layers] for spg, detour in zip(sp.gpu, sp.detour, strict=True)]

    def whole_counts(self, g: int, left: int, counts: Sequence[int], first: int = 0) -> list[int]:
        """How many layers of each rank from ``first`` are whole in a block on GPU ``g`` with
        ``left`` bytes beside its layers' base: the kinds that save the most per byte first (small
        layers, as each layer on the CPU costs two splits whatever its size)."""
        out = []
        for size, n in zip(self.sizes[g][first:], counts[first:], strict=True):
            # none on a GPU without room: an empty block on a GPU whose budget is already below 0
            # (a 1 GiB card beside its margin) was asked for -1 layers, and no fill was ever chosen
            t = min(n, max(0, left // size))
            left -= t * size
            out.append(t)
        return out

    def fill(self, g: int, left: int, counts: Sequence[int]) -> _Fill:
        """The most a block on GPU ``g`` with ``left`` bytes beside its layers' base saves: whole
        layers (:meth:`whole_counts`, or one or two fewer of the first kind for more of the later
        ones, which may fill the room better), then in the room left parts of the block's other
        layers, largest first (each on its layer's GPU: no split more)."""
        key = (g, left, *counts)  # blocks of as many layers of each kind, on as much room, repeat
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self._fill(g, left, counts)
        return got

    def _fill(self, g: int, left: int, counts: Sequence[int]) -> _Fill:
        sizes, gains = self.sizes[g], self.gain[g]
        greedy = self.whole_counts(g, left, counts)
        if not self.packed:
            return _Fill(sum(w * gains[r] for r, w in enumerate(greedy) if w), tuple(greedy),
                         (0,) * len(self.pieces[g]))
        options = [greedy]
        r0 = next((r for r, w in enumerate(greedy) if w), None)
        if r0 is not None and any(w < c for w, c in zip(greedy[r0 + 1:], counts[r0 + 1:], strict=True)):
            used = sum(w * sizes[r] for r, w in enumerate(greedy[:r0]))
            for d in _FEWER:
                if greedy[r0] < d:
                    break
                w0 = greedy[r0] - d
                rest = self.whole_counts(g, left - used - w0 * sizes[r0], counts, r0 + 1)
                options.append([*greedy[:r0], w0, *rest])
        best = _Fill(-1.0, (), ())
        for whole in options:
            room, saved = left - self.slack, 0.0
            for w, size, gain in zip(whole, sizes, gains, strict=True):
                if w:
                    room -= w * size
                    saved += w * gain
            pieces = []
            for pc in self.pieces[g]:
                t = (counts[pc.rank] - whole[pc.rank]) * pc.mult
                if room < pc.size or not t:
                    pieces.append(0)
                    continue
                t = min(t, room // pc.size)
                room -= t * pc.size
                saved += t * pc.gain
                pieces.append(t)
            if saved > best.saved:
                best = _Fill(saved, tuple(whole), tuple(pieces))
        return best


def best_layout(layers: Sequence[LayerCost], room: Sequence[int], sp: Speeds,
                slack: int | None = None) -> Layout | None:
    """The block split with the shortest token (:class:`Speeds`, a straight line in the bytes each
    device reads): each GPU in llama.cpp's order takes the next layers; in each block the whole layers
    are those its room allows beyond the layers' base, smallest first.  With ``slack`` (packed), also
    one or two fewer of them for larger ones, and parts of the others fill the room left but
    ``slack`` bytes (:meth:`_Blocks.fill`: the compute buffers of another split are predicted, not
    known).  None: the layers do not fit even with every free expert on the CPU."""
    bl = _Blocks(layers, room, sp, slack)
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
        else:  # packed: the whole layers' blocks first, then only what may beat them is filled
            for packed in (False, True)[:1 + bl.packed]:
                for s0 in range(n):
                    if best[s0] != inf:
                        extend(bl, g, s0, best[s0] + (sp.boundary if s0 else 0.0), nxt, par, packed)
        best = nxt
        parent.append(par)
    if best[n] == inf:
        return None
    return _rebuild(bl, parent, n)


def _extend(bl: _Blocks, g: int, s0: int, t0: float, nxt: list[float], par: list[int],
            packed: bool = False) -> None:
    """Every block from layer ``s0`` on GPU ``g`` that fits: ``nxt[e]`` improved where it is faster."""
    room, bases, step, kind_of = bl.room[g], bl.bases, bl.step[g], bl.kind_at[g]
    base, t = 0, t0
    counts = [0] * bl.n_kinds
    for e in range(s0, len(bases)):
        base += bases[e]
        if base > room:
            return
        t += step[e]
        if kind_of[e] >= 0:
            counts[kind_of[e]] += 1
        left, v = room - base, t
        if packed:
            v -= bl.fill(g, left, counts).saved
        else:
            for size, c, gj in zip(bl.sizes[g], counts, bl.gain[g], strict=True):
                w = min(c, left // size)
                left -= w * size
                v -= w * gj
        if v < nxt[e + 1]:
            nxt[e + 1], par[e + 1] = v, s0


def _last_block(bl: _Blocks, g: int, best: list[float], nxt: list[float], par: list[int]) -> None:
    """The blocks of the last GPU: every start, to the last layer (grown from the end)."""
    n = len(bl.bases)
    room, bases, step, kind_of = bl.room[g], bl.bases, bl.step[g], bl.kind_at[g]
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
        v = best[s0] + (bl.sp.boundary if s0 else 0.0) + t - bl.fill(g, room - base, counts).saved
        if v < nxt[n]:
            nxt[n], par[n] = v, s0


def _extend2(bl: _Blocks, g: int, s0: int, t0: float, nxt: list[float], par: list[int],
             packed: bool = False) -> None:
    """:func:`_extend` for at most two kinds of layers (most models), written out: the search runs it
    for every block of every GPU.  The whole layers smallest first as :meth:`_Blocks.whole_counts`;
    ``packed``: :meth:`_Blocks.fill` instead, only where it may find more (room for a part, or for
    a larger layer instead of a smaller one) and its bound beats the best block so far."""
    room, bases, step, kind_of = bl.room[g], bl.bases, bl.step[g], bl.kind_at[g]
    sz = [*bl.sizes[g], _NEVER, _NEVER]
    gn = [*bl.gain[g], 0.0, 0.0]
    sa, sb, ga, gb = sz[0], sz[1], gn[0], gn[1]
    minp, ra, rb = bl.min_piece[g] + bl.slack, bl.rates[g][0], bl.rates[g][1]
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
        rest = left - wa * sa
        wb = rest // sb
        if wb > cb:
            wb = cb
        rest -= wb * sb
        v = t - wa * ga - wb * gb
        if packed and ((rest >= minp and wa + wb < ca + cb) or (wa and wb < cb and rest + sa >= sb)):
            # at most the first kind's bytes at its rate, the rest at the best rate after it
            x = ca * sa if ca * sa < left else left
            if t - (x * ra + (left - x) * rb) < nxt[e + 1]:
                v = t - bl.fill(g, left, [ca, cb][:bl.n_kinds]).saved
        if v < nxt[e + 1]:
            nxt[e + 1], par[e + 1] = v, s0


def _rebuild(bl: _Blocks, parent: list[list[int]], n: int) -> Layout:
    """The blocks, their whole layers and parts from the choices made (the first layers of each kind
    in a block are whole, the next ones' tensors the parts, layer by layer)."""
    units: list[int] = []
    whole: set[int] = set()
    parts: set[str] = set()
    e = n
    for g in range(len(parent) - 1, -1, -1):
        s0 = parent[g][e]
        units.append(e - s0)
        block = bl.layers[s0:e]
        counts = [sum(1 for x in range(s0, e) if bl.kind_at[g][x] == i) for i in range(bl.n_kinds)]
        got = bl.fill(g, bl.room[g] - sum(lc.base for lc in block), counts)
        todo = list(got.whole)
        rest: list[tuple[int, LayerCost]] = []
        for x, lc in zip(range(s0, e), block, strict=True):
            i = bl.kind_at[g][x]
            if i >= 0 and todo[i]:
                todo[i] -= 1
                whole.add(lc.index)
            elif i >= 0:
                rest.append((i, lc))
        for pc, t in zip(bl.pieces[g], got.pieces, strict=True):
            for i, lc in rest:
                if t and i == pc.rank:
                    take = [x for x, part in zip(lc.names, lc.parts, strict=True)
                            if part == pc.part and x not in parts][:t]
                    parts.update(take)
                    t -= len(take)
        e = s0
    units.reverse()
    units[-1] += 1  # the output layer stays on the last GPU
    return Layout(tuple(units), frozenset(whole), frozenset(parts))
