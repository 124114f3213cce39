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
   Inside the window, a run of the reference's own nodes (a split whose copies changed, up to the
   moved layer) takes the reference's per-backend events from a checkpoint on instead of a walk,
   up to the first use of a tensor live in one run only (or the last use of one whose count
   differs).  A tail's states are kept on the reference with the maximum from there on: the next
   move's tail that meets one (the residual stream in the same other block) stops there.
   Tails and stretches jump whole periods of layers (:mod:`.periods`): where a backend's events
   repeat layer after layer (recorded as runs of equal segments between layer starts) and the
   state at a layer start is one it had a multiple of the period before, every further period
   repeats it, with the same maximum; the walk goes on at the run's end.

A caller that keeps the larger of two reserves per backend (the planner's projection) may pass the
first one's sizes: the second is left out when a bound of its sizes (:mod:`.bound`) is at most those
on every backend (the one-token graph against the prompt graph: a few rows per tensor against
thousands): before step 2 the reference's bound under any placement that builds its graph
(``Reference.below_any_placement``: every tensor and every copy pass 5 may make, on every backend), after
step 2 the reference's bound plus the affected nodes with their sources and the copies they may add,
else after step 3 the reference's plus the window's tensors.

A refusal (or an unsupported case: pipeline parallelism, the dry run, pass 3 at work, a different
topology) runs the full simulation, recorded as the new reference (on the graph kept for the topology
when there is one: its layers scheduled and walked a period at a time, :mod:`.recording`).  A change
whose affected nodes span most of the graph, densely (``replay.FAR_SPAN``), runs in full without
recording (a replay would walk nearly all of it), on the graph kept for the topology (:mod:`.template`).
``tests/core/test_compute_incremental.py`` checks replays against the full simulation on random
placements.
"""


from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from operator import ne

from offload_planner.core.compute.ggml import (
    T,
)
from offload_planner.core.compute.graph import Builder, Shape, WeightWhere
from offload_planner.core.compute.rec_alloc import Refuse
from offload_planner.core.compute.rec_jumps import jumping_walker
from offload_planner.core.compute.recording import Reference
from offload_planner.core.compute.replay import Far, diff, diff_items, replay
from offload_planner.core.compute.reserve import Reserve, reserve_graph
from offload_planner.core.compute.sched_layers import cached_refs
from offload_planner.core.compute.scheduler import Backend
from offload_planner.core.compute.stats import stats
from offload_planner.core.compute.template import handed_codes, placed_graph
from offload_planner.core.placement import Placed

# --- the cache of references -----------------------------------------------------------------------------


#: per topology, the recorded references (latest last): a caller that moves far from every one of
#: them (the --fit search jumps between layer splits) gets another
_REFS: OrderedDict[tuple[object, ...], list[Reference]] = OrderedDict()
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


@contextmanager
def recording_first_sights(on: bool = True) -> Iterator[None]:
    """:func:`record_at_first_sight` for the simulations inside (a caller that knows the next ones
    will stay near: the --fit search's bisection steps); off: as it was."""
    global _record_at_first_sight
    was = _record_at_first_sight
    _record_at_first_sight = was or on
    try:
        yield
    finally:
        _record_at_first_sight = was


def _distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Layers (units) on another device."""
    if len(a) != len(b):
        raise ValueError("placements of different models")
    return 0 if a == b else sum(map(ne, a, b))


def _near(units: Sequence[str]) -> int:
    """How many units may differ for a replay to beat recording a new reference."""
    return max(2, len(units) // 8)


def _nearest(key: tuple[object, ...], units: list[str]) -> Reference | None:
    refs = _REFS.get(key)
    if not refs:
        return None
    _REFS.move_to_end(key)
    best = refs[0] if len(refs) == 1 else min(refs, key=lambda r: _distance(r.unit_devices, units))
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


def _keep(key: tuple[object, ...], ref: Reference) -> None:
    refs = _REFS.setdefault(key, [])
    _REFS.move_to_end(key)
    refs.append(ref)
    del refs[:-_REFS_PER_KEY]
    if len(_REFS) > _REFS_SIZE:
        _REFS.popitem(last=False)




def _below_whatever_moves(ref: Reference, below: list[int]) -> bool:
    """The reference's graph reserves at most ``below`` on every backend under any placement that
    builds it (``Reference.below_any_placement``): a caller keeping the larger reserve per backend may leave
    it out before passes 1-4 (counted as left out early)."""
    if not ref.below_any_placement(below):
        return False
    stats["left_out"] += 1
    stats["left_out_early"] += 1
    stats["left_out_any"] += 1
    return True


def incremental_reserve(key: tuple[object, ...], sh: Shape, arch_fn: Callable[[Builder], None],
                        backends: list[Backend], op_offload: bool, items: Sequence[Placed],
                        where: Callable[[], WeightWhere], weights: Callable[[], Callable[[str], T | None]],
                        layer_dev: Callable[[int], str], kv_dev: Callable[[int], str],
                        unit_devices: list[str], offload_kqv: bool, no_alloc: bool = False,
                        graph_key: tuple[object, ...] = (), below: list[int] | None = None) -> Reserve | None:
    """``reserve`` (one copy) replayed against the recorded reference of the same topology nearest to
    this placement; recorded the second time a placement near it is simulated (or the first:
    :func:`record_at_first_sight`).

    ``items`` are the placement's; ``where`` and ``weights`` make its weight table and weight factory
    (only asked for when the items do not line up with the reference's, or to record one).
    ``no_alloc``: the dry run's reserve (forced backends dropped; ``key`` must tell it apart).
    ``graph_key``: the model and builder (:mod:`.template`: a graph built for a simulation that records
    no reference is kept for the next one).
    ``below``: None instead of a replayed reserve whose sizes a bound puts at most there on every
    backend (a caller that keeps the larger of two reserves per backend)."""
    ref = _nearest(key, unit_devices)
    if ref is not None:
        if ref.free_leafs:  # the bounds take the leafs where the reference has them: no leaving out
            below = None
        try:
            mv = diff_items(ref, items, unit_devices, offload_kqv)
            if mv is not None:
                stats["item_diffs"] += 1
            else:
                mv = diff(ref, where(), unit_devices, offload_kqv)
            if below is not None and (mv.dev or mv.forced) and _below_whatever_moves(ref, below):
                return None
            r = replay(ref, mv, below)
            if r is not None:
                stats["replays"] += 1
            return r
        except Refuse:  # a case the replay does not handle: run it in full
            stats["refused"] += 1
        except Far:  # most of the graph changes: in full, on the kept graph, recording nothing
            stats["far"] += 1
            g = placed_graph(graph_key, sh, arch_fn, where(), weights, layer_dev, kv_dev)
            return reserve_graph(g, sh, backends, 1, no_alloc=no_alloc, op_offload=op_offload)
        except Exception:  # a replay bug: never the user's failure (run it in full), but counted
            stats["replay_errors"] += 1  # the tests require none
    elif _first_sight(key, unit_devices):
        stats["plain"] += 1
        g = placed_graph(graph_key, sh, arch_fn, where(), weights, layer_dev, kv_dev)
        return reserve_graph(g, sh, backends, 1, no_alloc=no_alloc, op_offload=op_offload)
    try:
        g = placed_graph(graph_key, sh, arch_fn, where(), weights, layer_dev, kv_dev, own=True)
        codes = handed_codes(g)
        walker = None if codes is None else jumping_walker(codes)
        layers = None if codes is None else cached_refs(g, codes[0])
        ref = Reference(sh, arch_fn, backends, op_offload, weights(), layer_dev, kv_dev, items, unit_devices,
                        keep_forced=not no_alloc, graph=g, walker=walker, layers=layers)
    except Refuse:
        stats["full"] += 1
        g = placed_graph(graph_key, sh, arch_fn, where(), weights, layer_dev, kv_dev)
        return reserve_graph(g, sh, backends, 1, no_alloc=no_alloc, op_offload=op_offload)
    stats["full"] += 1
    _keep(key, ref)
    return ref.reserve
