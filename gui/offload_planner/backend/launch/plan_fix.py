"""The smallest plan change that makes a device fit after an out-of-memory failure (experts to
the CPU, fewer layers, a shorter context, a smaller micro-batch), each checked by projecting the
changed command through the core pipeline."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from offload_planner.core.cmdline import Dialect, parse_server_args
from offload_planner.core.devices import DeviceSet
from offload_planner.core.errors import PlannerError
from offload_planner.core.export import layers_regex
from offload_planner.core.memory import Projection, alloc_size, pad
from offload_planner.core.model import Model
from offload_planner.core.units import MiB


@dataclass(frozen=True)
class Suggestion:
    """A plan change: ``summary`` for people, ``args`` the full new server argument list."""

    summary: str
    change: tuple[str, ...]  # the flags added or changed, e.g. ("-ot", "blk\\.(3|4)...=CPU")
    args: tuple[str, ...] = ()
    verified: bool = False  # re-projected with the engine: the device fits
    detail: str = ""


@dataclass
class PlanContext:
    """What the launch was planned from; lets an OOM explanation propose a change that fits."""

    model: Model
    devices: DeviceSet
    args: list[str]  # the server arguments (as the plan has them; -lv/--host/--port may be absent)
    dialect: Dialect = Dialect.LLAMA_CPP
    projection: Projection | None = None


@dataclass(frozen=True)
class _Target:
    device: str
    limit: int  # the device's projected total must not exceed this (bytes)
    basis: str


def _target(ctx: PlanContext, device: str, failed_mib: float | None) -> _Target:
    assert ctx.projection is not None
    total = ctx.projection.device(device).total()
    dev = ctx.devices.by_name(device)
    cap = dev.capacity if dev is not None else None
    if cap is not None and total > cap - (dev.margin if dev else 0):
        limit = cap - (dev.margin if dev else 0)
        return _Target(device, limit, f"{device} has {cap / MiB:.0f} MiB; the plan needs "
                                      f"{total / MiB:.0f} MiB")
    failed = int((failed_mib or 0) * MiB)
    if failed <= 0:
        failed = max(total // 10, MiB)
    return _Target(device, total - failed, f"frees the {failed / MiB:.0f} MiB that failed to allocate "
                                          "(enough whatever else was free; less may do)")


def suggest_fix(ctx: PlanContext, device: str, kind: str | None,
                failed_mib: float | None) -> Suggestion | None:
    """The smallest change that brings ``device`` under its capacity (or frees the failed
    allocation when the capacity is not known), checked by projecting the changed command."""
    target = _target(ctx, device, failed_mib)
    makers: list[Callable[[PlanContext, _Target], Suggestion | None]]
    if device == "CPU":
        makers = [_fewer_ctx, _smaller_ubatch] if kind != "compute" else [_smaller_ubatch, _fewer_ctx]
    elif kind == "kv":
        makers = [_fewer_ctx, _experts_to_cpu, _fewer_layers]
    elif kind == "compute":
        makers = [_smaller_ubatch, _experts_to_cpu, _fewer_layers]
    else:
        makers = [_experts_to_cpu, _fewer_layers, _fewer_ctx]
    for make in makers:
        s = make(ctx, target)
        if s is not None:
            return replace(s, detail=target.basis + (f"; {s.detail}" if s.detail else ""))
    return None


def _reproject(ctx: PlanContext, args: list[str]) -> Projection:
    from offload_planner.core.analysis import command_projection
    from offload_planner.core.plan import plan_from_args

    parsed = parse_server_args(args, dialect=Dialect(ctx.dialect))
    plan = plan_from_args(ctx.model, ctx.devices, parsed.args, ctx.dialect)
    return command_projection(plan)[0]


def _fits(ctx: PlanContext, target: _Target, args: list[str]) -> bool:
    try:
        return _reproject(ctx, args).device(target.device).total() <= target.limit
    except (PlannerError, StopIteration, ValueError):
        return False


def set_flag(args: Sequence[str], key: str, spelling: str, value: str | None, dialect: Dialect) -> list[str]:
    """``args`` without any use of flag ``key`` (canonical, e.g. ``--ctx-size``), plus ``spelling
    value`` at the end (nothing added when ``value`` is None)."""
    parsed = parse_server_args(list(args), dialect=Dialect(dialect))
    drop: set[int] = set()
    for f in parsed.flags:
        if f.key != key or f.index < 0:
            continue
        n = 1 if "=" in args[f.index] and args[f.index].split("=", 1)[0] == f.spelling else 1 + len(f.values)
        drop.update(range(f.index, f.index + n))
    out = [a for i, a in enumerate(args) if i not in drop]
    return out if value is None else [*out, spelling, value]


def _expert_layers(ctx: PlanContext, device: str) -> dict[int, int]:
    assert ctx.projection is not None
    dev = ctx.devices.by_name(device)
    per_layer: dict[int, int] = defaultdict(int)
    for p in ctx.projection.placement.items:
        t = p.tensor
        if p.device != device or t.layer is None or not t.role.is_routed_expert or p.copy:
            continue
        size = alloc_size(t, dev) if dev is not None else t.nbytes
        per_layer[t.layer] += pad(size, dev.alignment if dev is not None else 32)
    return dict(per_layer)


def _layers_possessive(n: int) -> str:
    return "layer's" if n == 1 else "layers'"


def _experts_to_cpu(ctx: PlanContext, target: _Target) -> Suggestion | None:
    assert ctx.projection is not None
    layers = _expert_layers(ctx, target.device)
    if not layers:
        return None
    need = ctx.projection.device(target.device).total() - target.limit
    order = sorted(layers, reverse=True)  # the device's last layers: one contiguous range

    def args_for(n: int) -> list[str]:
        chosen = sorted(order[:n])
        pattern = rf"blk\.{layers_regex(chosen)}\.ffn_(up|gate|down|gate_up)_exps\.=CPU"
        return ["-ot", pattern, *ctx.args]

    acc, n = 0, 0
    while n < len(order) and acc < need:
        acc += layers[order[n]]
        n += 1
    for k in range(n, min(len(order), n + 3) + 1):  # the estimate, then a few more (compute grows)
        if _fits(ctx, target, args_for(k)):
            new = args_for(k)
            return Suggestion(f"move {k} more {_layers_possessive(k)} experts from {target.device} "
                              f"to CPU: add -ot {new[1]}", tuple(new[:2]), tuple(new), True,
                              f"frees {sum(layers[i] for i in order[:k]) / MiB:.0f} MiB of weights; "
                              "they then need as much system RAM")
    if acc >= need:
        new = args_for(n)
        return Suggestion(f"move {n} more {_layers_possessive(n)} experts from {target.device} to CPU: "
                          f"add -ot {new[1]}",
                          tuple(new[:2]), tuple(new), False,
                          f"frees {acc / MiB:.0f} MiB of weights")
    return None


def _largest_fitting(ctx: PlanContext, target: _Target, args_for: Callable[[int], list[str]],
                     lo: int, hi: int) -> int:
    """The largest n in lo..hi whose arguments fit, by bisection (``args_for(lo)`` fits)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _fits(ctx, target, args_for(mid)):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _fewer_layers(ctx: PlanContext, target: _Target) -> Suggestion | None:
    assert ctx.projection is not None
    placement = ctx.projection.placement
    ngl = sum(1 for d in placement.unit_devices if d != "CPU")
    if ngl == 0:
        return None

    def args_for(n: int) -> list[str]:
        return set_flag(ctx.args, "--gpu-layers", "-ngl", str(n), ctx.dialect)

    if not _fits(ctx, target, args_for(0)):
        return None
    lo = _largest_fitting(ctx, target, args_for, 0, ngl - 1)  # the largest -ngl that fits
    return Suggestion(f"offload {ngl - lo} fewer layer{'s' if ngl - lo != 1 else ''}: -ngl {lo}",
                      ("-ngl", str(lo)), tuple(args_for(lo)), True)


