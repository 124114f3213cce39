"""The scheduler's passes over a kept graph taking equal layers' results from the first
(``compute.sched_layers``) against ``Scheduler.split_graph`` node by node, on the catalogue's big shapes.

Each case re-places one built graph (``compute.template``) and schedules it twice, node by node and
layer by layer, and wants the same schedule: every node's backend and sources (a split-input copy
named by its source and backend), the splits with their inputs, the scheduler's node and leaf lists
with their backends (the copies and the dependency nodes it makes described by what they are).  The
placements cover layer splits over 2-4 GPUs, -ngl below the layer count, routed experts of a range of
layers on the host (the --fit search's overflow patterns), and ones that break the layers' repetition:
an override of a single layer's tensor (the up experts, the attention output, a norm), uneven tensor
splits that put one layer alone on a GPU, the KV cache kept on the host; pipeline parallelism; the dry
run and the server's reserve (norms forced onto the layers' devices).  Each model must take most of its
layers from an earlier one (the test fails if the layer path silently never does), and the reserves
through ``simulate`` on the kept graph equal the ones from scratch.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import replace

import pytest
from tests.support.fit_placements import BIG_NAMES, big_models, random_fit_opts

from offload_planner.core import compute as C
from offload_planner.core.compute import incremental as CI
from offload_planner.core.compute.ggml import Graph, T
from offload_planner.core.compute.graph import Shape
from offload_planner.core.compute.jumps import layer_codes
from offload_planner.core.compute.sched_layers import LayerRefs, LayerScheduler, layer_refs
from offload_planner.core.compute.scheduler import N_COPIES_PIPELINE, Scheduler
from offload_planner.core.compute.simulate import (
    backends_for,
    full_offload,
    graph_builder,
    pipeline_parallel,
    reserve_shapes,
    weight_factory,
    weight_where,
)
from offload_planner.core.compute.stats import stats
from offload_planner.core.compute.template import GraphTemplate
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.fit import PATTERN_MOE_ALL
from offload_planner.core.memory import ContextParams, resolve_context
from offload_planner.core.model import Model
from offload_planner.core.placement import Override, PlacementOptions, place

GIB = 1 << 30
NAMES = BIG_NAMES


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Model]:
    return big_models(tmp_path_factory.mktemp("sched_headers"))


def _params(c: int, ub: int, offload_kqv: bool = True) -> ContextParams:
    return ContextParams(n_ctx=c, n_batch=2048, n_ubatch=ub, n_seq_max=1, kv_unified=True, flash_attn=True,
                         type_k="f16", type_v="f16", offload_kqv=offload_kqv, swa_full=False, n_outputs_max=1)


def _breakers(model: Model, n_gpu: int) -> list[PlacementOptions]:
    """Placements whose layers stop repeating somewhere: one layer's tensor elsewhere, one layer alone on
    a GPU, all experts on the host but one layer's."""
    n = model.summary.n_layer
    moe = any(t.role.is_routed_expert for t in model.tensors)
    mid = n // 2
    one = (Override(rf"blk\.{mid}\.ffn_up_exps\.weight", "CPU") if moe
           else Override(rf"blk\.{mid}\.ffn_up\.weight", "CPU"))
    split = tuple(float(x) for x in [1, n - 2, 1, 1][:n_gpu])
    out = [PlacementOptions(n_gpu_layers=n + 1, overrides=(one,)),
           PlacementOptions(n_gpu_layers=n + 1, overrides=(Override(rf"blk\.{mid + 1}\.attn_output\.weight",
                                                                      "CPU"),)),
           PlacementOptions(n_gpu_layers=n + 1,
                            overrides=(Override(rf"blk\.{mid}\.attn_norm\.weight", "CPU"),)),
           PlacementOptions(n_gpu_layers=n + 1, tensor_split=split),
           PlacementOptions(n_gpu_layers=n - 3, tensor_split=split, overrides=(one,))]
    if moe:
        out.append(PlacementOptions(n_gpu_layers=n + 1, overrides=(
            Override(rf"blk\.{mid}\.ffn_(up|down|gate)_exps\.weight", f"CUDA{n_gpu - 1}"),
            Override(PATTERN_MOE_ALL, "CPU"))))
    return out


def _describe(sched: Scheduler, g: Graph) -> list[object]:
    """The schedule, with the tensors the scheduler made named by what they are."""
    in_graph = {id(t): k for k, t in enumerate(g.leafs + g.nodes)}
    copy_of = {id(c): (sid, b, k) for (sid, b), cs in sched.copies.items() for k, c in enumerate(cs)}

    def ref(t: T | None) -> object:
        if t is None:
            return None
        if id(t) in in_graph:
            return in_graph[id(t)]
        if id(t) in copy_of:
            sid, b, k = copy_of[id(t)]
            return ("copy", in_graph[sid], b, k, t.name, t.flags, tuple(t.ne), tuple(t.nb))
        return ("made", t.op, t.name, ref(t.view_src), tuple(ref(s) for s in t.src))

    return [[(n.bid, tuple(ref(s) for s in n.src)) for n in g.nodes],
            [t.bid for t in g.leafs],
            [(sp.backend, sp.i_start, sp.i_end, tuple(map(ref, sp.inputs))) for sp in sched.splits],
            [ref(t) for t in sched.nodes], sched.node_ids, [ref(t) for t in sched.leafs], sched.leaf_ids]


