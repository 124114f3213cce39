"""From a llama-server command line to the plan's settings (placement options, context parameters).

Applies the dialect's defaults to what the command line leaves unset, exactly as the server does
(pinned mainline: -np auto = 4 slots with a unified KV cache, -c 0 = trained length, flash
attention auto = on where every backend supports it, -ngl auto = all); :mod:`offload_planner.core.analysis`
places, projects and analyses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from offload_planner.core.devices import DeviceSet
from offload_planner.core.dialects import IK, LLAMA_CPP, LLAMA_CPP_2025, Dialect
from offload_planner.core.errors import PlannerError
from offload_planner.core.memory import DEFAULT_N_BATCH, DEFAULT_N_UBATCH, ContextParams
from offload_planner.core.model import Model
from offload_planner.core.placement import Override, PlacementOptions, resolve_ngl
from offload_planner.core.recurrent_state import memory_notes
from offload_planner.core.roles import ROUTED_EXPERT_ROLES
from offload_planner.core.rule_match import rule_set
from offload_planner.core.speculative import draft_len, rs_snapshots, uses_mtp

IK_LLAMA_CPP = IK  # the dialect objects under their old names here
__all__ = ["IK_LLAMA_CPP", "LLAMA_CPP", "LLAMA_CPP_2025", "command_notes", "context_params",
           "placement_options"]

_QUANT_KV = {"q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"}


def _get(args: Any, name: str, default: Any = None) -> Any:
    v = getattr(args, name, None)
    return default if v is None else v


#: llama.cpp's unsigned context sizes (``llama_context_params``: uint32_t n_ctx, n_batch, n_ubatch):
#: the flag that sets each, for the message that refuses a negative one
UNSIGNED_SIZES = {"ctx_size": "-c/--ctx-size", "batch_size": "-b/--batch-size",
                  "ubatch_size": "-ub/--ubatch-size"}

#: what 0 means where llama.cpp gives it a meaning (llama-context.cpp: n_ctx 0 is the trained context,
#: n_ubatch 0 is n_batch)
_ZERO_MEANS = {"ctx_size": "; 0 is the trained context", "ubatch_size": "; 0 is -b's value"}


def _size(args: Any, name: str, default: int) -> int:
    """A context size as given, refusing a negative one: llama-server's parser takes any int, and
    the library reads it as uint32_t (-1: 4294967295 cells or tokens), which no plan can project."""
    v = int(_get(args, name, default))
    if v < 0:
        raise PlannerError(f"{UNSIGNED_SIZES[name]} {v}: a negative size, which llama.cpp reads as "
                           f"{v & 0xFFFFFFFF} (unsigned)" + _ZERO_MEANS.get(name, ""))
    return v


def server_settings(args: Any) -> Any:
    """Accept a ParsedArgs (``.args`` holds the settings) or the settings themselves."""
    inner = getattr(args, "args", None)
    return inner if inner is not None and hasattr(args, "passthrough") else args


def _override_list(model: Model, args: Any) -> list[Any]:
    """The effective -ot list; ik_llama.cpp appends its --n-cpu-moe entries chosen from the model."""
    if hasattr(args, "passthrough"):  # a ParsedArgs
        from offload_planner.core.cmdline import effective_overrides

        experts = ROUTED_EXPERT_ROLES
        moe = sorted({t.layer for t in model.tensors if t.layer is not None and t.role in experts})
        return list(effective_overrides(args, moe))
    return list(_get(args, "overrides", []))


def places_on_host(model: Model, overrides: tuple[Override, ...]) -> bool:
    """Some weight's first matching override names the CPU (``has_buft_overrides`` in ik's loader)."""
    if not any(o.buft.upper() == "CPU" for o in overrides):
        return False
    rules = rule_set(overrides)
    return any((i := rules.first(t.name)) is not None and overrides[i].buft.upper() == "CPU"
               for t in model.tensors)


def mmap_requested(args: Any, dialect: Dialect) -> bool:
    """The load mode maps the model (no ``--no-mmap``/``-lm none``/``--mlock``/``dio``) and no flag turns
    mmap off for the whole model (ik's ``-rtr``); ik may still turn it off for a weight on the host
    (:func:`places_on_host`)."""
    args = server_settings(args)
    mapped = _get(args, "load_mode", "auto") not in ("none", "mlock", "dio")
    return mapped and not Dialect(dialect).turns_mmap_off(args)


def placement_options(model: Model, devices: DeviceSet, args: Any, dialect: Dialect) -> PlacementOptions:
    dialect = Dialect(dialect)
    overrides = tuple(  # the build's buffer type names as the planner's (Metal in ik: MTL0)
        Override(o.pattern, dialect.planner_device_name(o.buft), getattr(o, "source", "-ot"))
        for o in _override_list(model, args)
    )
    args = server_settings(args)
    n_layer = model.summary.n_layer
    has_gpu = bool(devices.gpus)
    selected = dialect.selected_gpus(_get(args, "devices"), devices.gpus)
    ngl = dialect.default_ngl(_get(args, "n_gpu_layers"), has_gpu and selected != ())
    overrides = dialect.kept_overrides(ngl, overrides)
    return PlacementOptions(
        n_gpu_layers=resolve_ngl(ngl, n_layer, has_gpu=has_gpu),
        tensor_split=tuple(_get(args, "tensor_split", ())),
        split_mode=_get(args, "split_mode", "layer"),
        main_gpu=_get(args, "main_gpu", 0),
        overrides=overrides,
        use_mmap=mmap_requested(args, dialect)
        and not (dialect.host_overrides_turn_mmap_off and places_on_host(model, overrides)),
        no_host=bool(_get(args, "no_host", False)),
        use_extra_bufts=not _get(args, "no_repack", False) and dialect.has_cpu_repack,
        output_first=dialect.output_first,
        plain_cpu_overrides=dialect.plain_cpu_overrides,
        load_mtp=uses_mtp(args, dialect),  # draft-mtp (given, or from -md) loads the NextN layers (load_mtp)
        selected=selected,
    )


def context_params(model: Model, args: Any, dialect: Dialect) -> tuple[ContextParams, list[str]]:
    dialect = Dialect(dialect)
    args = server_settings(args)
    notes: list[str] = []
    np_ = _get(args, "n_parallel")
    kvu = _get(args, "kv_unified")
    if dialect.auto_parallel and (np_ is None or np_ < 0):
        np_, kvu = 4, True if kvu is None else kvu
        notes.append("-np auto: 4 slots sharing one unified KV cache (server default)")
    np_ = np_ if np_ and np_ > 0 else 1
    n_ctx = _size(args, "ctx_size", 0)
    if not n_ctx:
        notes.append(f"-c 0 or unset: trained context {model.summary.n_ctx_train}"
                     + dialect.trained_context_note())
    fa = _get(args, "flash_attn", "auto")
    ctv = _get(args, "cache_type_v", "f16")
    flash = fa != "off"  # auto is on in every dialect (ik has no auto: its -fa means on)
    # "n_batch is less than GGML_KQ_MASK_PAD - increasing to N" (-b 0 elsewhere: cmdline.semantics)
    n_batch = max(_size(args, "batch_size", DEFAULT_N_BATCH), dialect.batch_floor)
    n_draft = draft_len(args, dialect)
    return ContextParams(
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=_size(args, "ubatch_size", DEFAULT_N_UBATCH),
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
        n_outputs_max=None if dialect.reserves_ubatch_outputs else min(n_batch, np_ * (1 + n_draft)),
        op_offload=not _get(args, "no_op_offload", False),
        dialect=dialect,
        mla=dialect.mla(model, _get(args, "mla")),
        amb=dialect.amb(_get(args, "amb")),
        repack=bool(_get(args, "rtr", False)),
        n_rs_seq=rs_snapshots(args, dialect),
    ), notes


def command_notes(model: Model, devices: DeviceSet, args: Any, dialect: Dialect,
                  popts: PlacementOptions, projector_notes: Sequence[str] = ()) -> list[str]:
    """What the server's defaults decide for this command line (-np auto, -c 0), the projector's
    notes, the dialect's notes on how it places these weights, and the ``-dev`` names it skips and
    what it selects."""
    from offload_planner.core.kv_override import command_overrides, loaded, notes

    ovs = command_overrides(args, Dialect(dialect).kv_override_csv)
    _, said = context_params(loaded(model, ovs), args, dialect)  # -c 0: the trained context loaded
    selection = [*skipped_device_notes(devices, args), *device_selection(popts, devices, Dialect(dialect))]
    return [*notes(model, ovs), *said, *memory_notes(model, Dialect(dialect)), *projector_notes,
            *Dialect(dialect).notes(popts, devices), *selection]


def skipped_device_notes(devices: DeviceSet, args: Any) -> list[str]:
    """``-dev``/``-devd`` names a build skips when it loads (ik: "NAME backend not available."), from a
    ParsedArgs (a bare ServerArgs: none; :func:`~offload_planner.core.cmdline.semantics.skipped_devices`)."""
    if not hasattr(args, "passthrough"):
        return []
    from offload_planner.core.cmdline import skipped_devices

    return [str(w) for w in skipped_devices(args, devices.names)]


def device_selection(popts: PlacementOptions, devices: DeviceSet, dialect: Dialect) -> list[str]:
    """``-dev`` leaving GPUs out: llama-server's model devices are the selected ones only (layers,
    ``-ts`` shares, KV and compute buffers), so the others hold nothing of the model.  The ``-dev``
    quoted as this build spells it (ik: an RPC device by its buffer type), the devices as the plan
    names them."""
    if popts.selected is None:
        return []
    left = [g.name for g in devices.gpus if g.name not in popts.selected]
    chosen = ",".join(dialect.dev_name(d) for n in popts.selected if (d := devices.by_name(n))) or "none"
    once = list(dict.fromkeys(popts.selected))
    uses = f"{', '.join(once)} only" if popts.selected else "no GPU"
    out = [f"-dev {chosen}: llama-server uses {uses}; {', '.join(left)} "
           f"{'holds' if len(left) == 1 else 'hold'} nothing of the model"] if left else []
    if dialect.refuses_repeated_devices:  # ik: its own warning (Dialect.warnings)
        return out
    return out + [repeated_device_note(chosen, n, popts.selected.count(n), dialect.fits_by_default)
                  for n in once if popts.selected.count(n) > 1]


def repeated_device_note(chosen: str, name: str, times: int, fits: bool = False) -> str:
    """A device ``-dev`` names more than once (the pinned build; ik's is refused: cmdline.semantics):
    llama.cpp keeps every mention in the model's devices and starts a backend for each; ``fits``: the
    build's ``--fit`` (whose dry runs measure the device once per mention, each seeing all of its
    buffers: llama-fit-params with ``-dev RPC0,RPC0`` kept 5 layers where the planner's fit keeps 3)."""
    fit = (f"; --fit measures {name} once per mention, each seeing everything on it, which the planner's "
           "fit does not model: with --fit on, what it changes is not projected exactly" if fits else "")
    return (f"-dev {chosen}: llama.cpp takes {name} {times} times as the model's devices "
            "(llama_prepare_model_devices keeps every mention, src/llama.cpp 180-183) and starts a backend "
            "for each (llama-context.cpp 336-342): -ts gives each mention a share, every share lands on "
            f"{name}; with every layer and the KV cache offloaded and no -ot, more than one model "
            "device turns pipeline parallelism on (llama-context.cpp 432-459: the compute buffers hold 4 "
            f"copies of the graph inputs){fit}")
