"""From a model, devices and a llama-server command line to placement and projected memory.

Applies the dialect's defaults to what the command line leaves unset, exactly as the server does
(pinned mainline: -np auto = 4 slots with a unified KV cache, -c 0 = trained length, flash
attention auto = on where every backend supports it, -ngl auto = all), then places and projects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from offload_planner.core.devices import DeviceSet
from offload_planner.core.dialects import IK, LLAMA_CPP, LLAMA_CPP_2025, Dialect
from offload_planner.core.extra_context import attach
from offload_planner.core.memory import ContextParams, Projection, project
from offload_planner.core.model import Model
from offload_planner.core.placement import Override, PlacementOptions, place, resolve_ngl
from offload_planner.core.speculative import draft_len, extra_contexts, load_spec, spec_refusals, uses_mtp

IK_LLAMA_CPP = IK  # the dialect objects under their old names here
__all__ = ["IK_LLAMA_CPP", "LLAMA_CPP", "LLAMA_CPP_2025", "EngineResult", "context_params",
           "placement_options", "run_engine"]

_QUANT_KV = {"q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"}


@dataclass
class EngineResult:
    projection: Projection
    placement_options: PlacementOptions
    context: ContextParams
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _get(args: Any, name: str, default: Any = None) -> Any:
    v = getattr(args, name, None)
    return default if v is None else v


def _server_args(args: Any) -> Any:
    """Accept a ParsedArgs (``.args`` holds the settings) or the settings themselves."""
    inner = getattr(args, "args", None)
    return inner if inner is not None and hasattr(args, "passthrough") else args


def _override_list(model: Model, args: Any) -> list[Any]:
    """The effective -ot list; ik_llama.cpp appends its --n-cpu-moe entries chosen from the model."""
    if hasattr(args, "passthrough"):  # a ParsedArgs
        from offload_planner.core.cmdline import effective_overrides

        moe = sorted({t.layer for t in model.tensors if t.layer is not None and t.role.is_routed_expert})
        return list(effective_overrides(args, moe))
    return list(_get(args, "overrides", []))


def placement_options(model: Model, devices: DeviceSet, args: Any, dialect: Dialect) -> PlacementOptions:
    dialect = Dialect(dialect)
    overrides = tuple(
        Override(o.pattern, o.buft, getattr(o, "source", "-ot")) for o in _override_list(model, args)
    )
    args = _server_args(args)
    n_layer = model.summary.n_layer
    has_gpu = bool(devices.gpus)
    ngl = dialect.default_ngl(_get(args, "n_gpu_layers"), has_gpu)
    overrides = dialect.kept_overrides(ngl, overrides)
    load_mode = _get(args, "load_mode", "auto")
    return PlacementOptions(
        n_gpu_layers=resolve_ngl(ngl, n_layer, has_gpu=has_gpu),
        tensor_split=tuple(_get(args, "tensor_split", ())),
        split_mode=_get(args, "split_mode", "layer"),
        main_gpu=_get(args, "main_gpu", 0),
        overrides=overrides,
        use_mmap=load_mode not in ("none", "mlock", "dio") and not dialect.turns_mmap_off(args),
        no_host=bool(_get(args, "no_host", False)),
        use_extra_bufts=not _get(args, "no_repack", False) and dialect.has_cpu_repack,
        output_first=dialect.output_first,
        load_mtp=uses_mtp(args),  # --spec-type draft-mtp loads the NextN layers (common.cpp load_mtp)
    )


def context_params(model: Model, args: Any, dialect: Dialect) -> tuple[ContextParams, list[str]]:
    dialect = Dialect(dialect)
    args = _server_args(args)
    notes: list[str] = []
    np_ = _get(args, "n_parallel")
    kvu = _get(args, "kv_unified")
    if dialect.auto_parallel and (np_ is None or np_ < 0):
        np_, kvu = 4, True if kvu is None else kvu
        notes.append("-np auto: 4 slots sharing one unified KV cache (server default)")
    np_ = np_ if np_ and np_ > 0 else 1
    n_ctx = _get(args, "ctx_size", 0)
    if not n_ctx:
        notes.append(f"-c 0 or unset: trained context {model.summary.n_ctx_train}"
                     + dialect.trained_context_note())
    fa = _get(args, "flash_attn", "auto")
    ctv = _get(args, "cache_type_v", "f16")
    flash = fa != "off"  # auto is on in every dialect (ik has no auto: its -fa means on)
    n_batch = _get(args, "batch_size", 2048)
    return ContextParams(
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=_get(args, "ubatch_size", 512),
        n_seq_max=np_,
        kv_unified=bool(kvu),
        flash_attn=flash or ctv in _QUANT_KV,
        type_k=_get(args, "cache_type_k", "f16"),
        type_v=ctv,
        offload_kqv=not _get(args, "no_kv_offload", False),
        swa_full=bool(_get(args, "swa_full", False)),
        # the pinned server reserves min(n_batch, n_seq_max) output rows (llama-context.cpp
        # n_outputs_max); 2025 builds reserved the logits of every token of the ubatch
        # (x (1 + draft length) with a draft --spec-type: server_output_limits)
        n_outputs_max=None if dialect.reserves_ubatch_outputs else min(n_batch, np_ * (1 + draft_len(args))),
        op_offload=not _get(args, "no_op_offload", False),
        dialect=dialect,
        mla=dialect.mla(model, _get(args, "mla")),
        amb=dialect.amb(_get(args, "amb")),
    ), notes


def _add_mmproj(projection: Projection, devices: DeviceSet, args: Any, dialect: Dialect) -> list[str]:
    """Files the --mmproj projector's buffers under their devices; notes where it is not projected."""
    from offload_planner.core.mmproj import attach

    setup = attach.mmproj_setup(args)
    if setup is None:
        return []
    if not dialect.projects_mmproj:
        return [f"--mmproj: the projector's memory is projected for the pinned llama.cpp only, not {dialect}"]
    fa = attach.fa_setting(_get(_server_args(args), "flash_attn"))
    mb = attach.project_setup(setup, devices, fa)
    attach.add_to_projection(projection, attach.mmproj_buffers(mb, devices))
    return [f"--mmproj {mb.projector.name}: {mb.why}"] if mb.why else []


def run_engine(model: Model, devices: DeviceSet, args: Any, dialect: Dialect = LLAMA_CPP) -> EngineResult:
    dialect = Dialect(dialect)
    popts = placement_options(model, devices, args, dialect)
    cparams, notes = context_params(model, args, dialect)
    placement = place(model, devices, popts)
    placement.raise_rule_errors()
    projection = project(model, devices, placement, cparams)
    spec = load_spec(devices, args, dialect, placement_options)
    extras = extra_contexts(model, devices, placement, cparams, projection.context, spec)
    projection = attach(projection, extras)
    notes += _add_mmproj(projection, devices, args, dialect)
    from offload_planner.core.diagnostics import plan_warnings

    notes += dialect.notes(popts, devices)
    warnings = (spec_refusals(model, spec) + dialect.warnings(model, popts, devices)
                + plan_warnings(projection, popts.overrides))
    return EngineResult(projection, popts, cparams, warnings, notes)
