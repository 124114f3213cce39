"""Pure plan transformations behind the undo commands: each returns a new Plan, never mutates.

Qt-free. Option keys are ``"context.<ContextParams field>"`` or ``"placement.<PlacementOptions
field>"``, or :data:`EXPERTS_USED` (the experts a token runs: an ``--override-kv`` the plan keeps).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from offload_planner.core.devices import Device, DeviceKind, DeviceSet, prefix_of
from offload_planner.core.dialects import Dialect
from offload_planner.core.memory import ContextParams
from offload_planner.core.placement import CPU, PlacementOptions
from offload_planner.core.plan import Plan

CONTEXT = "context"
PLACEMENT = "placement"
#: the experts each token runs: ``--override-kv <arch>.expert_used_count=int:N`` (core.kv_override)
EXPERTS_USED = "model.expert_used_count"


def normalized_moves(
    plan: Plan, moves: Mapping[str, str], base: Mapping[str, str | None]
) -> dict[str, str | None]:
    """A move back to where the command's placement puts a tensor clears the move instead."""
    return {n: (None if base.get(n) == d else d) for n, d in moves.items()}


def _split(key: str) -> tuple[str, str]:
    section, _, name = key.partition(".")
    valid = {
        CONTEXT: {f.name for f in fields(ContextParams)},
        PLACEMENT: {f.name for f in fields(PlacementOptions)},
    }
    if name not in valid.get(section, set()):
        raise KeyError(f"unknown option {key!r}")
    return section, name


def option_value(plan: Plan, key: str) -> Any:
    if key == EXPERTS_USED:
        return plan.model.summary.n_expert_used
    section, name = _split(key)
    return getattr(plan.context if section == CONTEXT else plan.placement_options, name)


def with_option(plan: Plan, key: str, value: Any) -> Plan:
    if key == EXPERTS_USED:
        return with_experts_used(plan, int(value))
    section, name = _split(key)
    if section == CONTEXT:
        ctx = replace(plan.context, **{name: value})
        if name in ("n_batch", "n_seq_max") and ctx.n_outputs_max is not None:
            # as core.engine.context_params derives it for llama-server
            ctx = replace(ctx, n_outputs_max=min(ctx.n_batch, ctx.n_seq_max))
        return replace(plan, context=ctx)
    popts = replace(plan.placement_options, **{name: value})
    if name == "use_mmap":  # the user's choice; the dialect's rule may still turn it off (Plan)
        if value == plan.placement_options.use_mmap:  # (undoing a tick ik overruled restores the plan)
            return plan
        return replace(plan, placement_options=popts, mmap_off_by_overrides=False)
    return replace(plan, placement_options=popts)


def with_experts_used(plan: Plan, n: int) -> Plan:
    """The plan with ``n`` experts a token (its ``--override-kv`` of ``<arch>.expert_used_count``
    replaced; none where ``n`` is the file's own count)."""
    from offload_planner.core.kv_override import file_model, with_override

    model = file_model(plan.model)
    key = f"{model.arch}.expert_used_count"
    item = None if n == model.summary.n_expert_used else f"{key}=int:{n}"
    return replace(plan, extra_args=with_override(plan.extra_args, key, item, plan.dialect.kv_override_csv))


def with_dialect(plan: Plan, dialect: Dialect) -> Plan:
    """Pinned mainline offloads the output layer first; older builds and ik only with ngl > n_layer
    (core.engine.placement_options). The context takes the dialect's sizing rules, and ik its default
    MLA mode and -amb and no CPU_REPACK buffers.  A build with one KV stream has no unified-KV setting
    (ik refuses ``-kvu``; its parser leaves the flag off, and so does the switch).  Slots at the old
    build's server default (no ``-np``) take the new build's (:func:`_default_slots`)."""
    dialect = Dialect(dialect)
    popts = replace(plan.placement_options, use_extra_bufts=dialect.has_cpu_repack)  # Plan derives the rest
    n_draft = plan.spec.n_max if plan.spec is not None else 0
    ctx = replace(_default_slots(plan.context, Dialect(plan.context.dialect), dialect, n_draft),
                  dialect=dialect, mla=dialect.mla(plan.model, None), amb=dialect.amb(None),
                  repack=plan.context.repack and dialect.has_mla_settings)  # -rtr: ik only
    ctx = replace(ctx, kv_unified=ctx.kv_unified and not dialect.single_kv_stream)
    return replace(plan, placement_options=popts, context=ctx)


