"""From the planner's model and placement to the reserves llama.cpp makes (``sched_reserve``),
from scratch or replayed (:mod:`offload_planner.core.compute.incremental`); the estimate for
architectures without a graph here."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from offload_planner.core.compute.allocator import shares_allocators
from offload_planner.core.compute.archs import ARCH_GRAPHS
from offload_planner.core.compute.archs_glm5_next import GLM5_GATHER_UBATCH, glm5_simulated
from offload_planner.core.compute.ggml import CPU, T
from offload_planner.core.compute.graph import Builder, Shape, WeightWhere, make_shape, per_layer
from offload_planner.core.compute.incremental import incremental_reserve
from offload_planner.core.compute.reserve import Reserve, reserve, reserve_below, reserve_graph
from offload_planner.core.compute.scheduler import (
    ASYNC_EVENTS,
    CUDA_LIKE,
    N_COPIES_PIPELINE,
    OP_OFFLOAD_MIN_BATCH,
    OP_OFFLOAD_ONLY,
    Backend,
)
from offload_planner.core.compute.template import placed_graph

if TYPE_CHECKING:
    from offload_planner.core.devices import Device, DeviceSet
    from offload_planner.core.memory import ContextParams, ResolvedContext
    from offload_planner.core.model import Model
    from offload_planner.core.placement import Placement


# --- from the planner's model to the simulation ------------------------------------------------------


def model_gpus(devices: DeviceSet, placement: Placement) -> list[Device]:
    """llama.cpp's device list for the model, in its order: every GPU, the ones ``-dev`` selects (in
    its order), or only the main GPU with ``-sm none``.

    ``Placement`` may name them (``model_devices``); otherwise all of ``devices.gpus`` are used."""
    names = getattr(placement, "model_devices", None)
    if names is None:
        return list(devices.gpus)
    by_name = {g.name: g for g in devices.gpus}
    return [by_name[n] for n in names if n in by_name]


def backends_for(devices: DeviceSet, placement: Placement) -> list[Backend]:
    """The scheduler's backends: the model's GPUs, then the CPU; the same objects for the same devices
    (every projection asks; their hashes are kept: the references are looked up by them)."""
    names = getattr(placement, "model_devices", None)
    key = (devices, None if names is None else tuple(names))
    got = _BACKENDS.get(key)
    if got is None:
        got = tuple(_backends_for(devices, placement))
        if len(_BACKENDS) < _BACKENDS_SIZE:  # (never evicted: a window meets a few device sets)
            _BACKENDS[key] = got
    return list(got)


_BACKENDS: dict[tuple[DeviceSet, tuple[str, ...] | None], tuple[Backend, ...]] = {}
_BACKENDS_SIZE = 256


def _backends_for(devices: DeviceSet, placement: Placement) -> list[Backend]:
    gpus = model_gpus(devices, placement)
    out = [Backend(g.name, g.name, g.alignment, g.kind in CUDA_LIKE, OP_OFFLOAD_MIN_BATCH.get(g.kind),
                   OP_OFFLOAD_ONLY.get(g.kind)) for g in gpus]
    # the CPU backend allocates from the host buffer type of the model's first device
    host = gpus[0].host_buffer_name if gpus else None
    out.append(Backend(CPU, host or CPU, devices.cpu.alignment))
    return out




def weight_where(placement: Placement) -> WeightWhere:
    """Shape, type and device of every loaded weight by the name the graph asks for."""
    where: WeightWhere = {}
    for p in placement.items:
        if p.device is None:
            continue
        key = "output.weight" if p.copy else p.tensor.name
        where[key] = (p.tensor.shape, p.tensor.type, p.device)
    if "output.weight" not in where and "token_embd.weight" in where:
        where["output.weight"] = where["token_embd.weight"]
    return where


def weight_factory(model: Model, placement: Placement, where: WeightWhere | None = None
                    ) -> Callable[[str], T | None]:
    if where is None:
        where = weight_where(placement)
    cache: dict[str, T] = {}

    def get(name: str) -> T | None:
        if name not in cache:
            if name not in where:
                return None
            shape, type_, dev = where[name]
            t = T(type_, shape, name=name)
            t.dev, t.weights = dev, True
            cache[name] = t
        return cache[name]

    return get


def full_offload(placement: Placement) -> bool:
    return CPU not in placement.unit_devices


def has_overrides_of(placement: Placement) -> bool:
    return bool(getattr(placement, "has_overrides", False) or placement.override_hits)


def pipeline_parallel(devices: DeviceSet, placement: Placement, p: ContextParams) -> bool:
    """Pipeline parallelism (4 copies of inputs): several devices, every layer and the output on
    them, layer split, KV offloaded, no tensor overrides, all devices async with events."""
    gpus = model_gpus(devices, placement)
    return (len(gpus) > 1 and full_offload(placement) and p.offload_kqv
            and not has_overrides_of(placement) and all(g.kind in ASYNC_EVENTS for g in gpus))


def reserve_shapes(model: Model, ctx: ResolvedContext, p: ContextParams, full: bool) -> list[Shape]:
    """The prompt graph (``min(n_ctx, n_ubatch)`` tokens, a multiple of n_seq_max) and the
    one-token-per-sequence graph that ``sched_reserve`` reserves (remembered for the last few
    settings: every projection asks twice)."""
    key = (model, ctx, p, full)
    with _SHAPES_LOCK:
        shapes = _SHAPES.get(key)
        if shapes is None:
            shapes = _SHAPES[key] = _reserve_shapes(model, ctx, p, full)
            while len(_SHAPES) > _SHAPES_SIZE:
                del _SHAPES[next(iter(_SHAPES))]
        return list(shapes)


_SHAPES: dict[tuple[object, ...], list[Shape]] = {}
_SHAPES_SIZE = 16
_SHAPES_LOCK = threading.Lock()


def _reserve_shapes(model: Model, ctx: ResolvedContext, p: ContextParams, full: bool) -> list[Shape]:
    n_seqs = p.n_seq_max
    n_tokens = min(ctx.n_ctx, ctx.n_ubatch)
    n_tokens = -(-n_tokens // n_seqs) * n_seqs
    n_out_max = p.n_outputs_max or ctx.n_batch
    pp = make_shape(model, ctx, p, n_tokens, n_seqs, min(n_tokens, n_out_max), full)
    tg = make_shape(model, ctx, p, n_seqs, n_seqs, n_seqs, full)
    return [pp, tg]


@dataclass(frozen=True)
class Simulation:
    backends: list[Backend]
    sizes: list[int]  # bytes per backend: what llama.cpp allocates
    reserves: list[Reserve]  # pp first
    n_copies: int


def graph_builder(model: Model) -> Callable[[Builder], None] | None:
    """The graph of the model's architecture, if this module has it (legacy non-MLA DeepSeek files
    build another attention graph and are left to the estimate)."""
    if model.arch == "deepseek2" and not model.summary.is_mla:
        return None
    return ARCH_GRAPHS.get(model.arch)


#: see :func:`freezing_after_simulations`
_freeze_after = False


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """The cycle collector off while a simulation runs: its tensors are acyclic (freed by reference
    counting), and with the recorded references alive every full collection would walk their
    hundreds of thousands of objects, at random points of a replay.  Inside
    :func:`freezing_after_simulations`, the outermost one freezes what is tracked before it turns the
    collector back on."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            if _freeze_after:
                gc.freeze()
            gc.enable()


