"""The planner's entry point: compute buffers per backend, explained, remembered for the last few
placements."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Generic, TypeVar, cast

from offload_planner.core.buffer import Buffer
from offload_planner.core.compute.ggml import CPU
from offload_planner.core.compute.graph import LEGACY_KQ_MASK_PAD, Shape
from offload_planner.core.compute.simulate import (
    ReserveMemo,
    Simulation,
    backends_for,
    full_offload,
    graph_builder,
    reserve_shapes,
    simulate,
    term_estimate,
)
from offload_planner.core.item_changes import changed_items, kept_copy
from offload_planner.core.units import MiB

if TYPE_CHECKING:
    from offload_planner.core.devices import DeviceSet
    from offload_planner.core.memory import ContextParams, ResolvedContext
    from offload_planner.core.model import Model
    from offload_planner.core.placement import Placed, Placement




# --- the planner's entry point ----------------------------------------------------------------------------


def _mib(n: int) -> str:
    return f"{n / MiB:.2f} MiB"


def explain(sim: Simulation, i: int, sh: Shape, output_device: str) -> str:
    be, pp = sim.backends[i], sim.reserves[0]
    r = pp  # the reserve with the most bytes here (the first of equal ones)
    for q in sim.reserves[1:]:
        if q.sizes[i] > r.sizes[i]:
            r = q
    parts = [f"peak of the {r.n_tokens}-token graph at {r.peaks[i] or 'its inputs'}"]
    if pp.copies_bytes[i]:
        parts.append(f"{_mib(pp.copies_bytes[i])} of inputs copied from other backends"
                     + (f" (x{sim.n_copies}, pipeline parallelism)" if sim.n_copies > 1 else ""))
    if pp.weight_copies_bytes[i]:
        parts.append(f"op offload: {_mib(pp.weight_copies_bytes[i])} of host weights pass through it, "
                     "one split at a time")
    key = (sh, be.name == CPU, be.name == output_device)
    rest = _EXPLAINED.get(key)
    if rest is None:
        rest = _explain_shape(sh, be.name == CPU, be.name == output_device)
        if len(_EXPLAINED) < _EXPLAINED_SIZE:  # (never evicted: nothing a caller froze is freed here)
            _EXPLAINED[key] = rest
    return "; ".join(parts) + rest


#: the part of an explanation that follows from the graph's shape and the backend's role alone
_EXPLAINED: dict[tuple[Shape, bool, bool], str] = {}
_EXPLAINED_SIZE = 256


def _explain_shape(sh: Shape, cpu: bool, output: bool) -> str:
    """``explain``'s parts after the peak and the copies: the KQ mask, attention, the host side and
    the logits (each after "; ")."""
    parts = [""]
    if sh.legacy_inputs:
        mask = sh.n_kv * -(-sh.n_tokens // LEGACY_KQ_MASK_PAD) * LEGACY_KQ_MASK_PAD * 4
        cast = ", cast to f16 where attention runs" if sh.flash_attn else ""
        parts.append(f"KQ mask {_mib(mask)} f32{cast}" + (" + SWA mask" if any(sh.swa) else ""))
    else:
        mask = sh.n_kv * sh.n_tokens * (2 if sh.flash_attn else 4)
        parts.append(f"KQ mask {_mib(mask)} {'f16' if sh.flash_attn else 'f32'}"
                     + (" + SWA mask" if any(sh.swa) else ""))
    if not sh.flash_attn:
        parts.append("no flash attention: KQ scores n_kv x n_tokens x n_head x 4 B per layer")
    if cpu:
        parts.append("host side: graph inputs, token-embedding rows, ops on CPU weights")
        if sh.legacy_inputs and not sh.flash_attn and not sh.kv_cpy_views:
            v_idx = sh.n_tokens * max(sh.n_head_kv) * sh.head_v * 8
            parts.append(f"two rules fit 2025 logs: builds from July 2025 (set_rows KV store, assumed here) "
                         f"hold the {_mib(v_idx)} V-index input; earlier builds copy K/V into cache views "
                         "and have no index inputs")
    if output and sh.legacy_inputs:
        parts.append("2025 builds reserve the logits of every ubatch token")
    if output:
        parts.append(f"logits {sh.n_outputs} x {sh.n_vocab} x 4 B ({_mib(4 * sh.n_outputs * sh.n_vocab)})")
    return "; ".join(parts)


SIMULATION_LOCK = threading.RLock()
B = TypeVar("B", bound="list[Buffer] | None")


class BufferMemo(Generic[B]):
    """The buffers of the last ``size`` simulations by everything they read (an editor's undo/redo
    or A/B toggling revisits them); handed out as copies. Simulations run one at a time: the memo
    and the incremental replay's references are shared by the window's GUI thread and its worker."""

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._d: OrderedDict[tuple[object, ...], B] = OrderedDict()

    @staticmethod
    def _copy(v: B) -> B:
        return cast(B, None if v is None else [b.copy() for b in v])

    def clear(self) -> None:
        self._d.clear()

    def get(self, key: tuple[object, ...], simulate: Callable[[], B]) -> B:
        with SIMULATION_LOCK:
            if key in self._d:
                self._d.move_to_end(key)
                return self._copy(self._d[key])
            out = simulate()
            self._d[key] = self._copy(out)
            if len(self._d) > self.size:
                self._d.popitem(last=False)
            return out


MEMO: BufferMemo[list[Buffer]] = BufferMemo()


def placement_key(placement: Placement) -> tuple[object, ...]:
    """What a compute simulation reads of a placement (the items as one :class:`ItemsKey`)."""
    return (tuple(placement.unit_devices), placement.has_overrides, tuple(placement.model_devices),
            items_key(placement.items))


Entry = tuple[str, str | None, str | None]
_MOD = (1 << 61) - 1


def _entry_hash(i: int, e: Entry) -> int:
    return hash((i, e))


class ItemsKey:
    """Every item's name, device and buffer type, with its hash kept (a memo key is hashed at every
    look-up, and a big model has ~700 items).  The hash is the sum of the entries' hashes with their
    positions: a key corrected from a recorded one in a few entries corrects its hash by them."""

    __slots__ = ("_hash", "entries")

    def __init__(self, entries: tuple[Entry, ...], h: int | None = None) -> None:
        self.entries = entries
        self._hash = sum(map(_entry_hash, range(len(entries)), entries)) % _MOD if h is None else h

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ItemsKey) and (self is other or (
            self._hash == other._hash and self.entries == other.entries))


#: the last few item lists keyed in full: a placement that differs from one of them in a few items
#: (an edit's moves, ``Plan.placement``) takes its entries and recomputes only the changed ones
_KEY_REFS: list[tuple[list[Placed], ItemsKey]] = []
_KEY_REFS_SIZE = 4
_KEY_LOCK = threading.Lock()


def items_key(items: list[Placed]) -> ItemsKey:
    """:class:`ItemsKey` of ``items``, corrected from a recent list of the same length when few
    items differ from it by identity (``Placed`` is frozen; the lists are kept alive here)."""
    with _KEY_LOCK:
        for ref_items, ref_key in reversed(_KEY_REFS):
            if len(ref_items) != len(items):
                continue
            changed = changed_items(items, ref_items)
            if len(changed) > max(64, len(items) // 8):
                continue
            entries = list(ref_key.entries)
            h = ref_key._hash
            for i in changed:
                p = items[i]
                e: Entry = (p.name, p.device, p.buft)
                h += _entry_hash(i, e) - _entry_hash(i, entries[i])
                entries[i] = e
            return ItemsKey(tuple(entries), h % _MOD)
        key = ItemsKey(tuple((p.name, p.device, p.buft) for p in items))
        _KEY_REFS.append((kept_copy(items), key))
        del _KEY_REFS[:-_KEY_REFS_SIZE]
        return key


def compute_buffers(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
                    params: ContextParams) -> list[Buffer]:
    """One compute buffer per backend that llama.cpp reserves (> 1 byte), CPU side last, named by the
    buffer type it logs (the CPU side uses the first device's host buffer, e.g. ``CUDA_Host``).

    Remembered for the last few placements (:class:`BufferMemo`); plain and not remembered inside
    :func:`one_shot` (a projection made once: its key, ~1,000 items, would only cost)."""
    if _ONE_SHOT.get():
        return simulate_buffers(model, devices, placement, ctx, params, incremental=False)
    key = (model, graph_builder(model), devices, ctx, params, *placement_key(placement))
    return MEMO.get(key, lambda: simulate_buffers(model, devices, placement, ctx, params))


_ONE_SHOT: ContextVar[bool] = ContextVar("one_shot", default=False)


@contextmanager
def one_shot(on: bool = True) -> Iterator[None]:
    """:func:`compute_buffers` inside (this thread or task only) simulates from scratch, plainly: no
    graph kept for re-placing and no replay reference looked up or recorded (:mod:`.incremental`,
    :mod:`.template`).  For a command that projects its plan once (``plan``); the window, which
    re-projects every edit, and the ``--fit`` port, whose dry runs re-place the graphs a projection
    keeps, keep them.  ``on=False``: as outside."""
    token = _ONE_SHOT.set(on)
    try:
        yield
    finally:
        _ONE_SHOT.reset(token)


def simulate_buffers(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
                     params: ContextParams, *, incremental: bool = True,
                     memo: ReserveMemo | None = None) -> list[Buffer]:
    """``incremental=False``: a plain simulation that records no replay reference (a caller that
    projects a placement once, far from the last ones); ``memo``: its reserves by what they read
    (:func:`~offload_planner.core.compute.simulate.simulate`)."""
    reason = f"no graph model for {model.arch}"
    try:
        sim = simulate(model, devices, placement, ctx, params, incremental=incremental, sizes_only=True,
                       memo=memo)
    except (KeyError, IndexError, ValueError, ZeroDivisionError, AssertionError) as e:
        # a file whose tensors do not fit the architecture's graph: estimate rather than fail
        sim, reason = None, f"{model.arch} graph not built: {type(e).__name__} {e}"
    if sim is None:
        est = term_estimate(model, devices, placement, ctx, params)
        return [Buffer(be.name, be.buft, "compute", est[be.name],
                       f"estimate ({reason}): KQ mask, largest layer's activations, logits")
                for be in backends_for(devices, placement) if est.get(be.name, 0) > 1]
    sh = reserve_shapes(model, ctx, params, full_offload(placement))[0]
    out_dev = placement.output_device
    return [Buffer(be.name, be.buft, "compute", size, explain(sim, i, sh, out_dev))
            for i, (be, size) in enumerate(zip(sim.backends, sim.sizes, strict=True)) if size > 1]
