"""The extra model ``--fit`` fits beside the main one (``common_fit_extra_model``, common/fit.cpp):
a draft model (``-md``) or the MTP context (``--spec-type draft-mtp``).

llama.cpp measures the extra model's dry run (its own parameters, which the fit never changes) at the
context the main model is being measured at, maps its devices onto the main model's, zeroes its
weights when it runs on the main model's (MTP: ``shares_model``) and adds it to every measurement of
the main model; it is measured again whenever that context changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from offload_planner.core.devices import DeviceSet
from offload_planner.core.memory import ContextParams, kv_buffers, resolve_context
from offload_planner.core.model import Model
from offload_planner.core.placement import CPU, CPU_REPACK, PlacementOptions, place
from offload_planner.core.speculative import SpecSettings


@dataclass(frozen=True)
class ExtraMeasured:
    """One dry run of the extra model: per device name model + context + compute bytes, the model
    bytes, and the host side (host buffer types, as :class:`fit.Measured`)."""

    used: dict[str, int]
    model: dict[str, int]
    host: int


ExtraMeasure = Callable[[int], ExtraMeasured]  # context size -> the extra model's dry run
#: ``fit.device_memory`` (passed in: the fit imports this module); returns a ``fit.Measured``
DryRun = Callable[[Model, DeviceSet, PlacementOptions, ContextParams], Any]


def _draft_measure(spec: SpecSettings, cparams: ContextParams, device_memory: DryRun) -> ExtraMeasure:
    d = spec.draft
    assert d is not None

    def measure(n_ctx: int) -> ExtraMeasured:
        cp = replace(cparams, n_ctx=d.n_ctx or n_ctx, type_k=d.type_k, type_v=d.type_v,
                     n_outputs_max=min(cparams.n_batch, cparams.n_seq_max))
        m = device_memory(d.model, d.devices, d.placement_options, cp)
        names = place(d.model, d.devices, replace(d.placement_options, use_mmap=False)).model_devices
        return ExtraMeasured(dict(zip(names, m.used, strict=True)), dict(zip(names, m.model, strict=True)),
                             m.host)

    return measure


def _mtp_measure(model: Model, devices: DeviceSet, popts: PlacementOptions, spec: SpecSettings,
                 cparams: ContextParams) -> ExtraMeasure:
    from offload_planner.core.compute.mtp import mtp_compute_buffers

    placement = place(model, devices, replace(popts, use_mmap=False))
    s = model.summary

    def measure(n_ctx: int) -> ExtraMeasured:
        cp = replace(cparams, n_ctx=n_ctx, type_k=spec.type_k, type_v=spec.type_v,
                     n_outputs_max=min(cparams.n_batch, cparams.n_seq_max))
        ctx = resolve_context(cp, s.n_ctx_train, s.n_swa)
        bufs = kv_buffers(model, placement, ctx, cp, devices, cached=range(s.n_layer_trunk, s.n_layer))
        bufs += mtp_compute_buffers(model, devices, placement, ctx, cp, no_alloc=True)
        used: dict[str, int] = {}
        host = 0
        for b in bufs:
            if b.device == CPU:
                host += 0 if b.name == CPU_REPACK else b.bytes
            else:
                used[b.device] = used.get(b.device, 0) + b.bytes
        return ExtraMeasured(used, {}, host)  # shares_model: the weights are the main model's

    return measure


def extra_measure(model: Model, devices: DeviceSet, popts: PlacementOptions, cparams: ContextParams,
                  spec: SpecSettings | None, device_memory: DryRun) -> ExtraMeasure | None:
    """The extra model's dry run by context size, None without one (draft first, as the server)."""
    if spec is None or not spec.active:
        return None
    if spec.draft is not None:
        return _draft_measure(spec, cparams, device_memory)
    if spec.mtp and model.summary.n_nextn:
        return _mtp_measure(model, devices, popts, spec, cparams)
    return None