def _default_slots(ctx: ContextParams, old: Dialect, new: Dialect, n_draft: int) -> ContextParams:
    """The pinned server's ``-np`` auto is four slots sharing one unified KV cache; the other builds'
    default is one slot.  A plan at the old build's default is one whose command gave no ``-np`` (as
    core.plan's command leaves it out), so the new build's default applies, as ``plan --backend NEW``
    reads that command: kept, the switch to ik exported ``-np 4``, four slots of a quarter of the
    context each where ik's server has one of all of it.  The output rows reserved follow the slots
    and the build (core.engine.context_params: the 2025 builds reserve a row per ubatch token)."""
    def default(d: Dialect) -> tuple[int, bool]:
        return (4, True) if d.auto_parallel else (1, False)

    n_seq, unified = ctx.n_seq_max, ctx.kv_unified
    if (n_seq, unified) == default(old):
        n_seq, unified = default(new)
    per_seq = ctx.n_outputs_max // ctx.n_seq_max if ctx.n_outputs_max is not None else 1 + n_draft
    outputs = None if new.reserves_ubatch_outputs else min(ctx.n_batch, n_seq * max(1, per_seq))
    return replace(ctx, n_seq_max=n_seq, kv_unified=unified, n_outputs_max=outputs)


def with_device(plan: Plan, device: Device, index: int | None = None) -> Plan:
    """Add a GPU (at ``index`` in llama.cpp's order, default last) or replace the CPU."""
    if not device.is_gpu:
        return replace(plan, devices=replace(plan.devices, cpu=device))
    gpus = list(plan.devices.gpus)
    gpus.insert(len(gpus) if index is None else index, device)
    return replace(plan, devices=DeviceSet(plan.devices.cpu, tuple(gpus)))


def without_device(plan: Plan, name: str) -> tuple[Plan, int, dict[str, str]]:
    """Remove a GPU and the user's moves onto it; returns the plan, the GPU's index and the moves
    dropped (to restore them on undo)."""
    gpus = list(plan.devices.gpus)
    index = next(i for i, g in enumerate(gpus) if g.name == name)
    del gpus[index]
    dropped = {n: d for n, d in plan.moves.items() if d == name}
    moves = {n: d for n, d in plan.moves.items() if d != name}
    return replace(plan, devices=DeviceSet(plan.devices.cpu, tuple(gpus)), moves=moves), index, dropped


def with_device_changed(plan: Plan, name: str, **changes: Any) -> Plan:
    """Change fields (``margin``, ``total``, ``free``) of one device."""
    if name == plan.devices.cpu.name or name == CPU:
        return replace(plan, devices=replace(plan.devices, cpu=replace(plan.devices.cpu, **changes)))
    gpus = tuple(replace(g, **changes) if g.name == name else g for g in plan.devices.gpus)
    return replace(plan, devices=DeviceSet(plan.devices.cpu, gpus))


def next_gpu_name(devices: DeviceSet, prefix: str = "CUDA") -> str:
    """The first unused name of a backend (``prefix``: a kind, ``Metal``, or a name prefix, ``MTL``)."""
    prefix = prefix_of(DeviceKind(prefix)) if prefix in set(DeviceKind) else prefix
    used = {g.name.lower() for g in devices.gpus}
    i = 0
    while f"{prefix}{i}".lower() in used:
        i += 1
    return f"{prefix}{i}"
