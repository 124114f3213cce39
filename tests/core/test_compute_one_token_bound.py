"""A plain (from-scratch) simulation that wants sizes only leaves out the one-token reserve where a bound
of it (:mod:`offload_planner.core.compute.bound`: the sum, else on the host the lifetimes', from the
scheduled graph, before the allocator's walk) is at most the prompt reserve on every backend;
everything else is the full simulation's.

Real GGUF files from the synth writer; each case is simulated both ways: sizes, and the prompt reserve's
peaks, copies and counts, are the full simulation's; where the one-token reserve is left out, the full
simulation's one-token reserve is at most the prompt reserve on every backend.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from offload_planner.cli import demo_model_path
from offload_planner.core import compute as C
from offload_planner.core.compute.bound import graph_bound, lifetime_bound
from offload_planner.core.compute.ggml import F32, INPUT, T
from offload_planner.core.compute.graph import Builder
from offload_planner.core.compute.scheduler import N_COPIES_PIPELINE, Backend
from offload_planner.core.compute.simulate import (
    full_offload,
    graph_builder,
    pipeline_parallel,
    reserve_shapes,
    weight_factory,
)
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import ContextParams, resolve_context
from offload_planner.core.model import Model
from offload_planner.core.placement import Override, PlacementOptions
from offload_planner.core.plan import Plan

GIB = 1 << 30


def _devices(kind: str, n: int) -> DeviceSet:
    gpus = tuple(Device(f"{kind}{i}", DeviceKind(kind), 24 * GIB, 24 * GIB) for i in range(n))
    return DeviceSet(Device("CPU", DeviceKind.CPU, 512 * GIB, 480 * GIB), gpus)


def _params(ub: int, fa: bool, np_: int) -> ContextParams:
    return ContextParams(n_ctx=4096, n_batch=2048, n_ubatch=ub, n_seq_max=np_, kv_unified=True, flash_attn=fa,
                         type_k="f16", type_v="f16", offload_kqv=True, swa_full=False,
                         n_outputs_max=min(2048, np_))


def _fields(r: C.Reserve) -> tuple[object, ...]:
    return (r.n_tokens, r.sizes, r.peaks, r.copies_bytes, r.weight_copies_bytes, r.n_nodes, r.n_splits)


@pytest.fixture(scope="module")
def models(small_models: dict[str, Path]) -> dict[str, Model]:
    return {name: open_model(path) for name, path in small_models.items()}


def _both(model: Model, devices: DeviceSet, opts: PlacementOptions, params: ContextParams) -> bool:
    """The sizes-only plain simulation against the full one; whether it left the one-token reserve out."""
    placement = Plan(model, devices, opts, params).placement()
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    fast = C.simulate(model, devices, placement, ctx, params, sizes_only=True)
    full = C.simulate(model, devices, placement, ctx, params)
    assert fast is not None and full is not None
    assert fast.sizes == full.sizes
    assert _fields(fast.reserves[0]) == _fields(full.reserves[0])
    if len(fast.reserves) == 1:
        pp, tg = full.reserves
        assert all(t <= p for t, p in zip(tg.sizes, pp.sizes, strict=True))
        return True
    assert [_fields(r) for r in fast.reserves] == [_fields(r) for r in full.reserves]
    return False


@pytest.mark.parametrize("name", ["llama", "qwen3moe", "deepseek2", "glm4moe", "gpt-oss", "gemma3"])
def test_one_token_reserve_left_out_where_the_bound_holds(models: dict[str, Model], name: str) -> None:
    """Over -ngl (all, half, none), -ot exps=CPU, flash attention on and off, -np 1 and 4, one and two
    GPUs (two: pipeline parallelism without overrides), the default -ub: left out somewhere, and
    everything else equal to the full simulation."""
    model = models[name]
    n_units = model.summary.n_layer + 1
    moe = any(t.role.is_routed_expert for t in model.tensors)
    left_out = 0
    for n_gpu, ngl, ot, fa, np_ in itertools.product((1, 2), (n_units, n_units // 2, 0), (False, True),
                                                      (True, False), (1, 4)):
        if ot and not moe:
            continue
        opts = PlacementOptions(n_gpu_layers=ngl, overrides=(Override("exps", "CPU"),) if ot else ())
        left_out += _both(model, _devices("CUDA", n_gpu), opts, _params(512, fa, np_))
    assert left_out > 0


@pytest.mark.parametrize("name", ["qwen3moe", "llama"])
def test_one_token_reserve_kept_where_the_prompt_graph_is_as_small(models: dict[str, Model],
                                                                   name: str) -> None:
    """With -ub 1 and -np 1 the prompt graph is the one-token graph: no bound puts it under itself, so
    both reserves are made, equal to the full simulation's."""
    model = models[name]
    n_units = model.summary.n_layer + 1
    for ngl in (n_units, n_units // 2, 0):
        assert not _both(model, _devices("CUDA", 2), PlacementOptions(n_gpu_layers=ngl), _params(1, True, 1))


@pytest.mark.parametrize("name", ["llama", "qwen3moe", "deepseek2", "gpt-oss", "gemma3", "deepseek2-mtp"])
def test_lifetime_bound_is_never_under_the_allocator(models: dict[str, Model], name: str) -> None:
    """:func:`~offload_planner.core.compute.bound.lifetime_bound` of both reserved graphs, over -ngl,
    -ot exps=CPU, flash attention, -np, -ub 512 and 1, one and two GPUs (pipeline parallelism: outputs
    never freed), is at least what the graph allocator reaches on every backend; and under it somewhere
    on the host, where layers' tensors die before the next layer's (else it proves nothing more than
    the sum)."""
    model = models[name]
    n_units = model.summary.n_layer + 1
    moe = any(t.role.is_routed_expert for t in model.tensors)
    tighter = 0
    for n_gpu, ngl, ot, fa, np_, ub in itertools.product((1, 2), (n_units, n_units // 2, 0), (False, True),
                                                          (True, False), (1, 4), (512, 1)):
        if ot and not moe:
            continue
        devices = _devices("CUDA", n_gpu)
        params = _params(ub, fa, np_)
        opts = PlacementOptions(n_gpu_layers=ngl, overrides=(Override("exps", "CPU"),) if ot else ())
        placement = Plan(model, devices, opts, params).placement()
        ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
        backends = C.backends_for(devices, placement)
        n_copies = N_COPIES_PIPELINE if pipeline_parallel(devices, placement, params) else 1
        for sh in reserve_shapes(model, ctx, params, full_offload(placement)):
            b = Builder(sh, weight_factory(model, placement), placement.layer_device, placement.layer_device)
            arch = graph_builder(model)
            assert arch is not None
            arch(b)
            sched = C.Scheduler(backends, n_copies)
            sched.split_graph(b.g)
            args = (sched.nodes, sched.node_ids, sched.leafs, sched.leaf_ids)
            bound = lifetime_bound(C.GraphAllocator(backends), *args)
            summed = graph_bound(C.GraphAllocator(backends), *args[:3])
            real = C.GraphAllocator(backends).run(*args)
            assert all(x >= y for x, y in zip(bound, real, strict=True)), (n_gpu, ngl, ot, fa, np_, ub)
            tighter += bound[-1] < summed[-1]
    assert tighter > 0


def test_deepseek_v3_one_token_reserve_left_out_by_lifetimes() -> None:
    """The README's plan of DeepSeek-V3 (two 24 GiB GPUs, -ot exps=CPU, -c 32768): the one-token graph's
    summed bound passes the host's prompt reserve (58 layers of expert outputs, ~101 against 88 MiB),
    its lifetimes' bound does not (each layer's die before the next: ~2 MiB), so it is left out; the
    sizes are the full simulation's."""
    model = open_model(demo_model_path())
    params = ContextParams(n_ctx=32768, n_batch=2048, n_ubatch=512, n_seq_max=4, kv_unified=True,
                           flash_attn=True, type_k="f16", type_v="f16", offload_kqv=True, swa_full=False,
                           n_outputs_max=4)
    opts = PlacementOptions(n_gpu_layers=model.summary.n_layer + 1, tensor_split=(1, 1),
                            overrides=(Override("exps", "CPU"),))
    assert _both(model, _devices("CUDA", 2), opts, params)


def test_lifetime_bound_keeps_a_block_its_views_still_read() -> None:
    """A tensor read through a view after its last direct reader stays allocated (ggml-alloc frees it
    when its views are done): a 1 MiB tensor allocated meanwhile goes above it, and the bound says so;
    one whose view is never read is never freed."""
    mib = 1 << 20
    backends = [Backend("CPU", "CPU", 32)]
    x = T(F32, [8], name="x")
    x.flags |= INPUT
    for read_later in (True, False):
        a = T(F32, [mib // 4], op="GET_ROWS", src=[x], name="a")
        v = T(F32, [16], op="VIEW", src=[a], view_src=a, name="v")
        c = T(F32, [mib // 4], op="GET_ROWS", src=[x], name="c")
        r = T(F32, [16], op="SCALE", src=[v if read_later else c], name="r")
        nodes = [a, v, c, r]
        args = (nodes, [0] * len(nodes), [x], [0])
        bound = lifetime_bound(C.GraphAllocator(backends), *args)
        real = C.GraphAllocator(backends).run(*args)
        assert real[0] >= 2 * mib
        assert bound[0] >= real[0]
