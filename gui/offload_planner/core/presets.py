"""Preset edits of a plan, as move maps (tensor name -> device, None = back to the command's default).

The window turns each result into one undoable MoveTensors step.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

from offload_planner.core.device_figures import DeviceFigures
from offload_planner.core.devices import Device
from offload_planner.core.fit import FitResult, fit_params
from offload_planner.core.mapped_span import (
    extents,
    mapped_span,
    mapping_gpus,
    merged_extents,
    span_bytes,
    unified_over,
)
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

    A GPU that maps the file (Metal with mmap: ``MTL0_Mapped``) holds the file span from the first to
    the last of its tensors, so a layer costs what it adds to that span, not its size: experts inside
    the span of its other tensors cost nothing and are always taken, and moving them off frees nothing
    (:func:`_by_span`). There, when even the layers it keeps leave the device over (its other tensors'
    span alone is over), nothing is moved: the plan it would make is over too.
    """
    dev = plan.devices.by_name(device)
    if dev is None or dev.capacity is None:
        return {}
    ex = _expert_layers(plan, placement, dev, spill)
    order = [il for il in sorted(ex.by_layer, reverse=not from_first)
             if not (il in ex.elsewhere and il not in ex.on_dev)]
    mapping = device in mapping_gpus(plan)
    if mapping:
        kept, target = _by_span(placement, projection, dev, ex, order, spill)
    else:
        kept, target = _by_size(projection, dev, ex, order, spill)
    moves: Moves = {n: t for il, t in target.items() for n, current in ex.by_layer[il] if current != t}
    while kept and DeviceFigures.of(plan.with_moves(moves).projection().device(device)).over:
        for name, current in ex.by_layer[kept.pop()]:
            if current == spill:
                moves.pop(name, None)
            else:
                moves[name] = spill
    if mapping and _over_after(plan, moves, device, projection):
        return {}
    return moves


@dataclass
class _ExpertLayers:
    """The movable routed experts per layer, with where each is, and each layer's size on the device."""

    by_layer: dict[int, list[tuple[str, str]]] = field(default_factory=lambda: defaultdict(list))
    cost: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    held: int = 0  # bytes of them on the device
    on_dev: set[int] = field(default_factory=set)  # layers with experts on the device
    elsewhere: set[int] = field(default_factory=set)  # layers with experts on another GPU


def _expert_layers(plan: Plan, placement: Placement, dev: Device, spill: str) -> _ExpertLayers:
    ex = _ExpertLayers()
    for p in placement.items:
        t = p.tensor
        if not t.role.is_routed_expert or t.layer is None or p.copy or p.device is None:
            continue
        if not _movable(plan, t.name):
            continue
        size = pad(alloc_size(t, dev), dev.alignment)
        ex.by_layer[t.layer].append((t.name, p.device))
        ex.cost[t.layer] += size
        if p.device == dev.name:
            ex.held += size
            ex.on_dev.add(t.layer)
        elif p.device != spill:
            ex.elsewhere.add(t.layer)
    return ex


def _by_size(projection: Projection, dev: Device, ex: _ExpertLayers, order: list[int], spill: str
             ) -> tuple[list[int], dict[int, str]]:
    """Layers in ``order`` while their sizes fit the room left besides the device's experts; after the
    first that does not, none (the kept layers, and each layer's target)."""
    room = dev.capacity or 0
    room -= dev.margin + projection.device(dev.name).total() - ex.held
    kept: list[int] = []
    target: dict[int, str] = {}
    full = False
    for il in order:
        fits = not full and ex.cost[il] <= room
        if fits:
            room -= ex.cost[il]
            kept.append(il)
        else:
            full = True
        target[il] = dev.name if fits else spill
    return kept, target


def _by_span(placement: Placement, projection: Projection, dev: Device, ex: _ExpertLayers, order: list[int],
             spill: str) -> tuple[list[int], dict[int, str]]:
    """:func:`_by_size` where the device maps the file: a layer costs the bytes it adds to the span of the
    device's tensors (its other tensors' span, then the layers kept). Layers inside that span cost
    nothing: kept whatever came before them, and first in the kept list, so that the check after
    the projection sends the costly ones back first."""
    movable = {n for names in ex.by_layer.values() for n, _ in names}
    fixed = extents(p.tensor for p in placement.items if p.device == dev.name
                     and p.buft == dev.mapped_buffer_name and p.tensor.name not in movable)
    tensors = {t.name: t for p in placement.items if (t := p.tensor).name in movable}
    layer = {il: extents(tensors[n] for n, _ in ex.by_layer[il]) for il in order}
    dm = projection.device(dev.name)
    span_now, _ = mapped_span(dm)
    room = (dev.capacity or 0) - dev.margin - (DeviceFigures.of(dm).used - span_now) - span_bytes(fixed)
    kept = [il for il in order if span_bytes(merged_extents(fixed, layer[il])) == span_bytes(fixed)]
    target = dict.fromkeys(kept, dev.name)
    cur, full = fixed, False
    for il in order:
        if il in target:
            continue
        new = merged_extents(cur, layer[il])
        cost = span_bytes(new) - span_bytes(cur)
        fits = cost == 0 or (not full and cost <= room)
        if fits:
            room, cur = room - cost, new
            kept.append(il)
        else:
            full = True
        target[il] = dev.name if fits else spill
    return kept, target


def _over_after(plan: Plan, moves: Moves, device: str, before: Projection) -> bool:
    """The plan with ``moves`` is over on ``device``, or a Mac's CPU and Metal GPUs take more of its
    one memory than before (:func:`~offload_planner.core.mapped_span.unified_over`)."""
    after = plan.with_moves(moves).projection()
    return bool(DeviceFigures.of(after.device(device)).over) or unified_over(after) > unified_over(before)


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


def held_by_rules(plan: Plan) -> tuple[int, list[str]]:
    """The routed-expert tensors the command's own ``-ot`` rules place, and the devices they put them on
    (0, [] where none): a search that keeps the user's rules (the window's Fastest plan, ``fit``) leaves
    them there, so ``-ot exps=CPU`` keeps every expert on the CPU however much room the GPUs have."""
    held = [p for p in plan.placement().items if p.tensor.role.is_routed_expert and p.rule.startswith("-ot ")]
    return len(held), sorted({p.device or CPU for p in held})


def held_by_rules_text(plan: Plan) -> str:
    """"48 routed-expert tensors stay on CPU by the command's -ot rules (the search keeps your rules:
    remove one to let it place those experts)"; "" where the rules hold none."""
    n, on = held_by_rules(plan)
    if not n:
        return ""
    return (f"{n} routed-expert tensors stay on {', '.join(on)} by the command's -ot rules (the search keeps "
            "your rules: remove one to let it place those experts)")

