"""The extra model ``--fit`` fits beside the main one (``common_fit_extra_model``, common/fit.cpp):
a draft model (``-md``) or the MTP context (``--spec-type draft-mtp``).

llama.cpp measures the extra model's dry run (its own parameters, which the fit never changes) at the
context the main model is being measured at, maps its devices onto the main model's, zeroes its
weights when it runs on the main model's (MTP: ``shares_model``) and adds it to every measurement of
the main model; it is measured again whenever that context changes.

What llama.cpp measures is the extra model with its parameters as the command gives them, before the
fit changes the main model's: ``common_init_result`` (common/common.cpp:1240-1266) builds
``params_dft`` / ``mparams_dft`` from ``params`` before ``common_fit_params`` writes ``-ngl`` and the
``-ot`` overrides, and the fit never touches the extra's (common/fit.cpp:203-259,
``add_extra_memory``).  The server then loads the fitted target (tools/server/server-context.cpp:1208)
and only afterwards the draft model / MTP context (server-context.cpp:1242-1248;
common/speculative.cpp:2611 ``n_ctx = llama_n_ctx(ctx_tgt)``, 2623 the draft with its own
``mparams``, 2643 the MTP context on the *fitted* target model).  A draft model allocates what was
measured; an MTP context runs on the fitted placement, and when the fit moved the NextN block's
experts to the CPU its compute buffer takes their copies (op offload), which the dry runs never saw:
:func:`extra_shortfalls` finds the devices llama.cpp's own ``--fit`` then leaves short of its margin.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from offload_planner.core.devices import DeviceSet
from offload_planner.core.extra_context import DRAFT, MMPROJ, MTP
from offload_planner.core.memory import ContextParams, kv_buffers, resolve_context
from offload_planner.core.model import Model
from offload_planner.core.placement import CPU, CPU_REPACK, PlacementOptions, place
from offload_planner.core.speculative import SpecSettings
from offload_planner.core.units import MiB

if TYPE_CHECKING:
    from offload_planner.core.fit import FitResult
    from offload_planner.core.memory import Projection


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
        cp = cparams.dialect.draft_context_params(cparams, n_ctx, d)
        m = device_memory(d.model, d.devices, d.placement_options, cp)
        names = place(d.model, d.devices, replace(d.placement_options, use_mmap=False)).model_devices
        return ExtraMeasured(dict(zip(names, m.used, strict=True)), dict(zip(names, m.model, strict=True)),
                             m.host)

    return measure


def _mtp_measure(model: Model, devices: DeviceSet, popts: PlacementOptions, spec: SpecSettings,
                 cparams: ContextParams) -> ExtraMeasure:
    """The MTP context on the main model at each context size: the build's own where its dialect has
    one (``Dialect.mtp_buffers``: ik's KV of the NextN layers in the main cache types, output and
    embeddings, its MTP graph's compute, as the plan projects it), else mainline's dry run (KV of the
    NextN layers in the draft cache types and the MTP graph's ``no_alloc`` reserve)."""
    from offload_planner.core.compute.mtp import mtp_compute_buffers

    placement = place(model, devices, replace(popts, use_mmap=False))
    s = model.summary

    def measure(n_ctx: int) -> ExtraMeasured:
        main = replace(cparams, n_ctx=n_ctx)
        mctx = resolve_context(main, s.n_ctx_train, s.n_swa)
        own = cparams.dialect.mtp_buffers(model, devices, placement, main, mctx, spec.type_k, spec.type_v)
        if own is not None:  # the build's own MTP context (ik's: its KV, output and graph), as projected
            bufs = own
        else:
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


def _draft_mtp_measure(spec: SpecSettings, cparams: ContextParams) -> ExtraMeasure:
    """``-md`` with ``draft-mtp`` (given, or inferred from the file's MTP head): the draft model
    loaded with its own parameters and an MTP context on it (``cparams_dft.ctx_type`` MTP,
    ``shares_model`` false: common/common.cpp 1240-1258): its weights, KV of its NextN layers, and
    the MTP graph's ``no_alloc`` reserve."""
    from offload_planner.core.compute.mtp import mtp_compute_buffers
    from offload_planner.core.memory import weight_buffers

    d = spec.draft
    assert d is not None
    placement = place(d.model, d.devices, replace(d.placement_options, use_mmap=False))
    s = d.model.summary
    weights = weight_buffers(d.model, placement, d.devices)

    def measure(n_ctx: int) -> ExtraMeasured:
        cp = replace(cparams, n_ctx=n_ctx, type_k=spec.type_k, type_v=spec.type_v,
                     n_outputs_max=min(cparams.n_batch, cparams.n_seq_max))
        ctx = resolve_context(cp, s.n_ctx_train, s.n_swa)
        bufs = [*weights, *kv_buffers(d.model, placement, ctx, cp, d.devices,
                                      cached=range(s.n_layer_trunk, s.n_layer))]
        bufs += mtp_compute_buffers(d.model, d.devices, placement, ctx, cp, no_alloc=True)
        names = placement.model_devices
        used = {n: sum(b.bytes for b in bufs if b.device == n) for n in names}
        held = {n: sum(b.bytes for b in weights if b.device == n) for n in names}
        host = sum(b.bytes for b in bufs if b.device == CPU and b.name != CPU_REPACK)
        return ExtraMeasured(used, held, host)

    return measure


def extra_measure(model: Model, devices: DeviceSet, popts: PlacementOptions, cparams: ContextParams,
                  spec: SpecSettings | None, device_memory: DryRun) -> ExtraMeasure | None:
    """The extra model's dry run by context size, None without one (draft first, as the server)."""
    if spec is None or not spec.active:
        return None
    if spec.draft is not None:
        return _draft_mtp_measure(spec, cparams) if spec.mtp else _draft_measure(spec, cparams, device_memory)
    if spec.mtp and model.summary.n_nextn:
        return _mtp_measure(model, devices, popts, spec, cparams)
    return None


@dataclass(frozen=True)
class ExtraShortfall:
    """A device the fitted plan leaves short of the fit's margin because the draft model / MTP
    context allocates more there than the fit's dry runs counted for it."""

    device: str
    over: int  # bytes used beyond (free - margin)
    margin: int  # the margin the fit keeps (-fitt)
    counted: int  # the extra's bytes on the device in the fit's dry runs
    allocated: int  # the extra's bytes on the device as the fitted server allocates them
    free: int  # the free memory the fit was given
    what: str  # the extra's label ("MTP context (1 NextN layer)", "draft model NAME")

    def message(self) -> str:
        """One line naming the device and the MiB."""
        what = f"the {self.what}"
        line = (f"llama.cpp's own --fit leaves {self.device} {self.over / MiB:.0f} MiB short of the "
                f"{self.margin / MiB:.0f} MiB it keeps free: its dry runs count {what} at "
                f"{self.counted / MiB:.0f} MiB there, measured with the command's own parameters before "
                f"the fit changes them (common/common.cpp:1244-1266), but the fitted server allocates "
                f"{self.allocated / MiB:.0f} MiB for it")
        if self.over > self.margin:
            line += (f"; {self.device} is over its {self.free / MiB:.0f} MiB by "
                     f"{(self.over - self.margin) / MiB:.0f} MiB")
        return line


def may_fall_short(result: FitResult, spec: SpecSettings | None) -> bool:
    """Whether the fitted server's draft/MTP context can take more than the fit counted: only an MTP
    context (a draft model keeps its own parameters, common/speculative.cpp:2623) and only when the
    fit changed the placement (``-ngl``/``-ts``/``-ot``), which the dry runs measured it without."""
    return spec is not None and spec.mtp and spec.draft is None and result.layers_changed


def extra_shortfalls(result: FitResult, projection: Projection, free: dict[str, int]) -> list[ExtraShortfall]:
    """Per offload device of ``projection`` (the fitted plan, with its draft/MTP context): where it
    uses more than ``free`` minus the fit's margin and the draft/MTP context takes more than the fit
    counted for it.  Only the devices the fit fitted (the main model's: a draft's other devices are
    dropped by ``add_extra_memory`` and the fit keeps no margin there).  A --mmproj projector is left
    out: the server adds it to the margins instead."""
    what = next((e.label for e in projection.extras if e.key in (DRAFT, MTP)), "draft/MTP context")
    out: list[ExtraShortfall] = []
    for dm in projection.devices:
        name = dm.device.name
        if name not in free or name not in result.margins:
            continue
        allocated = sum(b.bytes for b in dm.buffers if b.owner in (DRAFT, MTP))
        counted = result.extra_counted.get(name, 0)
        if allocated <= counted:
            continue
        margin = result.margins[name]
        used = dm.resident() - sum(b.bytes for b in dm.buffers if b.owner == MMPROJ)
        over = used - (free[name] - margin)
        if over > 0:
            out.append(ExtraShortfall(name, over, margin, counted, allocated, free[name], what))
    return out
