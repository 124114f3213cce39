"""A plain (from-scratch) simulation that wants sizes only leaves out the one-token reserve where a bound
of it (:func:`offload_planner.core.compute.bound.bound_below`, from the scheduled graph, before the
allocator's walk) is at most the prompt reserve on every backend; everything else is the full
simulation's.

Real GGUF files from the synth writer; each case is simulated both ways: sizes, and the prompt reserve's
peaks, copies and counts, are the full simulation's; where the one-token reserve is left out, the full
simulation's one-token reserve is at most the prompt reserve on every backend.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from offload_planner.core import compute as C
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