def _fewer_ctx(ctx: PlanContext, target: _Target) -> Suggestion | None:
    assert ctx.projection is not None
    if ctx.projection.device(target.device).kv == 0:
        return None
    n_ctx = ctx.projection.context.n_ctx_seq
    steps = n_ctx // 256

    def args_for(k: int) -> list[str]:
        return set_flag(ctx.args, "--ctx-size", "-c", str(k * 256), ctx.dialect)

    if steps < 2 or not _fits(ctx, target, args_for(1)):
        new = args_for(max(1, steps // 2))
        return Suggestion(f"halve the context: -c {max(1, steps // 2) * 256}", ("-c", new[-1]), tuple(new),
                          False, "halves the KV cache; -ctk q8_0 -ctv q8_0 would halve it too")
    lo = _largest_fitting(ctx, target, args_for, 1, steps - 1)
    return Suggestion(f"reduce the context to -c {lo * 256}", ("-c", str(lo * 256)), tuple(args_for(lo)),
                      True,
                      "or keep it and quantize the KV cache (-ctk q8_0 -ctv q8_0)")


def _smaller_ubatch(ctx: PlanContext, target: _Target) -> Suggestion | None:
    assert ctx.projection is not None
    ub = ctx.projection.context.n_ubatch
    candidates = [ub >> k for k in range(1, int(math.log2(max(ub, 1))) + 1) if ub >> k >= 16]
    for c in candidates:
        args = set_flag(ctx.args, "--ubatch-size", "-ub", str(c), ctx.dialect)
        if _fits(ctx, target, args):
            note = "below 32 weights in RAM are no longer copied to the GPU for prompts" if c < 32 else ""
            return Suggestion(f"use a smaller micro-batch: -ub {c}", ("-ub", str(c)), tuple(args), True,
                              "slower prompt processing" + (f"; {note}" if note else ""))
    return None
