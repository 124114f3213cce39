"""A reference's recording walk that jumps whole periods of equal layers (``compute.rec_jumps``) against
the same recording walked node by node, and the ``--fit`` search with and without it.

Each case records a reference of a random placement (as the ``--fit`` search writes them: layer splits
over 2-4 GPUs, -ngl below the layer count, routed experts of a range of layers on the host, the
dry run and the server's reserves) on the graph kept from the simulation before (the path the search's
second dry run near a placement takes), then records it again without jumps on the same scheduled graph,
and wants every recorded field equal: sizes and peak labels, every backend's allocator events with
their positions and labels, every checkpoint (free blocks, maxima, peak labels, layer, live tensors
with offsets and counts, the maximum to come), the periods and the tail stops.  The models: a Q4_K_M
file whose layers repeat every third one (DeepSeek-V3, Qwen3-235B), one alternating sliding-window and
full attention (gpt-oss) and a dense one.
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from collections.abc import Iterator

import pytest
from tests.support.fit_placements import BIG_NAMES, big_models, random_fit_opts

from offload_planner.core import compute as C
from offload_planner.core import fit as F
from offload_planner.core.compute import incremental as CI
from offload_planner.core.compute import template as TPL
from offload_planner.core.compute.ggml import T
from offload_planner.core.compute.recording import Reference
from offload_planner.core.compute.stats import stats
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.memory import ContextParams, resolve_context
from offload_planner.core.model import Model
from offload_planner.core.placement import PlacementOptions, place

GIB = 1 << 30


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Model]:
    return big_models(tmp_path_factory.mktemp("rec_jump_headers"))


@pytest.fixture(autouse=True)
def _exact_jumps() -> Iterator[None]:
    """No recording found a jump inexact (which would have recorded it again without jumps), no replay
    raised."""
    restarts, errors = stats["rec_restarts"], stats["replay_errors"]
    yield
    assert (stats["rec_restarts"], stats["replay_errors"]) == (restarts, errors)


def _devices(n_gpu: int) -> DeviceSet:
    gpus = tuple(Device(f"CUDA{k}", DeviceKind.CUDA, 24 * GIB, 24 * GIB) for k in range(n_gpu))
    return DeviceSet(Device("CPU", DeviceKind.CPU, 512 * GIB, 480 * GIB), gpus)


def _params(c: int, ub: int, np_: int = 1) -> ContextParams:
    return ContextParams(n_ctx=c, n_batch=2048, n_ubatch=ub, n_seq_max=np_, kv_unified=True, flash_attn=True,
                         type_k="f16", type_v="f16", offload_kqv=True, swa_full=False, n_outputs_max=1)


def _recorded(ref: Reference) -> tuple[object, ...]:
    """Everything a reference keeps from its recording walk (the checkpoints' live tensors made)."""
    cks = {p: (ck.blocks, ck.max_size, ck.peaks, ck.layer, ck.live, ck.suffix) for p, ck in ref.cks.items()}
    per = ref.periods
    return (ref.sizes, ref.peaks, ref.reserve, ref.tail, ref.tail_pos, cks, per.bounds, per.at, per.alloc,
            per.runs, ref.tail_stops, ref.tail_stop_ck)


def _replace_and_record(model: Model, devices: DeviceSet, opts: PlacementOptions, params: ContextParams,
                        no_alloc: bool) -> list[Reference]:
    """The placement simulated on the kept graph, then recorded (taking that graph): its references."""
    placement = place(model, devices, opts)
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    CI._REFS.clear()
    CI._SEEN.clear()
    C.simulate(model, devices, placement, ctx, params, no_alloc=no_alloc, incremental=True)
    with CI.recording_first_sights():
        C.simulate(model, devices, placement, ctx, params, no_alloc=no_alloc, incremental=True)
    return [r for rs in CI._REFS.values() for r in rs]


@pytest.mark.parametrize("name", BIG_NAMES)
def test_jumping_recording_equals_recording_walked_node_by_node(big: dict[str, Model], name: str) -> None:
    model = big[name]
    rng = random.Random(zlib.crc32(f"rec-jumps-{name}".encode()))
    jumps = stats["rec_jumps"]
    params = _params(c=rng.choice([4096, 32768]), ub=rng.choice([512, 2048]))
    n_refs = 0
    for i in range(12):
        n_gpu = rng.choice([2, 3, 4])
        opts = random_fit_opts(rng, model, n_gpu)
        refs = _replace_and_record(model, _devices(n_gpu), opts, params, no_alloc=i % 2 == 0)
        for ref in refs:
            if ref.walker is None:  # pipeline parallelism records nothing; a graph built for it, no codes
                continue
            jumped = _recorded(ref)
            ref.walker = None
            ref._record_allocator()
            assert jumped == _recorded(ref), (opts, ref.sh.n_tokens)
            n_refs += 1
    assert n_refs >= 4
    assert stats["rec_jumps"] - jumps >= n_refs  # every recording jumped at least once


def _canonical(ref: Reference) -> tuple[object, ...]:
    """What a reference recorded, every tensor written as its position (among the graph's leafs, the
    scheduler's leafs and its nodes) or its name: the same for two graphs built alike."""
    where: dict[int, object] = {}
    for kind, ts in (("g", ref.g.leafs), ("l", ref.sched.leafs), ("n", ref.sched_nodes)):
        where.update((id(t), (kind, k)) for k, t in enumerate(ts))

    def c(x: object) -> object:
        if isinstance(x, T):
            return where.get(id(x), x.name)
        if isinstance(x, dict):
            return sorted((repr(c(k)), c(v)) for k, v in x.items())
        if isinstance(x, list | tuple):
            return [c(e) for e in x]
        return x

    splits = [(sp.backend, sp.i_start, sp.i_end, c(sp.inputs)) for sp in ref.splits]
    cks = {p: (ck.blocks, ck.max_size, ck.peaks, ck.layer, c(ck.live), ck.suffix)
           for p, ck in ref.cks.items()}
    return (ref.p1, [n.bid for n in ref.g.nodes], c(ref.orig_src), splits, ref.cur_before, ref.ne_before,
            ref.split_before, c(ref.created), c(ref.copy_of), ref.input_pos, ref.sched_ids,
            ref.sched.leaf_ids, c(ref.sched_nodes), ref.sizes, ref.peaks, ref.reserve, c(ref.tail),
            ref.tail_pos, cks, c(ref.periods.alloc), ref.periods.runs, ref.tail_stops)


@pytest.mark.parametrize("name", BIG_NAMES)
def test_reference_on_kept_layers_equals_reference_walked_node_by_node(
        big: dict[str, Model], name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reference recorded on a kept graph whose layers are coded (the scheduler's passes 1-4 a layer at
    a time, the walk jumping periods) equals one recorded on a copy of that graph without the codes
    (every pass and the walk node by node): the scheduler's assignments, splits and copies, pass 5's
    state before every node, the allocator's events and checkpoints, tensor for tensor by position."""
    model = big[name]
    rng = random.Random(zlib.crc32(f"rec-layers-{name}".encode()))
    params = _params(c=rng.choice([4096, 32768]), ub=rng.choice([512, 2048]))
    compared = 0
    n_layer = model.summary.n_layer
    for i in range(8):
        n_gpu = rng.choice([2, 3, 4])
        opts = random_fit_opts(rng, model, n_gpu)
        if not opts.overrides:  # every layer offloaded without overrides: pipeline parallelism, not recorded
            opts = dataclasses.replace(opts, n_gpu_layers=min(opts.n_gpu_layers, n_layer - rng.randint(1, 8)))
        on_layers = _replace_and_record(model, _devices(n_gpu), opts, params, no_alloc=i % 2 == 0)
        with monkeypatch.context() as m:
            m.setattr(CI, "handed_codes", lambda g: None)
            walked = _replace_and_record(model, _devices(n_gpu), opts, params, no_alloc=i % 2 == 0)
        assert [r.layers is None for r in walked] == [True] * len(walked)
        for a, b in zip(on_layers, walked, strict=True):
            assert a.g is not b.g
            if a.layers is not None:
                assert _canonical(a) == _canonical(b), opts
                compared += 1
    assert compared >= 2


def _fit(model: Model, n_gpu: int, params: ContextParams, free: int) -> tuple[F.FitResult, list[object]]:
    """The --fit search from a fresh start (no reference, kept graph or layer codes of an earlier one),
    with every dry run's projection."""
    CI._REFS.clear()
    CI._SEEN.clear()
    TPL._TEMPLATES.clear()
    TPL._HANDED.clear()
    devices = _devices(n_gpu)
    seen: list[object] = []

    def measure(po: PlacementOptions, cp: ContextParams) -> F.Measured:
        m = F.device_memory(model, devices, po, cp)
        seen.append((po, cp, m))
        return m

    opts = PlacementOptions(n_gpu_layers=model.summary.n_layer + 1)
    result = F.fit_params(model, devices, opts, params, free_bytes=[free] * n_gpu, measure=measure)
    return result, seen


FITS = [("DeepSeek-V3", 4, 24), ("Qwen3-235B-A22B-Q4_K_M", 3, 24), ("gpt-oss-120b-MXFP4", 2, 16),
        ("Llama-3.1-70B-Q4_K_M", 3, 16)]


@pytest.mark.parametrize(("name", "n_gpu", "free_gib"), FITS)
def test_fit_jumping_equals_fit_walking(big: dict[str, Model], name: str, n_gpu: int,
                                         free_gib: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The search's result (-ngl, -ts, -ot, context, log) and every dry run's projected bytes are the
    same whether its references were recorded with jumps or node by node."""
    model = big[name]
    params = _params(c=32768, ub=512, np_=4)
    jumps = stats["rec_jumps"]
    with_jumps = _fit(model, n_gpu, params, free_gib * GIB)
    assert stats["rec_jumps"] > jumps
    monkeypatch.setattr(CI, "handed_codes", lambda g: None)
    jumps = stats["rec_jumps"]
    plain = _fit(model, n_gpu, params, free_gib * GIB)
    assert stats["rec_jumps"] == jumps
    assert dataclasses.asdict(with_jumps[0]) == dataclasses.asdict(plain[0])
    assert with_jumps[1] == plain[1]
    assert with_jumps[0].measurements >= 10