@contextmanager
def freezing_after_simulations(on: bool = True) -> Iterator[None]:
    """For a short-lived process (a CLI command): every object the cycle collector tracks when a
    simulation or a ``--fit`` search ends is moved to its permanent generation (``gc.freeze``), so the
    next collection does not walk the recorded references and kept graphs built meanwhile (about
    200k objects after DeepSeek-V3's --fit: ~40 ms, 0.6 simulations).  Frozen objects are still freed
    by reference counting (the references and graphs are acyclic: evicted from their caches, they go);
    only cyclic garbage alive at a freeze stays until the process ends, a bounded leak a command can
    afford and a window cannot (the window collects on its own timer with the collector off, where
    :func:`no_cyclic_gc` never freezes).  Nothing is unfrozen when this ends."""
    global _freeze_after
    was = _freeze_after
    _freeze_after = on
    try:
        yield
    finally:
        _freeze_after = was


#: reserves by everything they read (:func:`reserve_key`), kept by a caller that simulates one
#: placement at several ``-ub`` values: the one-token graph does not depend on ``-ub``
ReserveMemo = dict[tuple[object, ...], Reserve]


def reserve_key(sh: Shape, arch_fn: Callable[[Builder], None], backends: list[Backend], n_copies: int,
                placement: Placement, *, no_alloc: bool, op_offload: bool) -> tuple[object, ...]:
    """What a from-scratch reserve reads: the graph's shape (the SWA cells only where a layer has a
    window: they follow ``-ub``), the backends, the layer devices (KV follows them or the shape's
    ``offload_kqv``) and every weight's device (its shape and type are the model's)."""
    if not any(sh.swa):
        sh = replace(sh, n_kv_swa=0)
    return (sh, arch_fn, tuple(backends), n_copies, no_alloc, op_offload, tuple(placement.unit_devices),
            tuple((it.name, it.device) for it in placement.items))


