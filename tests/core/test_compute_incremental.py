"""The incremental paths against computing from scratch, on random placements.

Every case asks ``simulate(..., incremental=True)`` (replayed against a recorded reference of the same
graph) and ``simulate(...)`` (built, scheduled and allocated from scratch) and wants the same reserves:
bytes per backend, peak labels, copied-input bytes, node and split counts; and ``weight_buffers``
(corrected from a recorded reference placement) equal to ``weight_buffers_full``, and
``Plan.placement`` (which touches only the moved tensors' items) equal to a walk over every item.
"""

from __future__ import annotations

import bisect
import dataclasses
import random
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from offload_planner.cli import demo_model_path
from offload_planner.core import compute as C
from offload_planner.core import memory as M
from offload_planner.core.compute import incremental as CI
from offload_planner.core.compute import replay_alloc as RA
from offload_planner.core.compute.allocator import GraphAllocator
from offload_planner.core.compute.graph import Shape
from offload_planner.core.compute.recording import Reference
from offload_planner.core.devices import Device, DeviceKind, DeviceSet, prefix_of
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import ContextParams, ResolvedContext, resolve_context
from offload_planner.core.model import Model
from offload_planner.core.placement import Override, Placed, Placement, PlacementOptions, device_buft
from offload_planner.core.plan import Plan, _dedupe_tied_copy
from offload_planner.core.synth import BIG_MODELS, write_model


@pytest.fixture(autouse=True)
def _no_replay_errors() -> Iterator[None]:
    """A replay that raises anything but a refusal falls back to a full run (the user never sees it):
    here every such fallback is a failure, not a slow pass."""
    from offload_planner.core.compute.stats import stats

    before = stats["replay_errors"]
    yield
    assert stats["replay_errors"] == before, "a replay raised (hidden by a full run)"

GIB = 1 << 30


def _devices(kind: str, n: int) -> DeviceSet:
    k = DeviceKind(kind)
    gpus = tuple(Device(f"{prefix_of(k)}{i}", k, 24 * GIB, 24 * GIB) for i in range(n))
    return DeviceSet(Device("CPU", DeviceKind.CPU, 512 * GIB, 480 * GIB), gpus)


def _fields(sim: C.Simulation | None) -> list[tuple[object, ...]]:
    assert sim is not None
    return [(r.n_tokens, r.sizes, r.peaks, r.copies_bytes, r.weight_copies_bytes, r.n_nodes, r.n_splits)
            for r in sim.reserves]


def _placement_by_walk(plan: Plan) -> Placement:
    """``Plan.placement`` as a walk over every item of the base (what it did before it went by moves)."""
    base = plan.base_placement()
    if not plan.moves:
        return base
    items: list[Placed] = []
    moved = False
    for p in base.items:
        dev = plan.moves.get(p.tensor.name)
        if dev is None or p.device is None or dev == p.device:
            items.append(p)
            continue
        moved = True
        buft = device_buft(dev, p.tensor, plan.devices, plan.placement_options, as_output=p.copy)
        items.append(Placed(p.tensor, dev, buft, "moved in the planner", copy=p.copy))
    items = _dedupe_tied_copy(items)
    return dataclasses.replace(base, items=items, has_overrides=base.has_overrides or moved)


def _check_random_moves(model: Model, devices: DeviceSet, params: ContextParams, *, seed: int, n: int,
                        ngls: list[int], ot: tuple[Override, ...] = (), expert_bias: float = 0.5) -> int:
    """Random -ngl bases with random moves of layer tensors (now and then of a tensor outside the layers:
    token embedding, output); returns how many reserves were replayed.  Checks the placement and the
    weight buffers too."""
    rng = random.Random(seed)
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    names = [d.name for d in (devices.cpu, *devices.gpus)]
    n_trunk = model.summary.n_layer_trunk
    layer_tensors = [t for t in model.tensors if t.layer is not None and t.layer < n_trunk]
    other_tensors = [t for t in model.tensors if t.layer is None]
    experts = [t for t in layer_tensors if t.role.is_routed_expert]
    before = CI.stats["replays"]
    delta_before = M.weight_stats["delta"]
    for _ in range(n):
        opts = PlacementOptions(n_gpu_layers=rng.choice(ngls), overrides=ot)
        plan = Plan(model, devices, opts, params)
        moves: dict[str, str] = {}
        for _ in range(rng.randint(1, 3)):
            if experts and rng.random() < expert_bias:
                il = rng.choice(experts).layer
                dev = rng.choice(names)
                moves.update({t.name: dev for t in experts if t.layer == il})
            elif other_tensors and rng.random() < 0.15:
                moves[rng.choice(other_tensors).name] = rng.choice(names)
            else:
                moves[rng.choice(layer_tensors).name] = rng.choice(names)
        moved = plan.with_moves(moves)
        placement = moved.placement()
        walked = _placement_by_walk(moved)
        assert placement.items == walked.items and placement.has_overrides == walked.has_overrides
        # weights: the base recorded (or corrected from an earlier reference), then the move corrected
        base = plan.base_placement()
        for pl in (base, placement):
            assert M.weight_buffers(model, pl, devices) == M.weight_buffers_full(model, pl, devices), moves
        fast = C.simulate(model, devices, placement, ctx, params, incremental=True)
        full = C.simulate(model, devices, placement, ctx, params)
        assert _fields(fast) == _fields(full), (opts.n_gpu_layers, moves)
    assert M.weight_stats["delta"] > delta_before  # the corrected path was taken, not only the full one
    return CI.stats["replays"] - before


def _params(c: int = 4096, ub: int = 512, fa: bool = True, nkvo: bool = False, np_: int = 4) -> ContextParams:
    return ContextParams(n_ctx=c, n_batch=2048, n_ubatch=ub, n_seq_max=np_, kv_unified=True, flash_attn=fa,
                         type_k="f16", type_v="f16", offload_kqv=not nkvo, swa_full=False,
                         n_outputs_max=min(2048, np_))


@pytest.fixture(scope="module")
def models(small_models: dict[str, Path]) -> dict[str, Model]:
    return {name: open_model(path) for name, path in small_models.items()}


SMALL_CASES = [
    ("qwen3moe", "CUDA", 2, {}), ("qwen3moe", "RPC", 2, {"fa": False}), ("deepseek2", "CUDA", 2, {}),
    ("deepseek2", "RPC", 1, {"ub": 16}), ("glm4moe", "CUDA", 2, {}), ("gpt-oss", "CUDA", 2, {"ub": 64}),
    ("gemma3", "RPC", 2, {}), ("llama", "CUDA", 1, {"fa": False}), ("qwen3moe", "CUDA", 1, {"nkvo": True}),
    # Metal: mmap'd weights in MTL<i>_Mapped spans, corrected per device and shard like CPU_Mapped
    ("qwen3moe", "Metal", 2, {}), ("llama", "Metal", 1, {}),
    # gated-delta-net hybrids: recurrent-state caches beside the KV cache, layers in periods of 4
    ("qwen3next", "CUDA", 2, {}), ("qwen35moe", "RPC", 2, {"fa": False}),
    ("qwen35", "CUDA", 1, {"nkvo": True}),
    # qwen4exp: hyper-connection streams, the QSA indexer cache and its k-pool inputs
    ("qwen4exp", "RPC", 2, {}), ("qwen4exp", "CUDA", 1, {"fa": False}), ("qwen4exp-ple", "CUDA", 2, {}),
]


