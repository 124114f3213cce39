"""Preset edits of a plan, as move maps (tensor name -> device, None = back to the command's default).

The window turns each result into one undoable MoveTensors step.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from offload_planner.core.device_figures import DeviceFigures
from offload_planner.core.fit import FitResult, fit_params
from offload_planner.core.memory import Projection, alloc_size, pad
from offload_planner.core.placement import CPU, Placement, selected_gpus
from offload_planner.core.plan import Plan

Moves = dict[str, str | None]


def _movable(plan: Plan, name: str) -> bool:
    return plan.movable(name)[0]


def routed_experts_to(plan: Plan, placement: Placement, device: str = CPU) -> Moves:
    """Every routed-expert tensor of every layer to ``device`` (llama.cpp's ``-ot exps=CPU``)."""
    return {
        p.tensor.name: device
        for p in placement.items
        if p.tensor.role.is_routed_expert
        and not p.copy
        and p.device not in (None, device)
        and _movable(plan, p.tensor.name)
    }


def layers_to(
    plan: Plan, placement: Placement, first: int, last: int, device: str, *, experts_only: bool = False
) -> Moves:
    """Every movable tensor of layers ``first..last`` (inclusive) to ``device``."""
    lo, hi = min(first, last), max(first, last)
    return {
        p.tensor.name: device
        for p in placement.items
        if p.tensor.layer is not None
        and lo <= p.tensor.layer <= hi
        and not p.copy
        and p.device not in (None, device)
        and (p.tensor.role.is_routed_expert or not experts_only)
        and _movable(plan, p.tensor.name)
    }


def fill_with_experts(
    plan: Plan,
    placement: Placement,
    projection: Projection,
    device: str,
    *,
    from_first: bool = True,
    spill: str = CPU,
) -> Moves:
    """Give ``device`` as many layers' routed experts as fit its capacity minus margin, taking
    layers in order from the first (or the last); its other expert layers go to ``spill``.

    What stays on the device besides its routed experts (attention, KV cache, compute buffers,
    ...) is first taken from ``projection``; expert layers held by other GPUs are left where they
    are. The result is then projected, and while the device is still over (its compute buffer grows
    when experts leave it: op offload copies host expert weights through it), the last kept layer
    goes to ``spill`` too.
    """
    dev = plan.devices.by_name(device)
    if dev is None or dev.capacity is None:
        return {}
    by_layer: dict[int, list[tuple[str, str]]] = defaultdict(list)
    on_dev: dict[int, bool] = {}
    elsewhere: set[int] = set()
    cost: dict[int, int] = defaultdict(int)
    held = 0
    for p in placement.items:
        t = p.tensor
        if not t.role.is_routed_expert or t.layer is None or p.copy or p.device is None:
            continue
        if not _movable(plan, t.name):
            continue
        size = pad(alloc_size(t, dev), dev.alignment)
        by_layer[t.layer].append((t.name, p.device))
        cost[t.layer] += size
        if p.device == device:
            held += size
            on_dev[t.layer] = True
        elif p.device != spill:
            elsewhere.add(t.layer)
    used_without_experts = projection.device(device).total() - held
    room = dev.capacity - dev.margin - used_without_experts
    order = sorted(by_layer, reverse=not from_first)
    moves: Moves = {}
    kept: list[int] = []
    full = False
    for il in order:
        if il in elsewhere and not on_dev.get(il):
            continue
        fits = not full and cost[il] <= room
        if fits:
            room -= cost[il]
            kept.append(il)
        else:
            full = True
        target = device if fits else spill
        for name, current in by_layer[il]:
            if current != target:
                moves[name] = target
    while kept and DeviceFigures.of(plan.with_moves(moves).projection().device(device)).over:
        for name, current in by_layer[kept.pop()]:
            if current == spill:
                moves.pop(name, None)
            else:
                moves[name] = spill
    return moves


def back_to_default(plan: Plan, names: list[str] | None = None) -> Moves:
    """Undo the user's moves of ``names`` (all moves when None)."""
    return {n: None for n in (plan.moves if names is None else names) if n in plan.moves}


def llama_fit(plan: Plan) -> tuple[Plan, FitResult]:
    """What the pinned llama-server's ``--fit`` would run if the plan left -ngl, -ts, -ot (and an
    unset context) to it: the fitted plan (the user's moves dropped: the fit starts from the
    command) and llama.cpp's result. Each GPU's free memory is its known free (else total)."""
    unknown = [g.name for g in selected_gpus(plan.devices, plan.placement_options) if g.capacity is None]
    if unknown:
        raise ValueError(f"the memory of {', '.join(unknown)} is unknown: give it a size first")
    popts = replace(plan.placement_options, overrides=(), tensor_split=())
    free = [g.capacity or 0 for g in plan.devices.gpus]
    from offload_planner.core.mmproj.attach import FIT_TARGET, fit_margins

    margins = fit_margins(plan.mmproj(), plan.devices, plan.context.flash_attn,
                          FIT_TARGET)  # the server adds a --mmproj projector to the targets
    result = fit_params(plan.model, plan.devices, popts, plan.context, free_bytes=free, margins=margins)
    f_popts, f_ctx = result.apply(popts, plan.context, plan.model.summary.n_layer,
                                  has_gpu=bool(plan.devices.gpus))
    return replace(plan, placement_options=f_popts, context=f_ctx, moves={}), result