def _check(model: Model, devices: DeviceSet, opts: PlacementOptions, params: ContextParams,
           kept: dict[tuple[object, ...], tuple[GraphTemplate, LayerRefs]], no_alloc: bool) -> int:
    """Both schedules of the placement's prompt graph on the graph kept for its shape; returns the layers
    the layer path took from an earlier one."""
    placement = place(model, devices, opts)
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    sh: Shape = reserve_shapes(model, ctx, params, full_offload(placement))[0]
    arch_fn = graph_builder(model)
    assert arch_fn is not None
    full_sh = replace(sh, full_offload=True)
    where = weight_where(placement)

    def kv_dev(il: int) -> str:
        return placement.layer_device(il) if params.offload_kqv else "CPU"

    key = (full_sh, frozenset(where))
    if key not in kept:
        tpl = GraphTemplate(full_sh, arch_fn, weight_factory(model, placement, where), placement.layer_device,
                            kv_dev)
        g = tpl.g
        codes = layer_codes(g.nodes, tpl.src, tpl.flags[len(g.leafs):], g.leafs)
        kept[key] = (tpl, layer_refs(g, codes))
    tpl, refs = kept[key]
    backends = backends_for(devices, placement)
    n_copies = N_COPIES_PIPELINE if pipeline_parallel(devices, placement, params) else 1
    g = tpl.placed(sh, where, placement.layer_device, kv_dev)
    plain = Scheduler(backends, n_copies)
    plain.split_graph(g, keep_forced=not no_alloc)
    want = _describe(plain, g)
    g = tpl.placed(sh, where, placement.layer_device, kv_dev)
    before = stats["sched_layers"]
    layered = LayerScheduler(backends, n_copies, True, refs)
    layered.split_graph(g, keep_forced=not no_alloc)
    assert _describe(layered, g) == want, (opts, no_alloc)
    return stats["sched_layers"] - before


@pytest.mark.parametrize("name", NAMES)
def test_layer_by_layer_schedule_equals_node_by_node(big: dict[str, Model], name: str) -> None:
    model = big[name]
    rng = random.Random(zlib.crc32(f"sched-{name}".encode()))
    kept: dict[tuple[object, ...], tuple[GraphTemplate, LayerRefs]] = {}
    params = _params(c=rng.choice([4096, 32768]), ub=rng.choice([512, 2048]))
    n_layer = model.summary.n_layer
    cases: list[tuple[int, PlacementOptions, ContextParams]] = []
    for _ in range(8):
        n_gpu = rng.choice([2, 3, 4])
        cases.append((n_gpu, random_fit_opts(rng, model, n_gpu), params))
    cases += [(4, o, params) for o in _breakers(model, 4)]
    cases.append((3, random_fit_opts(rng, model, 3), replace(params, offload_kqv=False)))
    # a layer whose every tensor is on the first GPU, its cache on the host: only the norms the server
    # forces onto its layer's device (the last GPU's) tell it from the first GPU's layers
    cases.append((4, PlacementOptions(n_gpu_layers=n_layer + 1, overrides=(
        Override(rf"blk\.{n_layer - 2}\.", "CUDA0"),)), replace(params, offload_kqv=False)))
    for i, (n_gpu, opts, p) in enumerate(cases):
        gpus = tuple(Device(f"CUDA{k}", DeviceKind.CUDA, 24 * GIB, 24 * GIB) for k in range(n_gpu))
        devices = DeviceSet(Device("CPU", DeviceKind.CPU, 512 * GIB, 480 * GIB), gpus)
        for no_alloc in (True, False) if i >= 8 else (i % 2 == 0,):
            taken = _check(model, devices, opts, p, kept, no_alloc=no_alloc)
            # every pass (pass 1, four sweeps, pass 5) takes most layers from an earlier one
            assert taken >= 6 * n_layer // 2, (opts, taken)


def _reserves(sim: C.Simulation) -> list[tuple[object, ...]]:
    return [(r.sizes, r.peaks, r.copies_bytes, r.weight_copies_bytes, r.n_nodes, r.n_splits)
            for r in sim.reserves]


@pytest.mark.parametrize("name", ["DeepSeek-V3", "gpt-oss-120b-MXFP4"])
def test_kept_graph_reserves_equal_from_scratch(big: dict[str, Model], name: str) -> None:
    """Through ``simulate`` on the kept graph (the --fit search's dry runs far from every reference):
    the placements that break the repetition reserve what the graph built for them does."""
    model = big[name]
    gpus = tuple(Device(f"CUDA{k}", DeviceKind.CUDA, 24 * GIB, 24 * GIB) for k in range(4))
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 512 * GIB, 480 * GIB), gpus)
    params = _params(c=32768, ub=512)
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    before = stats["sched_layers"]
    for i, opts in enumerate([*_breakers(model, 4), *_breakers(model, 4)]):
        placement = place(model, devices, opts)
        CI._SEEN.clear()  # a first sight each time: the plain path, on the kept graph
        kept = C.simulate(model, devices, placement, ctx, params, no_alloc=i % 2 == 0, incremental=True)
        full = C.simulate(model, devices, placement, ctx, params, no_alloc=i % 2 == 0)
        assert kept is not None and full is not None
        assert _reserves(kept) == _reserves(full), opts
    assert stats["sched_layers"] - before >= 6 * model.summary.n_layer