def simulate(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
             p: ContextParams, *, no_alloc: bool = False, incremental: bool = False,
             sizes_only: bool = False,
             memo: ReserveMemo | None = None) -> Simulation | None:
    """Per-backend compute bytes, or None for an architecture without a graph here (see
    :func:`_simulate`)."""
    with no_cyclic_gc():
        return _simulate(model, devices, placement, ctx, p, no_alloc=no_alloc, incremental=incremental,
                         sizes_only=sizes_only, memo=memo)


def _simulate(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
              p: ContextParams, *, no_alloc: bool = False, incremental: bool = False,
              sizes_only: bool = False,
              memo: ReserveMemo | None = None) -> Simulation | None:
    """Per-backend compute bytes, or None for an architecture without a graph here.

    The server (``ggml_backend_sched_reserve``) keeps the larger of the prompt (pp) and one-token (tg)
    reserves.  ``no_alloc`` gives what ``llama-fit-params`` / ``--fit`` estimate instead: the first pp
    reserve only, through ``ggml_backend_sched_reserve_size``, which drops user-forced backends.
    ``incremental``: replay the reserves against a recorded run of the same graph
    (:mod:`offload_planner.core.compute.incremental`; the same result, in a fraction of the time).
    ``sizes_only`` (with ``incremental``, or plain without ``memo``): ``reserves`` may leave out the
    one-token reserve (replayed, or scheduled from scratch and not walked by the allocator) where a
    bound puts it at most at the prompt reserve on every backend (:mod:`.bound`): ``sizes`` and the
    prompt reserve are the same, and the reserve left out decides no size.
    ``memo`` (from scratch only): reserves already made of the same graph and placement are reused,
    and the graph built for another placement is re-placed (:mod:`.template`; under
    ``SIMULATION_LOCK``)."""
    arch_fn = graph_builder(model)
    if arch_fn is None or (model.arch == "glm5-next" and (
            ctx.n_ubatch <= GLM5_GATHER_UBATCH or not glm5_simulated(placement))):
        return None  # glm5-next's gathered-latents selection and unfused mHC combine are not built
    backends = backends_for(devices, placement)
    n_copies = N_COPIES_PIPELINE if pipeline_parallel(devices, placement, p) else 1
    op_offload = bool(getattr(p, "op_offload", True))

    def kv_dev(il: int) -> str:
        return placement.layer_device(il) if p.offload_kqv else CPU

    shapes = reserve_shapes(model, ctx, p, full_offload(placement))
    if incremental and n_copies == 1 and not shares_allocators(backends):
        where_memo: list[WeightWhere] = []

        def where() -> WeightWhere:  # only when a reference is recorded or the items do not line up
            if not where_memo:
                where_memo.append(weight_where(placement))
            return where_memo[0]

        def weights() -> Callable[[str], T | None]:
            return weight_factory(model, placement, where())

        units = list(placement.unit_devices)
        reserves: list[Reserve] = []
        for sh in shapes[:1] if no_alloc else shapes:
            below = reserves[0].sizes if sizes_only and reserves else None
            key = (model, arch_fn, sh, tuple(backends), op_offload, no_alloc)
            r = incremental_reserve(key, sh, arch_fn, backends, op_offload, placement.items, where, weights,
                                    placement.layer_device, kv_dev, units, p.offload_kqv, no_alloc,
                                    graph_key=(model, arch_fn), below=below)
            if r is not None:
                reserves.append(r)
    elif incremental:  # pipeline parallelism, not replayed: the graph built for an earlier placement
        where_ = weight_where(placement)
        reserves = [reserve_graph(placed_graph((model, arch_fn), sh, arch_fn, where_,
                                               lambda: weight_factory(model, placement, where_),
                                               placement.layer_device, kv_dev),
                                  sh, backends, n_copies, no_alloc=no_alloc, op_offload=op_offload)
                    for sh in (shapes[:1] if no_alloc else shapes)]
    else:
        where_ = weight_where(placement) if memo is not None else {}

        def one(sh: Shape) -> Reserve:
            if memo is None:
                return reserve(sh, arch_fn, backends, n_copies, weight_factory(model, placement),
                               placement.layer_device, kv_dev, no_alloc=no_alloc, op_offload=op_offload)
            # a caller that keeps a memo simulates one at a time (SIMULATION_LOCK): the graph built
            # for an earlier placement (of the --fit search's dry runs too) is re-placed
            g = placed_graph((model, arch_fn), sh, arch_fn, where_,
                             lambda: weight_factory(model, placement, where_), placement.layer_device, kv_dev)
            return reserve_graph(g, sh, backends, n_copies, no_alloc=no_alloc, op_offload=op_offload)

        reserves = []
        for sh in shapes[:1] if no_alloc else shapes:
            if memo is None and sizes_only and reserves:  # the one-token reserve, unless a bound is below
                r = reserve_below(sh, arch_fn, backends, n_copies, weight_factory(model, placement),
                                  placement.layer_device, kv_dev, reserves[0].sizes, no_alloc=no_alloc,
                                  op_offload=op_offload)
                reserves.extend([r] if r is not None else [])
                continue
            if memo is None:
                reserves.append(one(sh))
                continue
            rkey = reserve_key(sh, arch_fn, backends, n_copies, placement, no_alloc=no_alloc,
                               op_offload=op_offload)
            if rkey not in memo:
                memo[rkey] = one(sh)
            reserves.append(memo[rkey])
    sizes = [max(r.sizes[i] for r in reserves) for i in range(len(backends))]
    return Simulation(backends, sizes, reserves, n_copies)