@pytest.mark.parametrize(("name", "kind", "n_gpu", "ctx"), SMALL_CASES,
                         ids=[f"{m}-{k}x{n}-{c}" for m, k, n, c in SMALL_CASES])
def test_small_models_random_moves(models: dict[str, Model], name: str, kind: str, n_gpu: int,
                                   ctx: dict[str, object]) -> None:
    model = models[name]
    n_units = model.summary.n_layer + 1
    replays = _check_random_moves(model, _devices(kind, n_gpu), _params(**ctx),  # type: ignore[arg-type]
                                  seed=zlib.crc32(name.encode()), n=25,
                                  ngls=[n_units, n_units - 1, max(1, n_units // 2), 0])
    assert replays > 0  # the fast path was taken, not only its fallback


def test_replay_drops_the_reference_copies_its_first_split_no_longer_makes(models: dict[str, Model]) -> None:
    """A move that cuts a reference split before the node that needed its only input: Qwen3-Next with
    -nkvo gathers a delta-net layer's state on the host and copies it to the GPU at the start of the
    split that ends at ``GATED_DELTA_NET``; ``ssm_dt`` on the host cuts that split at the decay gate,
    and the state's copy moves to the split after the cut.  The replay's window then starts with the
    reference's nodes (no copies left to make there), and its use counts must still drop the
    reference's copy of the state (counted twice, the host kept the layer's state rows alive: 172288
    bytes against 106752 for the one-token graph)."""
    model = models["qwen3next"]
    devices, params = _devices("RPC", 2), _params(nkvo=True)
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    plan = Plan(model, devices, PlacementOptions(n_gpu_layers=model.summary.n_layer + 1), params)
    for _ in range(2):  # the second records the reference
        C.simulate(model, devices, plan.placement(), ctx, params, incremental=True)
    placement = plan.with_moves({"blk.5.ssm_dt.bias": "CPU"}).placement()
    before = CI.stats["replays"]
    fast = C.simulate(model, devices, placement, ctx, params, incremental=True)
    full = C.simulate(model, devices, placement, ctx, params)
    assert CI.stats["replays"] - before == 2
    assert _fields(fast) == _fields(full)


def test_small_model_with_expert_override(models: dict[str, Model]) -> None:
    model = models["qwen3moe"]
    n_units = model.summary.n_layer + 1
    replays = _check_random_moves(model, _devices("CUDA", 2), _params(), seed=7, n=30, ngls=[n_units],
                                  ot=(Override("exps", "CPU"),), expert_bias=0.8)
    assert replays > 0


def test_deepseek_v3_header_expert_moves() -> None:
    """The benchmark's setting: DeepSeek-V3, experts overridden to the host, moved layer by layer."""
    model = open_model(demo_model_path())
    n_units = model.summary.n_layer + 1
    params = _params(c=32768, ub=2048, np_=1)
    ngls = [n_units, n_units - 20]
    before = dict(CI.stats)
    replays = _check_random_moves(model, _devices("CUDA", 2), params, seed=3, n=12, ngls=ngls,
                                  ot=(Override("exps", "CPU"),), expert_bias=0.7)
    assert replays >= 12
    # the fast paths were taken: changes found by item identity, windows starting inside a split
    for k in ("item_diffs", "late_start"):
        assert CI.stats[k] > before[k], k


def test_compute_buffers_replayed_equal_full() -> None:
    """The buffers (sizes and explanations) of the planner's entry point, replayed and from scratch."""
    model = open_model(demo_model_path())
    devices = _devices("CUDA", 2)
    params = _params(c=8192, ub=512, np_=1)
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    opts = PlacementOptions(n_gpu_layers=model.summary.n_layer + 1, overrides=(Override("exps", "CPU"),))
    plan = Plan(model, devices, opts, params)
    exps = [t for t in model.tensors if t.role.is_routed_expert]
    for il in (3, 17, 40, 60):
        placement = plan.with_moves({t.name: "CUDA1" for t in exps if t.layer == il}).placement()
        fast = C.simulate_buffers(model, devices, placement, ctx, params)
        sim = C.simulate(model, devices, placement, ctx, params)
        assert sim is not None
        sh = C.reserve_shapes(model, ctx, params, C.full_offload(placement))[0]
        want = [(be.name, size, C.explain(sim, i, sh, placement.output_device))
                for i, (be, size) in enumerate(zip(sim.backends, sim.sizes, strict=True)) if size > 1]
        assert [(b.device, b.bytes, b.why) for b in fast] == want


@pytest.fixture(scope="module")
def big_headers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Model]:
    """The catalogue's shapes where moves used to be replayed up to the next device boundary."""
    root = tmp_path_factory.mktemp("big_headers")
    names = ("Qwen3-235B-A22B-Q4_K_M", "gpt-oss-120b-MXFP4", "Llama-3.1-70B-Q4_K_M", "Qwen3-30B-A3B-Q4_K_M")
    return {n: open_model(write_model(BIG_MODELS[n], root / f"{n}.header.gguf", header_only=True)[0])
            for n in names}


def _bench_setting(model: Model) -> tuple[DeviceSet, ContextParams, ResolvedContext, PlacementOptions]:
    """bench/replan_speed.py's base plan: two GPUs, -c 32768 -ub 2048, the routed experts (MoE) or
    the token embedding (dense) overridden to the host."""
    devices = _devices("CUDA", 2)
    params = _params(c=32768, ub=2048, np_=1)
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    moe = any(t.role.is_routed_expert for t in model.tensors)
    opts = PlacementOptions(n_gpu_layers=model.summary.n_layer + 1,
                            overrides=(Override("exps" if moe else "token_embd", "CPU"),))
    return devices, params, ctx, opts


def _check_layer_moves(model: Model, layers: list[int], *, to_gpu: bool = False) -> None:
    """The bench's setting (two GPUs, -ub 2048, experts or the token embedding overridden to the
    host): each of ``layers`` moved alone (its experts to the other GPU (MoE), the whole layer to the
    CPU (dense) or, ``to_gpu``, to the other GPU), replayed against the base plan's reference and
    simulated from scratch: equal reserves, peak labels included."""
    devices, params, ctx, opts = _bench_setting(model)
    moe = any(t.role.is_routed_expert for t in model.tensors)
    plan = Plan(model, devices, opts, params)
    for _ in range(2):  # the second simulation of a topology records the reference
        C.simulate(model, devices, plan.placement(), ctx, params, incremental=True)
    before = CI.stats["replays"]
    for il in layers:
        names = [t.name for t in model.tensors if t.layer == il and (t.role.is_routed_expert or not moe)]
        other = "CUDA1" if plan.placement().layer_device(il) == "CUDA0" else "CUDA0"
        placement = plan.with_moves(dict.fromkeys(names, other if moe or to_gpu else "CPU")).placement()
        fast = C.simulate(model, devices, placement, ctx, params, incremental=True)
        full = C.simulate(model, devices, placement, ctx, params)
        assert _fields(fast) == _fields(full), il
    assert CI.stats["replays"] - before == 2 * len(layers)


@pytest.mark.parametrize("name", ["Qwen3-235B-A22B-Q4_K_M", "gpt-oss-120b-MXFP4", "Llama-3.1-70B-Q4_K_M"])
def test_big_header_moves_in_every_part_of_the_graph(big_headers: dict[str, Model], name: str) -> None:
    """Early layers included: the allocator's state after such a move differs from the reference's
    until the next device boundary (the residual stream in the other of two blocks), so the tail is
    replayed from the reference's per-backend events."""
    model = big_headers[name]
    n_layer = model.summary.n_layer
    rng = random.Random(zlib.crc32(name.encode()))
    before = dict(CI.stats)
    _check_layer_moves(model, [0, 1, 2, n_layer // 2 - 1, n_layer // 2 + 1, n_layer - 1,
                               *rng.sample(range(n_layer), 3)])
    assert CI.stats["tails"] > before["tails"]
    # whole periods of equal layers jumped where the state repeated after one; on the dense model some
    # first periods left another state (walked on, and equal all the same)
    assert CI.stats["period_jumps"] > before["period_jumps"]
    if name.startswith("Llama"):
        assert CI.stats["period_misses"] > before["period_misses"]


@pytest.mark.parametrize("name", ["Llama-3.1-70B-Q4_K_M", "Qwen3-30B-A3B-Q4_K_M", "gpt-oss-120b-MXFP4"])
def test_big_header_every_layer_moved(big_headers: dict[str, Model], name: str) -> None:
    """Every layer of the bench's models moved in turn (what the bench times), replayed equal to
    from scratch.  On the dense model a layer of the second GPU moved to the CPU takes the copy of
    ``out_ids`` off that GPU's split, whose copies come first: the split's unchanged nodes before
    the moved layer take the reference's allocator events (``skips``) instead of a walk.  On the MoE
    models a move leaves the residual stream in the other of two blocks up to the next device
    boundary; the next move's tail meets the states the previous one passed and takes their maxima
    from the reference's memo: equal to from scratch all the same."""
    model = big_headers[name]
    before = dict(CI.stats)
    _check_layer_moves(model, list(range(model.summary.n_layer)))
    if name.startswith("Llama"):
        assert CI.stats["skips"] > before["skips"]
    else:  # the tails of later moves met states an earlier move's tail passed (and took its maximum)
        assert CI.stats["tail_hits"] > before["tail_hits"]
    # whole periods of equal layers were jumped (in the tails, and in the dense model's stretches)
    assert CI.stats["period_jumps"] > before["period_jumps"]


def test_window_counts_from_the_shorter_side(big_headers: dict[str, Model],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The allocator replay's remaining counts after a skipped stretch (and after a start moved back
    or cut) come from the whole window's counts less the part before: on the dense model's second-GPU
    moves (a short part before the stretch, a long one after it) every such count equals the window
    counted again from that point on, and the replays equal from scratch."""
    model = big_headers["Llama-3.1-70B-Q4_K_M"]
    diff_from = RA._AllocReplay._diff_from

    def checked(self: RA._AllocReplay, j: int, r: int) -> dict[object, int]:
        got = diff_from(self, j, r)
        want = self._diff(j, r)
        assert {t: v for t, v in got.items() if v} == {t: v for t, v in want.items() if v}
        return got

    monkeypatch.setattr(RA._AllocReplay, "_diff_from", checked)
    # the start moved back (where no backend's state is patched instead: ``_patches_for``'s fallback)
    monkeypatch.setattr(RA._AllocReplay, "_patches_for", lambda self, late: False)
    before = dict(CI.stats)
    n_layer = model.summary.n_layer
    _check_layer_moves(model, [n_layer // 2 + 1, n_layer - 7, n_layer - 1])
    assert CI.stats["diff_shortcuts"] > before["diff_shortcuts"]
    assert CI.stats["moved_back"] > before["moved_back"]


@pytest.mark.parametrize("name", ["llama", "qwen3moe", "deepseek2", "glm4moe", "gpt-oss", "gemma3"])
@pytest.mark.parametrize("to_gpu", [False, True])
def test_small_model_every_layer_moved(models: dict[str, Model], name: str, to_gpu: bool) -> None:
    model = models[name]
    _check_layer_moves(model, list(range(model.summary.n_layer)), to_gpu=to_gpu)


def test_one_shot_simulation_records_no_reference(models: dict[str, Model]) -> None:
    """A topology simulated once (a one-shot ``plan``) runs plainly; the second time (a caller that
    comes back) records the reference the third replays against; a window records at once."""
    model = models["qwen3moe"]
    devices = _devices("CUDA", 2)
    params = _params(c=2048)
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    opts = PlacementOptions(n_gpu_layers=model.summary.n_layer + 1, overrides=(Override("exps", "CPU"),))
    plan = Plan(model, devices, opts, params)
    CI._REFS.clear()
    CI._SEEN.clear()
    counts = []
    for _ in range(3):
        before = dict(CI.stats)
        C.simulate(model, devices, plan.placement(), ctx, params, incremental=True)
        counts.append(tuple(CI.stats[k] - before[k] for k in ("plain", "full", "replays")))
        assert sum(map(len, CI._REFS.values())) == (0 if len(counts) == 1 else 2)
    assert counts == [(2, 0, 0), (0, 2, 0), (0, 0, 2)]  # two reserved graphs each: prompt, one token
    CI._REFS.clear()
    CI._SEEN.clear()
    CI.record_at_first_sight()
    try:
        C.simulate(model, devices, plan.placement(), ctx, params, incremental=True)
        assert sum(map(len, CI._REFS.values())) == 2
    finally:
        CI.record_at_first_sight(False)
    # the --fit search's bisection steps: recorded at once inside, as before after
    CI._REFS.clear()
    CI._SEEN.clear()
    with CI.recording_first_sights():
        C.simulate(model, devices, plan.placement(), ctx, params, incremental=True)
    assert sum(map(len, CI._REFS.values())) == 2
    other = Plan(model, devices, PlacementOptions(n_gpu_layers=1), params).placement()
    C.simulate(model, devices, other, ctx, params, incremental=True)
    assert sum(map(len, CI._REFS.values())) == 2  # another topology, seen once: not recorded


@pytest.mark.parametrize("name", ["DeepSeek-V3", "Qwen3-235B-A22B-Q4_K_M"])
def test_fit_dry_runs_replayed_equal_full(big_headers: dict[str, Model], name: str) -> None:
    """The --fit search over four 24 GiB GPUs (about 25 dry runs that move layers between devices and
    experts to the host): every dry run's reserve (replayed against the nearest recorded dry run, or
    run on the graph kept from an earlier one) equals the dry run from scratch."""
    from offload_planner.core import fit as F
    from offload_planner.core.placement import place

    model = open_model(demo_model_path()) if name == "DeepSeek-V3" else big_headers[name]
    devices = _devices("CUDA", 4)
    params = _params(c=32768, ub=512, np_=4)
    opts = PlacementOptions(n_gpu_layers=model.summary.n_layer + 1)
    before = dict(CI.stats)
    checked: list[PlacementOptions] = []

    def measure(po: PlacementOptions, cp: ContextParams) -> F.Measured:
        placement = place(model, devices, dataclasses.replace(po, use_mmap=False))
        c = resolve_context(cp, model.summary.n_ctx_train, model.summary.n_swa)
        fast = C.simulate(model, devices, placement, c, cp, no_alloc=True, incremental=True)
        full = C.simulate(model, devices, placement, c, cp, no_alloc=True)
        assert _fields(fast) == _fields(full), (po.n_gpu_layers, po.tensor_split, len(po.overrides))
        checked.append(po)
        return F.device_memory(model, devices, po, cp)

    result = F.fit_params(model, devices, opts, params, free_bytes=[24 * GIB] * 4, measure=measure)
    assert result.status == F.SUCCESS and len(checked) >= 20
    assert CI.stats["replays"] - before["replays"] >= 10
    # the dry runs far from every reference ran on the graph kept from an earlier one, and the step that
    # gives the last GPU all its layers with their experts (most of the graph) ran in full, not replayed
    assert CI.stats["graph_reuses"] - before["graph_reuses"] >= 5
    assert CI.stats["far"] - before["far"] >= 1


def _segments(ref: Reference, b: int) -> list[list[tuple[int, int, int]]]:
    """Backend ``b``'s allocator events between the reference's layer starts, as (kind, size, new
    size): what the allocator is asked, without the tensors."""
    bounds = ref.periods.bounds
    out: list[list[tuple[int, int, int]]] = [[] for _ in bounds]
    for ev, pos in zip(ref.tail[b], ref.tail_pos[b], strict=True):
        k = bisect.bisect_right(bounds, pos) - 1
        if k >= 0:
            out[k].append((ev[0], ev[3], ev[4]))
    return out


def _reference(model: Model) -> Reference:
    """The bench's setting recorded: two GPUs, -ub 2048, experts (or the token embedding) on the host;
    the prompt graph's reference."""
    devices, params, ctx, opts = _bench_setting(model)
    CI._REFS.clear()
    CI.record_at_first_sight()
    try:
        placement = Plan(model, devices, opts, params).placement()
        C.simulate(model, devices, placement, ctx, params, incremental=True)
    finally:
        CI.record_at_first_sight(False)
    refs = [r for rs in CI._REFS.values() for r in rs]
    return max(refs, key=lambda r: r.sh.n_tokens)


def test_periods_are_runs_of_equal_layers(big_headers: dict[str, Model]) -> None:
    """The runs a tail may jump: on every backend, each layer of a run asks the allocator what the
    layer one period later asks (the same kinds and sizes, in the same order).  Qwen3-30B-A3B's
    Q4_K_M file gives every third layer's ``ffn_down_exps`` more bits (a bigger copy to the GPU):
    runs of period 3 there, period 1 on the first layers, where every layer has the same types."""
    model = big_headers["Qwen3-30B-A3B-Q4_K_M"]
    ref = _reference(model)
    per = ref.periods
    assert len(per.bounds) == model.summary.n_layer
    down = [next(t.type for t in model.tensors if t.layer == il and t.name.endswith("ffn_down_exps.weight"))
            for il in range(model.summary.n_layer)]
    periods_seen = set()
    for b in range(len(ref.backends)):
        segs = _segments(ref, b)
        for k, (p, end) in per.runs[b].items():
            assert end >= k + 2 * p and end < len(per.bounds)
            for j in range(k, end - p):
                assert segs[j] == segs[j + p], (b, k, p, j)
            if b == 0:  # the first GPU: its events copy the host's experts in
                periods_seen.add(p)
                assert all(down[j] == down[j + p] for j in range(k, end - p))
    assert {1, 3} <= periods_seen
    assert len(set(down)) == 2


def test_periods_stop_where_layers_differ() -> None:
    """DeepSeek-V3's first three layers are dense, the rest MoE: on the first GPU (which runs them)
    no run crosses from one to the other, and moves there (each tail starting in the dense layers
    and walking into the MoE ones) replay equal to from scratch."""
    model = open_model(demo_model_path())
    n_dense = model.summary.n_layer_dense_lead
    assert n_dense == 3
    ref = _reference(model)
    b = next(i for i, be in enumerate(ref.backends) if be.name == "CUDA0")
    assert ref.periods.runs[b]
    for k, (_, end) in ref.periods.runs[b].items():
        assert end <= n_dense or k >= n_dense, (k, end)
    _check_layer_moves(model, [0, 1, 2, 3, 4])


@pytest.mark.parametrize("name", ["Qwen3-30B-A3B-Q4_K_M", "Llama-3.1-70B-Q4_K_M", "gpt-oss-120b-MXFP4"])
def test_big_header_several_layers_moved_with_period_jumps(big_headers: dict[str, Model], name: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Two or three layers (their experts on MoE models) moved at once to the other GPU or the host:
    tails and stretches jump periods between and after the moved layers, and the replay equals the
    simulation from scratch.  The memo of earlier tails' states is off (a tail meeting one stops
    before it jumps)."""
    monkeypatch.setattr(RA, "_MEMO_STRIDE", 1 << 30)
    model = big_headers[name]
    n = model.summary.n_layer
    devices = _devices("CUDA", 2)
    params = _params(c=32768, ub=2048, np_=1)
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    moe = any(t.role.is_routed_expert for t in model.tensors)
    opts = PlacementOptions(n_gpu_layers=n + 1, overrides=(Override("exps" if moe else "token_embd", "CPU"),))
    plan = Plan(model, devices, opts, params)
    for _ in range(2):  # the second simulation of a topology records the reference
        C.simulate(model, devices, plan.placement(), ctx, params, incremental=True)
    before = dict(CI.stats)
    groups = [(0, 5), (1, n // 4), (3, n // 2 + 2), (n // 2 + 1, n - 3), (2, 9, n // 2 + 5),
              (n // 4, n // 4 + 1)]
    for group in groups:
        moves: dict[str, str] = {}
        for k, il in enumerate(group):
            other = "CUDA1" if plan.placement().layer_device(il) == "CUDA0" else "CUDA0"
            to = other if moe or k % 2 else "CPU"
            moves.update({t.name: to for t in model.tensors
                          if t.layer == il and (t.role.is_routed_expert or not moe)})
        placement = plan.with_moves(moves).placement()
        fast = C.simulate(model, devices, placement, ctx, params, incremental=True)
        full = C.simulate(model, devices, placement, ctx, params)
        assert _fields(fast) == _fields(full), group
    assert CI.stats["replays"] - before["replays"] == 2 * len(groups)
    assert CI.stats["period_jumps"] > before["period_jumps"]
    assert CI.stats["tail_hits"] == before["tail_hits"]


TEMPLATE_CASES = [("qwen3moe", "CUDA", 2, {}), ("deepseek2", "CUDA", 2, {"ub": 16}),
                  ("glm4moe", "RPC", 2, {}), ("gpt-oss", "CUDA", 1, {"fa": False}),
                  ("gemma3", "CUDA", 2, {"nkvo": True}), ("llama", "RPC", 1, {}),
                  ("qwen3next", "RPC", 2, {}), ("qwen35moe", "CUDA", 2, {"ub": 16}),
                  ("qwen4exp", "CUDA", 2, {}), ("qwen4exp-ple", "RPC", 2, {"ub": 16})]


@pytest.mark.parametrize(("name", "kind", "n_gpu", "ctx"), TEMPLATE_CASES,
                         ids=[f"{m}-{k}x{n}-{c}" for m, k, n, c in TEMPLATE_CASES])
def test_graph_re_placed_equals_graph_built(models: dict[str, Model], name: str, kind: str, n_gpu: int,
                                            ctx: dict[str, object]) -> None:
    """A simulation that records no reference keeps its graph for the next one (``compute.template``:
    the --fit search's placements far from every reference): re-placed for random -ngl/-ts/-ot
    placements, pipeline-parallel ones (4 copies of the inputs) and dry runs between them, every
    reserve equals one built from scratch, field by field."""
    from offload_planner.core.placement import place

    model = models[name]
    devices = _devices(kind, n_gpu)
    params = _params(**ctx)  # type: ignore[arg-type]
    c = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    rng = random.Random(zlib.crc32(f"template-{name}".encode()))
    n_units = model.summary.n_layer + 1
    before = CI.stats["graph_reuses"]
    for i in range(12):
        ot = rng.choice([(), (Override("exps", "CPU"),), (Override(r"blk\.1\.", "CPU"),)])
        ts = tuple(float(rng.randint(0, 3)) for _ in range(n_gpu)) if n_gpu > 1 and rng.random() < 0.5 else ()
        opts = PlacementOptions(n_gpu_layers=rng.choice([n_units, n_units - 1, n_units // 2, 0]),
                                tensor_split=ts if any(ts) else (), overrides=ot)
        placement = place(model, devices, opts)
        no_alloc = i % 3 == 1
        CI._SEEN.clear()  # a first sight each time: the plain path, on the kept graph
        fast = C.simulate(model, devices, placement, c, params, no_alloc=no_alloc, incremental=True)
        full = C.simulate(model, devices, placement, c, params, no_alloc=no_alloc)
        assert _fields(fast) == _fields(full), (opts, no_alloc)
    assert CI.stats["graph_reuses"] - before >= 8


def _check_sizes_only(model: Model, devices: DeviceSet, params: ContextParams,
                      placements: list[Placement]) -> tuple[int, int]:
    """``simulate(..., sizes_only=True)`` (the planner's entry point) against the full simulation on
    each placement: the same sizes and prompt reserve; where the one-token reserve was left out, the
    full one is at most the prompt reserve on every backend, else it is there and equal.  Returns how
    many were left out and how many replayed."""
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    left_out = replayed = 0
    for placement in placements:
        before = dict(CI.stats)
        fast = C.simulate(model, devices, placement, ctx, params, incremental=True, sizes_only=True)
        full = C.simulate(model, devices, placement, ctx, params)
        assert fast is not None and full is not None
        assert fast.sizes == full.sizes and _fields(fast)[0] == _fields(full)[0]
        if CI.stats["left_out"] > before["left_out"]:
            left_out += 1
            assert len(fast.reserves) == 1
            assert all(t <= p for t, p in zip(full.reserves[1].sizes, full.reserves[0].sizes, strict=True))
        else:
            assert _fields(fast) == _fields(full)
            replayed += CI.stats["replays"] - before["replays"] == 2
    return left_out, replayed


@pytest.mark.parametrize("name", ["Llama-3.1-70B-Q4_K_M", "gpt-oss-120b-MXFP4"])
def test_one_token_reserve_left_out_where_it_decides_nothing(big_headers: dict[str, Model],
                                                             name: str) -> None:
    """The bench's moves through the planner's entry point: the one-token graph's tensors are a few
    rows each, so its bound stays under the prompt reserve on every backend and its replay is left
    out; sizes, peaks and copies are the full simulation's."""
    model = big_headers[name]
    devices = _devices("CUDA", 2)
    params = _params(c=32768, ub=2048, np_=1)
    moe = any(t.role.is_routed_expert for t in model.tensors)
    opts = PlacementOptions(n_gpu_layers=model.summary.n_layer + 1,
                            overrides=(Override("exps" if moe else "token_embd", "CPU"),))
    plan = Plan(model, devices, opts, params)
    placements = [plan.placement()] * 2  # the second simulation records the reference
    for il in (0, 7, model.summary.n_layer // 2 + 3, model.summary.n_layer - 1):
        names = [t.name for t in model.tensors if t.layer == il and (t.role.is_routed_expert or not moe)]
        other = "CUDA1" if plan.placement().layer_device(il) == "CUDA0" else "CUDA0"
        placements.append(plan.with_moves(dict.fromkeys(names, other if moe else "CPU")).placement())
    left_out, _ = _check_sizes_only(model, devices, params, placements)
    assert left_out == 4


def test_one_token_reserve_replayed_where_the_bound_does_not_prove_it(models: dict[str, Model]) -> None:
    """With one-token ubatches the prompt graph is the one-token graph: no bound can put one under the
    other, so both are replayed (and equal the full simulation); random moves over -ngl, with the
    default ubatch, leave it out where the bound holds."""
    model = models["qwen3moe"]
    devices = _devices("CUDA", 2)
    n_units = model.summary.n_layer + 1
    rng = random.Random(11)
    names = [d.name for d in (devices.cpu, *devices.gpus)]
    layer_tensors = [t.name for t in model.tensors if t.layer is not None]
    for ub in (1, 512):
        params = _params(ub=ub, np_=1)
        plans = [Plan(model, devices, PlacementOptions(n_gpu_layers=ngl), params)
                 for ngl in (n_units, n_units // 2)]
        placements = []
        for plan in plans:
            placements += [plan.placement()] * 2
            placements += [plan.with_moves({rng.choice(layer_tensors): rng.choice(names)}).placement()
                           for _ in range(6)]
        left_out, replayed = _check_sizes_only(model, devices, params, placements)
        if ub == 1:
            assert left_out == 0 and replayed > 0
        else:
            assert left_out > 0


def _first_sight_refs(model: Model, devices: DeviceSet, plan: Plan, ctx: ResolvedContext,
                      params: ContextParams) -> list[Reference]:
    """The references one incremental simulation of ``plan``'s placement records on first sight (the
    recorded ones cleared before)."""
    CI._REFS.clear()
    with CI.recording_first_sights():
        C.simulate(model, devices, plan.placement(), ctx, params, incremental=True)
    return [r for rs in CI._REFS.values() for r in rs]


def _layer_moves(model: Model) -> tuple[DeviceSet, ContextParams, list[Placement]]:
    """The bench's setting (``_bench_setting``) and its moves on a small model: the starting placement
    twice (the second simulation records the reference), then per layer its routed experts to the other
    GPU (a MoE model) or its tensors to the CPU (a dense one)."""
    devices, params, _, opts = _bench_setting(model)
    moe = any(t.role.is_routed_expert for t in model.tensors)
    plan = Plan(model, devices, opts, params)
    placements = [plan.placement()] * 2  # the second simulation records the reference
    for il in range(model.summary.n_layer):
        names = [t.name for t in model.tensors if t.layer == il and (t.role.is_routed_expert or not moe)]
        other = "CUDA1" if plan.placement().layer_device(il) == "CUDA0" else "CUDA0"
        if names:  # (a leading dense layer of a MoE model has no experts)
            placements.append(plan.with_moves(dict.fromkeys(names, other if moe else "CPU")).placement())
    return devices, params, placements


@pytest.mark.parametrize("name", ["llama", "qwen3moe", "deepseek2", "glm4moe", "gpt-oss", "gemma3"])
def test_one_token_reserve_left_out_before_pass_5(models: dict[str, Model], name: str) -> None:
    """The bench's moves on the small models through the planner's entry point: the one-token
    reserve is left out by a bound after passes 1-4 (``_Replay.early_bound``), and sizes, peaks and
    copies are the full simulation's."""
    devices, params, placements = _layer_moves(model := models[name])
    before = CI.stats["left_out_early"]
    left_out, _ = _check_sizes_only(model, devices, params, placements)
    assert left_out == len(placements) - 2 >= 2
    assert CI.stats["left_out_early"] - before == left_out


def _two_gpu_refs(model: Model, *, ub: int) -> tuple[DeviceSet, ContextParams, Plan, list[Reference]]:
    """Two CUDA GPUs holding every layer, the token embedding on the CPU (an override: no pipeline
    parallelism, which is not replayed), ``-ub ub -np 1``: the devices, the context, the plan and the
    two references (prompt and one token) its first sight records."""
    devices = _devices("CUDA", 2)
    params = _params(ub=ub, np_=1)
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    opts = PlacementOptions(n_gpu_layers=model.summary.n_layer + 1,
                            overrides=(Override("token_embd", "CPU"),))
    plan = Plan(model, devices, opts, params)
    refs = _first_sight_refs(model, devices, plan, ctx, params)
    assert len(refs) == 2
    return devices, params, plan, refs


def _scratch_bound(model: Model, devices: DeviceSet, placement: Placement, sh: Shape) -> list[int]:
    """The allocator bound (:mod:`.bound`) of the graph of shape ``sh`` scheduled from scratch for
    ``placement``, per backend."""
    from offload_planner.core.compute.bound import graph_bound
    from offload_planner.core.compute.graph import Builder
    from offload_planner.core.compute.scheduler import Scheduler
    from offload_planner.core.compute.simulate import backends_for, graph_builder, weight_factory

    arch = graph_builder(model)
    assert arch is not None
    b = Builder(sh, weight_factory(model, placement), placement.layer_device, placement.layer_device)
    arch(b)
    backends = backends_for(devices, placement)
    sched = Scheduler(backends, 1, True)
    sched.split_graph(b.g, keep_forced=True)
    return graph_bound(GraphAllocator(backends), sched.nodes, sched.node_ids, sched.leafs)


def test_early_bound_holds_the_new_graph_and_its_copies(models: dict[str, Model]) -> None:
    """After passes 1-4, on random moves of a few tensors between the CPU and two GPUs (prompt and
    one-token graphs): ``_Replay.new_copies`` holds every split-input copy that pass 5 then adds and
    the reference did not, and ``_Replay.early_bound`` is at least the bound (:mod:`.bound`) of the
    graph scheduled from scratch for the new placement on every backend; some moves add copies."""
    from offload_planner.core.compute.replay import _Replay, diff_items

    model = models["qwen3moe"]
    devices, params, plan, refs = _two_gpu_refs(model, ub=512)
    rng = random.Random(5)
    layer_tensors = [t.name for t in model.tensors if t.layer is not None]
    names = [d.name for d in (devices.cpu, *devices.gpus)]
    with_new = 0
    for _ in range(40):
        placement = plan.with_moves({rng.choice(layer_tensors): rng.choice(names)
                                     for _ in range(rng.randint(1, 3))}).placement()
        for ref in refs:
            mv = diff_items(ref, placement.items, list(placement.unit_devices), params.offload_kqv)
            assert mv is not None
            if not mv.dev and not mv.forced:
                continue
            rp = _Replay(ref, mv)
            rp.assign()
            affected = rp.affected()
            if not affected:
                continue
            expected, early = rp.new_copies(affected), rp.early_bound(affected)
            rp.pass5(min(affected), max(affected))
            made = {key for key in rp.made if key not in ref.copy_of}
            assert made <= expected
            with_new += bool(made)
            full = _scratch_bound(model, devices, placement, ref.sh)
            assert all(e >= f for e, f in zip(early, full, strict=True)), (early, full)
    assert with_new > 5


@pytest.mark.parametrize("name", ["DeepSeek-V3", "gpt-oss-120b-MXFP4"])
def test_checkpoints_hold_the_state_a_plain_walk_has_there(big_headers: dict[str, Model], name: str) -> None:
    """Every checkpoint of a recorded reference (the recording keeps the free blocks, maxima and peak
    lists of the checkpoint before while its allocator has not changed) holds what a plain allocator
    walk over the same scheduled graph has at that position: free blocks, maxima, peak labels, layer,
    and the live tensors with their offsets and counts."""
    model = open_model(demo_model_path()) if name == "DeepSeek-V3" else big_headers[name]
    ref = _reference(model)
    nodes, ids = ref.sched_nodes, ref.sched_ids
    walk = GraphAllocator(ref.backends)
    walk.count(nodes, ids, ref.sched.leafs, ref.sched.leaf_ids)
    tensors = [*ref.sched.leafs, *nodes]
    checked = 0
    for pos, (n, bid) in enumerate(zip(nodes, ids, strict=True)):
        ck = ref.cks.get(pos)
        if ck is not None:
            assert ck.blocks == [a.blocks for a in walk.allocs], pos
            assert ck.max_size == [a.max_size for a in walk.allocs], pos
            assert (ck.peaks, ck.layer) == (walk.peaks, walk.layer), pos
            live = {t: (t.alloc, t.n_children, t.n_views) for t in tensors
                    if id(t) in walk.own and (t.n_children or t.n_views)}
            assert ck.live == live, pos
            checked += 1
        walk.step(n, bid)
    assert checked == len(ref.ckpos) > 100
    assert [a.max_size for a in walk.allocs] == ref.sizes and walk.peaks == ref.peaks


@pytest.fixture(scope="module")
def catalogue(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Model]:
    """Every model the catalogue writes (``core.synth.all_models``: the small ones and the big ones),
    header only: the shapes the bench (``bench/replan_speed.py``) moves layers of."""
    from offload_planner.core.synth import all_models

    root = tmp_path_factory.mktemp("catalogue")
    return {n: open_model(write_model(spec, root / f"{n}.header.gguf", header_only=True)[0])
            for n, spec in all_models().items()}


def _catalogue_names() -> list[str]:
    """The catalogue's models whose graph is simulated (the others are left to the estimate: nothing
    to replay)."""
    from offload_planner.core.compute.archs import ARCH_GRAPHS
    from offload_planner.core.synth import all_models

    # glm5-next: simulated only where its fused mHC ops resolve as enabled (archs_glm5_next.glm5_simulated),
    # so a random move to the CPU leaves it to the estimate: nothing to replay
    return [n for n, spec in all_models().items() if spec.arch in ARCH_GRAPHS and spec.arch != "glm5-next"]


@pytest.mark.parametrize("name", _catalogue_names())
def test_catalogue_random_moves_replayed_equal_full(catalogue: dict[str, Model], name: str) -> None:
    """Every catalogue model in the bench's setting (two GPUs, -c 32768 -ub 2048, experts or the
    token embedding on the host), its base plan recorded as a window records it, then random moves
    replayed against it: one layer's experts, whole layer, or a single tensor of one or two layers
    to a random device (the CPU or either GPU), one move after another as a window's edits go on
    (each from the base plan: the tails the earlier ones left stay on the reference).  Each replayed
    reserve equals the from-scratch simulation's: bytes, peak labels, copies, nodes and splits."""
    model = catalogue[name]
    devices, params, ctx, opts = _bench_setting(model)
    plan = Plan(model, devices, opts, params)
    C.simulate(model, devices, plan.placement(), ctx, params, incremental=True)  # records the reference
    C.simulate(model, devices, plan.placement(), ctx, params, incremental=True)
    rng = random.Random(zlib.crc32(name.encode()))
    n_layer = model.summary.n_layer
    before = CI.stats["replays"]
    n_moves = 12 if n_layer <= 8 else 6
    for _ in range(n_moves):
        moves = _random_moves(model, rng, whole_layer_below=0.7)
        placement = plan.with_moves(moves).placement()
        fast = C.simulate(model, devices, placement, ctx, params, incremental=True)
        full = C.simulate(model, devices, placement, ctx, params)
        assert _fields(fast) == _fields(full), moves
    assert CI.stats["replays"] - before >= n_moves  # replayed, not simulated again in full


@pytest.mark.parametrize("name", ["qwen3moe", "gpt-oss", "gemma3", "deepseek2"])
def test_any_placement_bound_holds_every_placement(models: dict[str, Model], name: str) -> None:
    """``Reference.any_bound`` (the one-token graph's bound under any placement that builds the graph,
    with which ``below_any_placement`` leaves its replay out before passes 1-4) is at least the bound
    (:mod:`.bound`) of the graph scheduled from scratch for random placements: whole layers, experts,
    single tensors (norms, KV readers' layers) moved between the CPU and two GPUs, with and without
    -nkvo.  Some placements copy a KV cache view, which the bound counts only for readers pass 1
    does not pin, so leaving those out of it would fail here."""
    from offload_planner.core.compute.bound import graph_bound
    from offload_planner.core.compute.graph import Builder
    from offload_planner.core.compute.scheduler import Scheduler
    from offload_planner.core.compute.simulate import backends_for, graph_builder, weight_factory

    model = models[name]
    devices = _devices("CUDA", 2)
    arch = graph_builder(model)
    assert arch is not None
    rng = random.Random(zlib.crc32(name.encode()))
    names = [d.name for d in (devices.cpu, *devices.gpus)]
    by_layer: dict[int, list[str]] = {}
    for t in model.tensors:
        if t.layer is not None:
            by_layer.setdefault(t.layer, []).append(t.name)
    n_units = model.summary.n_layer + 1
    located_copies = 0
    for nkvo in (False, True):
        params = _params(ub=512, np_=1, nkvo=nkvo)
        ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
        opts = PlacementOptions(n_gpu_layers=n_units, overrides=(Override("token_embd", "CPU"),))
        plan = Plan(model, devices, opts, params)
        refs = _first_sight_refs(model, devices, plan, ctx, params)
        assert len(refs) == 2
        for _ in range(25):
            moves: dict[str, str] = {}
            for il in rng.sample(sorted(by_layer), rng.choice((1, 2))):
                picked = by_layer[il] if rng.random() < 0.5 else [rng.choice(by_layer[il])]
                moves.update(dict.fromkeys(picked, rng.choice(names)))
            placement = plan.with_moves(moves).placement()
            backends = backends_for(devices, placement)
            for ref in refs:
                b = Builder(ref.sh, weight_factory(model, placement), placement.layer_device,
                            placement.layer_device if not nkvo else (lambda il: "CPU"))
                arch(b)
                sched = Scheduler(backends, 1, True)
                sched.split_graph(b.g, keep_forced=True)
                located_copies += sum(1 for sp in sched.splits for inp in sp.inputs
                                      if inp.location is not None and not inp.weights)
                full = graph_bound(GraphAllocator(backends), sched.nodes, sched.node_ids, sched.leafs)
                assert all(a >= f for a, f in zip(ref.any_bound(), full, strict=True)), (moves, nkvo)
    assert located_copies > 0  # some placements copy a KV cache view: the bound must hold them


@pytest.mark.parametrize("name", ["llama", "qwen3moe", "glm4moe", "gpt-oss", "gemma3"])
def test_one_token_reserve_left_out_whatever_the_move(models: dict[str, Model], name: str) -> None:
    """The bench's moves on the small models: the one-token reserve is left out by the bound of any
    placement (``Reference.below_any_placement``), before passes 1-4, on every move; sizes, peaks and
    copies are the full simulation's (the one-token reserve at most the prompt reserve everywhere)."""
    devices, params, placements = _layer_moves(model := models[name])
    before = CI.stats["left_out_any"]
    left_out, _ = _check_sizes_only(model, devices, params, placements)
    assert left_out == len(placements) - 2 >= 2
    assert CI.stats["left_out_any"] - before == left_out


@pytest.mark.parametrize(("name", "layers"), [("llama", [3]), ("gemma3", [4, 5]), ("llama-draft", [1])])
def test_start_kept_where_one_backend_is_patched(catalogue: dict[str, Model], name: str,
                                                 layers: list[int]) -> None:
    """The bench's dense moves of a second-GPU layer to the CPU: its ROPEs, offloaded to the first GPU,
    read that GPU's copy of ``inp_pos`` again after the reference freed it, and the host's ``inp_pos``
    is no longer copied at the second GPU's split (this run frees it early).  The replay's start is not
    moved back before those uses (to the first layers): the one backend each lives on is patched from
    the reference's events (``_AllocReplay._patches_for``).  Each patched backend holds at the start
    what a plain allocator walk of the moved placement's graph holds there (free blocks, maximum, peak
    label, live tensors' offsets), and the reserves equal from scratch."""
    model = catalogue[name]
    devices, params, _, opts = _bench_setting(model)
    plan = Plan(model, devices, opts, params)
    init = RA._AllocReplay.__init__
    for il in layers:
        starts: list[tuple[RA._AllocReplay, tuple[object, ...]]] = []

        def kept(self: RA._AllocReplay, *args: Any, starts: list[Any] = starts) -> None:
            init(self, *args)
            if self.patches:  # the state at the start (the walk changes it)
                starts.append((self, _state(self, self.patches)))

        before = dict(CI.stats)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(RA._AllocReplay, "__init__", kept)
            _check_layer_moves(model, [il])
        # (the prompt graph's replay; the one-token graph's too)
        assert CI.stats["patched_back"] - before["patched_back"] == len(starts) >= 1
        assert CI.stats["moved_back"] == before["moved_back"]
        names = [t.name for t in model.tensors if t.layer == il]
        placement = plan.with_moves(dict.fromkeys(names, "CPU")).placement()
        for rp, state in starts:
            assert state == _state(_walk_to(model, placement, rp.ref.sh, rp.wa), rp.patches), il


@pytest.mark.parametrize("name", ["gpt-oss", "llama-draft"])
def test_patched_starts_on_random_moves(catalogue: dict[str, Model], name: str) -> None:
    """Random moves in the bench's setting (whole layers or single tensors to any device, one or two
    layers): every replay start whose backends were patched holds what a plain walk of the moved graph
    holds there, and the reserves equal from scratch."""
    model = catalogue[name]
    devices, params, ctx, opts = _bench_setting(model)
    plan = Plan(model, devices, opts, params)
    for _ in range(2):
        C.simulate(model, devices, plan.placement(), ctx, params, incremental=True)
    by_layer: dict[int, list[str]] = {}
    for t in model.tensors:
        if t.layer is not None:
            by_layer.setdefault(t.layer, []).append(t.name)
    rng = random.Random(zlib.crc32(name.encode()) + 1)
    init = RA._AllocReplay.__init__
    starts: list[tuple[RA._AllocReplay, tuple[object, ...]]] = []

    def kept(self: RA._AllocReplay, *args: Any) -> None:
        init(self, *args)
        if self.patches:
            starts.append((self, _state(self, self.patches)))

    checked = 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RA._AllocReplay, "__init__", kept)
        for _ in range(24):
            moves: dict[str, str] = {}
            for il in rng.sample(sorted(by_layer), min(len(by_layer), rng.choice((1, 1, 2)))):
                picked = by_layer[il] if rng.random() < 0.6 else [rng.choice(by_layer[il])]
                moves.update(dict.fromkeys(picked, rng.choice(("CPU", "CUDA0", "CUDA1"))))
            placement = plan.with_moves(moves).placement()
            starts.clear()
            fast = C.simulate(model, devices, placement, ctx, params, incremental=True)
            assert _fields(fast) == _fields(C.simulate(model, devices, placement, ctx, params)), moves
            for rp, state in starts:
                assert state == _state(_walk_to(model, placement, rp.ref.sh, rp.wa), rp.patches), moves
                checked += 1
    assert checked >= 3


def _state(a: RA._AllocReplay | GraphAllocator, backends: Iterable[int]) -> tuple[object, ...]:
    """Free blocks, maximum, peak label and live tensors (name, offset) of an allocator replay or walk on
    ``backends``."""
    out: list[object] = []
    for b in backends:
        if isinstance(a, RA._AllocReplay):
            live = sorted((t.name, off) for t, (tb, off) in a.own.items() if tb == b and (a.NC(t) or a.NV(t)))
        else:
            live = sorted((t.name, t.alloc[1]) for t in a.live  # type: ignore[attr-defined]
                          if t.alloc is not None and t.alloc[0] == b)
        out.append(([list(x) for x in a.allocs[b].blocks], a.allocs[b].max_size, a.peaks[b], live))
    return tuple(out)


def _walk_to(model: Model, placement: Placement, sh: Shape, pos: int) -> GraphAllocator:
    """A plain allocator walk of ``placement``'s scheduled graph of shape ``sh`` up to position ``pos``
    in the bench's setting (its live tensors kept on it as ``live``)."""
    from offload_planner.core.compute.graph import Builder
    from offload_planner.core.compute.scheduler import Scheduler
    from offload_planner.core.compute.simulate import backends_for, graph_builder, weight_factory

    arch = graph_builder(model)
    assert arch is not None
    b = Builder(sh, weight_factory(model, placement), placement.layer_device, placement.layer_device)
    arch(b)
    backends = backends_for(_bench_setting(model)[0], placement)
    sched = Scheduler(backends, 1, True)
    sched.split_graph(b.g, keep_forced=True)
    walk = GraphAllocator(backends)
    walk.count(sched.nodes, sched.node_ids, sched.leafs, sched.leaf_ids)
    for n, bid in zip(sched.nodes[:pos], sched.node_ids[:pos], strict=True):
        walk.step(n, bid)
    walk.live = [t for t in [*sched.leafs, *sched.nodes]  # type: ignore[attr-defined]
                 if id(t) in walk.own and (t.n_children or t.n_views)]
    return walk


def _small_catalogue_names() -> list[str]:
    return [n for n in _catalogue_names() if n not in BIG_MODELS]


@pytest.mark.parametrize("name", _small_catalogue_names())
def test_replay_starts_hold_the_plain_walks_state(catalogue: dict[str, Model], name: str) -> None:
    """Every small catalogue model in the bench's setting, random moves (one layer's experts, the whole
    layer or one tensor, of one or two layers, to the CPU or either GPU): at every replay's start (the
    reference's checkpoint with the counts the window changes, patched backends patched) each backend
    holds what a plain allocator walk of the moved graph holds there: free blocks, maximum, peak label,
    and every live tensor with its offset and its uses and views to come.  A count wrong at the start
    can heal before the end (the reserves stay right), so the reserves' equality alone would not show it."""
    model = catalogue[name]
    devices, params, ctx, opts = _bench_setting(model)
    plan = Plan(model, devices, opts, params)
    for _ in range(2):
        C.simulate(model, devices, plan.placement(), ctx, params, incremental=True)
    rng = random.Random(zlib.crc32(name.encode()) + 2)
    init = RA._AllocReplay.__init__
    starts: list[tuple[RA._AllocReplay, tuple[object, ...]]] = []

    def kept(self: RA._AllocReplay, *args: Any) -> None:
        init(self, *args)
        starts.append((self, _counted_state(self, range(len(self.allocs)))))

    checked = 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RA._AllocReplay, "__init__", kept)
        for _ in range(10):
            moves = _random_moves(model, rng, whole_layer_below=0.75)
            placement = plan.with_moves(moves).placement()
            starts.clear()
            fast = C.simulate(model, devices, placement, ctx, params, incremental=True)
            assert _fields(fast) == _fields(C.simulate(model, devices, placement, ctx, params)), moves
            for rp, state in starts:
                walk = _walk_to(model, placement, rp.ref.sh, rp.wa)
                want = _counted_state(walk, range(len(walk.allocs)))
                assert state == want, (moves, rp.ref.sh.n_tokens, rp.wa)
                checked += 1
    assert checked >= 5



def _random_moves(model: Model, rng: random.Random, *, whole_layer_below: float) -> dict[str, str]:
    """Moves of one or two random trunk layers to CPU, CUDA0 or CUDA1: a layer's routed experts
    (draw below 0.4, where it has them), the whole layer (below ``whole_layer_below``) or one tensor."""
    by_layer: dict[int, list[str]] = {}
    for t in model.tensors:
        if t.layer is not None and t.layer < model.summary.n_layer:
            by_layer.setdefault(t.layer, []).append(t.name)
    experts = {t.name for t in model.tensors if t.role.is_routed_expert}
    moves: dict[str, str] = {}
    for il in rng.sample(sorted(by_layer), min(len(by_layer), rng.choice((1, 1, 2)))):
        names = by_layer[il]
        kind = rng.random()
        picked = ([n for n in names if n in experts] if kind < 0.4 and experts & set(names)
                  else names if kind < whole_layer_below else [rng.choice(names)])
        moves.update(dict.fromkeys(picked, rng.choice(("CPU", "CUDA0", "CUDA1"))))
    return moves

def _counted_state(a: RA._AllocReplay | GraphAllocator, backends: Iterable[int]) -> tuple[object, ...]:
    """``_state`` with each live tensor's uses and views to come (an allocator replay's from the
    reference's uses corrected by the window, a plain walk's from its own counts)."""
    out: list[object] = []
    for b in backends:
        if isinstance(a, RA._AllocReplay):
            live = sorted((t.name, off, a.r_new(t), a.v_new(t)) for t, (tb, off) in a.own.items()
                          if tb == b and (a.r_new(t) or a.v_new(t)))
        else:
            live = sorted((t.name, t.alloc[1], t.n_children, t.n_views) for t in a.live  # type: ignore[attr-defined]
                          if t.alloc is not None and t.alloc[0] == b)
        out.append(([list(x) for x in a.allocs[b].blocks], a.allocs[b].max_size, a.peaks[b], live))
    return tuple(out)
