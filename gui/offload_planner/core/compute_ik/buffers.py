"""The planner's entry points: ik's compute buffers (and its MTP context's), remembered per placement."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from offload_planner.core import ik
from offload_planner.core.buffer import IK_CPU_BUFFER_EXTRA, Buffer
from offload_planner.core.compute.buffers import BufferMemo, placement_key
from offload_planner.core.compute.ggml import CPU
from offload_planner.core.compute_ik.archs import IK_MTP_GRAPHS
from offload_planner.core.compute_ik.builder import IkBuilder
from offload_planner.core.compute_ik.reserve import IkReserve, simulate_ik
from offload_planner.core.compute_ik.simulate import supported

if TYPE_CHECKING:
    from offload_planner.core.devices import DeviceSet
    from offload_planner.core.memory import ContextParams, ResolvedContext
    from offload_planner.core.model import Model
    from offload_planner.core.placement import Placement


#: ``why`` of every compute buffer this module projects starts with this.
IK_SIMULATED = "ik_llama.cpp's own graph simulated"


_IK_MEMO: BufferMemo[list[Buffer] | None] = BufferMemo()


def ik_compute_buffers(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
                       p: ContextParams) -> list[Buffer] | None:
    """ik_llama.cpp's compute buffers, or None where this module has no graph for the model.

    Remembered for the last few placements (:class:`compute.BufferMemo`)."""
    key = (model, devices, ctx, p, *placement_key(placement))
    return _IK_MEMO.get(key, lambda: _ik_compute_buffers(model, devices, placement, ctx, p))


def _ik_compute_buffers(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
                        p: ContextParams) -> list[Buffer] | None:

    if not supported(model, p):
        return None
    try:
        r = simulate_ik(model, devices, placement, ctx, p)
    except (KeyError, IndexError, ValueError, ZeroDivisionError, AssertionError):
        return None  # tensors that do not fit the architecture's graph: the caller's estimate
    mode = f", -mla {p.mla}" if ik.uses_mla(model) else ""
    what = (f"{IK_SIMULATED} ({model.arch}{mode}, flash attention {'on' if p.flash_attn else 'off'}): "
            f"peak of the {r.n_tokens}-token prompt graph over {ctx.n_ctx} cells, {r.n_nodes} nodes")
    return _sized_buffers(r, what, "the graph is ik's but its scheduler and CUDA buffer rules are not "
                          "verified (estimate)")


def _sized_buffers(r: IkReserve, what: str, unverified: str) -> list[Buffer]:
    """A simulation's compute buffer per backend that holds one (ik's CPU build adds its fixed extra);
    ``what`` says how it was computed, ``unverified`` what is not verified with several backends."""
    out = []
    for be, size in zip(r.backends, r.sizes, strict=True):
        if size <= 1:
            continue
        if len(r.backends) == 1:
            why = what + "; equal to ik's CPU build on the verified configurations"
            size += IK_CPU_BUFFER_EXTRA if be.buft == CPU else 0
        else:
            why = what + f"; {r.n_splits} splits: with GPUs {unverified}"
        out.append(Buffer(be.name, be.buft, "compute", size, why))
    return out


def ik_mtp_compute_buffers(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
                           p: ContextParams) -> list[Buffer] | None:
    """The compute buffers of ik's MTP context (its graph reserved as ``MTP_OP_WARMUP``, the op the
    server creates it with: common/speculative.cpp ``cparams_dft.mtp_op_type``), or None where ik has
    no MTP graph for the architecture here (:data:`IK_MTP_GRAPHS`)."""
    graph = IK_MTP_GRAPHS.get(model.arch)
    if graph is None:
        return None
    key = (model, devices, ctx, p, *placement_key(placement))
    return _IK_MTP_MEMO.get(key, lambda: _ik_mtp_buffers(model, devices, placement, ctx, p, graph))


_IK_MTP_MEMO: BufferMemo[list[Buffer]] = BufferMemo()


def _ik_mtp_buffers(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
                    p: ContextParams, graph: Callable[[IkBuilder], None]) -> list[Buffer]:
    r = simulate_ik(model, devices, placement, ctx, p, graph)
    what = (f"{IK_SIMULATED} ({model.arch} MTP, NextN layer {model.summary.n_layer_trunk}, flash attention "
            f"{'on' if p.flash_attn else 'off'}): peak of the {r.n_tokens}-token warmup graph over "
            f"{ctx.n_ctx} cells, {r.n_nodes} nodes")
    return _sized_buffers(r, what, "the scheduler and CUDA rules are not verified")