# --- the fallback formula -------------------------------------------------------------------------------


def term_estimate(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
                  p: ContextParams) -> dict[str, int]:
    """Per-device bytes for architectures without a graph here, from the terms the simulation shows
    matter: KQ mask(s) wherever attention runs (f16 with flash attention, f32 plus the KQ scores
    without), the largest layer's activations, the activation copied in at a device boundary, the
    logits on the output device, and on the host the inputs (mask, token rows, the unused embedding
    and mixed-batch rows); with pipeline parallelism the inputs and copies are held 4 times."""
    s = model.summary
    n_tok = min(ctx.n_ctx, ctx.n_ubatch)
    n_out = min(n_tok, p.n_outputs_max or ctx.n_batch)
    n_head = max(per_layer(s.n_head, s.n_layer) or (1,))
    per = 2 if p.flash_attn else 4
    masks = ctx.n_ctx_seq * n_tok * per + (ctx.swa_cells * n_tok * per if s.has_swa else 0)
    kq = 0 if p.flash_attn else 4 * ctx.n_ctx_seq * n_tok * n_head
    ff = max(per_layer(s.n_ff, s.n_layer) or (0,))
    rows = 4 * s.n_embd * n_tok
    head_v = s.kv_lora_rank if s.is_mla else s.head_dim_v  # MLA attends in the compressed space
    attn = 4 * n_tok * n_head * (s.head_dim_k + head_v)
    ffn = 4 * n_tok * max(2 * ff, 3 * s.n_ff_exp * max(s.n_expert_used, 1), 3 * s.n_embd)
    act = max(attn, ffn) + 2 * rows + kq
    copies = N_COPIES_PIPELINE if pipeline_parallel(devices, placement, p) else 1
    layer_devs = list(dict.fromkeys(placement.unit_devices[: s.n_layer_trunk]))
    out: dict[str, int] = {}
    for i, dev in enumerate(layer_devs):
        if dev == CPU:
            out[dev] = act
            continue
        # a GPU receives the activation at its first layer; the first one the token rows from the host
        boundary = (3 if i == 0 else 1) * rows * copies
        out[dev] = act + masks * copies + boundary
    out_dev = placement.output_device
    out[out_dev] = out.get(out_dev, 0) + 4 * n_out * (s.n_vocab + s.n_embd)
    out[CPU] = out.get(CPU, 0) + (masks + 4 * rows) * copies
    host_layer_weights = any(it.device == CPU and it.tensor.layer is not None for it in placement.items)
    if CPU not in layer_devs and host_layer_weights:
        out[CPU] += act  # layer weights overridden to the host (-ot ...=CPU): their ops run there
    return out


