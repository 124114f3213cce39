"""What would make a plan faster, read off its speed estimate and its projection (no new speed model):
the figures behind the hints that ``plan`` prints under its bottlenecks and the window's Memory pane
shows while everything fits.

A newcomer read "tg bottleneck: CPU memory bandwidth (66% of the time per token)" and "pp bottleneck:
op offload copies over the host link (84% of the prompt time)" and had no word of what to change: that
the GPU's free memory takes routed experts off the RAM, that a larger ``-ub`` copies the CPU's experts
fewer times a prompt, that the always-active weights belong on a GPU before any routed expert.
"""

from __future__ import annotations

from dataclasses import dataclass

from offload_planner.core.devices import DeviceKind
from offload_planner.core.memory import Projection
from offload_planner.core.placement import Placed, Placement
from offload_planner.core.plan import Plan
from offload_planner.core.roles import Role
from offload_planner.core.speed.result import SpeedEstimate

#: GPUs whose memory is not the host's RAM and that llama-server computes on in this process.
_OWN_MEMORY = frozenset({DeviceKind.CUDA, DeviceKind.ROCM, DeviceKind.SYCL, DeviceKind.VULKAN})
#: Always-active bytes on the CPU from which they are worth a hint (norms and small biases are not).
MIN_ALWAYS_ACTIVE = 64 * 1024**2
#: The pp bottleneck's name for op offload (core.speed.bottleneck).
OP_OFFLOAD = "op offload copies over the host link"
#: The estimate's assumption that op offload copies mmap'd host weights (core.speed.estimate).
PAGEABLE = "op offload copies from pageable host weights"


@dataclass(frozen=True)
class FasterHints:
    """What the estimate and the projection say would help; empty fields: nothing to say there."""

    cpu: str  # the CPU device's name
    tg_share: float  # of a token's time, the CPU's RAM reads (when they are the tg bottleneck; else 0)
    room: tuple[tuple[str, int], ...]  # GPUs with room (margin kept) for a routed-expert tensor on the CPU
    always_active_cpu: int  # bytes of always-active weights on the CPU of a MoE model with a GPU
    pp_share: float  # of a prompt's time, the op-offload copies (when they are the pp bottleneck; else 0)
    n_ubatch: int
    held: int = 0  # routed-expert tensors on the CPU by the command's -ot rules or the window's moves
    pin: str = ""  # op offload binds a prompt and copies mmap'd (pageable) weights: the flags that pin them
    moe: bool = True  # what op offload copies: routed experts (a MoE model's host weights), else weights

    def __bool__(self) -> bool:
        return bool(self.room or self.always_active_cpu or self.pp_share or self.pin)


def _share(bottleneck: str) -> float:
    """``"... (66% of the time per token)"`` -> 0.66."""
    head, _, tail = bottleneck.rpartition(" (")
    pct = tail.split("%", 1)[0]
    return int(pct) / 100 if head and pct.isdigit() else 0.0


def _on_cpu(plan: Plan, placement: Placement) -> list[Placed]:
    cpu = plan.devices.cpu.name
    return [p for p in placement.items if p.device == cpu and p.tensor.role is not Role.NEXTN]


def expert_room(plan: Plan, projection: Projection,
                placement: Placement | None = None) -> tuple[tuple[str, int], ...]:
    """The GPUs (with memory of their own) with room for a routed-expert tensor the CPU holds: (name,
    bytes of room), the room as ``fit`` and the window's Fastest plan count it (capacity less the
    margin, 1 GiB unless given, less what the projection puts there); () with no expert on the CPU."""
    from offload_planner.core.speed.candidate import room as room_of

    experts = [p.tensor.nbytes for p in _on_cpu(plan, placement or plan.placement())
               if p.tensor.role.is_routed_expert]
    if not experts:
        return ()
    left = room_of(projection, plan.devices)
    return tuple((d.name, left[d.name]) for d in plan.devices.gpus
                 if d.kind in _OWN_MEMORY and left.get(d.name, 0) >= min(experts))


def held_on_cpu(plan: Plan, placement: Placement | None = None) -> int:
    """Routed-expert tensors on the CPU by the command's own ``-ot`` rules (``presets.held_by_rules``'
    test) or by the window's moves: the search (``fit``, Fastest plan) keeps both, so it leaves them
    there however much room the GPUs have (``-ot exps=CPU``, or Presets ▸ All routed experts → CPU)."""
    cpu = plan.devices.cpu.name
    return sum(1 for p in _on_cpu(plan, placement or plan.placement()) if p.tensor.role.is_routed_expert
               and (p.rule.startswith("-ot ") or plan.moves.get(p.tensor.name) == cpu))


def faster_hints(plan: Plan, projection: Projection, est: SpeedEstimate,
                 placement: Placement | None = None) -> FasterHints:
    """The hints of ``plan`` whose projection and estimate these are (``placement``: the plan's, when
    the caller has it); a GPU's room is what ``fit`` and the window's Fastest plan may fill (capacity
    less its margin, 1 GiB unless given, less what it holds)."""
    cpu = plan.devices.cpu.name
    moe = bool(plan.model.summary.n_expert)
    gpus = [d for d in plan.devices.gpus if d.kind in _OWN_MEMORY]
    placement = placement or plan.placement()
    on_cpu = _on_cpu(plan, placement)
    tg_cpu = est.bottleneck.startswith(f"{cpu} memory bandwidth")
    room = expert_room(plan, projection, placement) if tg_cpu else ()
    always = 0
    if moe and gpus:
        always = sum(p.tensor.nbytes for p in on_cpu if not p.tensor.role.is_routed_expert
                     and (p.tensor.role is not Role.TOKEN_EMBD or p.copy))
    copies = est.op_offload and est.pp_bottleneck.startswith(OP_OFFLOAD)
    # one micro-batch already holds the whole prompt: a larger one copies nothing less
    pp = copies and est.n_ubatch < est.prompt
    # the estimate's own assumption: copies from the mmap'd (pageable) weights run at half the pinned rate
    pageable = copies and any(a.what.startswith(PAGEABLE) for a in est.assumptions)
    return FasterHints(cpu=cpu, tg_share=_share(est.bottleneck) if tg_cpu else 0.0, room=room,
                       always_active_cpu=always if always >= MIN_ALWAYS_ACTIVE else 0,
                       pp_share=_share(est.pp_bottleneck) if pp else 0.0, n_ubatch=est.n_ubatch,
                       held=held_on_cpu(plan, placement) if room else 0,
                       pin=" ".join(plan.dialect.no_mmap_flags) if pageable else "", moe=moe)


def faster_lines(h: FasterHints) -> list[str]:
    """``plan``'s text under the bottlenecks: what would help, each with the change to make, and the
    command that searches it (``fit``); [] when there is nothing to say."""
    from offload_planner.core.units import fmt_bytes

    if not h:
        return []
    out = ["  to make it faster:"]
    if h.always_active_cpu:
        out.append(f"    tg: {fmt_bytes(h.always_active_cpu)} of always-active weights (attention, shared "
                   "experts, dense FFN, output: every token reads all of them) are on the CPU: they gain "
                   "more on a GPU than routed experts do (-ngl 999, with --cpu-moe or -ot exps=CPU keeping "
                   "the routed experts on the CPU)")
    if h.room:
        gpus = " and ".join(f"{n}'s {fmt_bytes(b)}" for n, b in h.room)
        their = "its margin" if len(h.room) == 1 else "their margins"
        out.append(f"    tg: the {h.cpu}'s RAM reads take {h.tg_share:.0%} of a token, and {gpus} free "
                   f"beyond {their} (1 GiB unless given) can take routed experts: there they are read at "
                   f"the GPU's bandwidth instead (-ot 'blk\\.N\\.ffn_.*_exps={h.room[0][0]}' for a layer N, "
                   "ahead of --cpu-moe or your exps=CPU rule)")
    if h.pp_share:
        out.append(f"    pp: op offload takes {h.pp_share:.0%} of a prompt: the {h.cpu}'s weights are copied "
                   f"to the GPU once per micro-batch (-ub {h.n_ubatch}); a larger -ub (with -b at least "
                   "as large) copies them fewer times a prompt, for a larger GPU compute buffer")
    if h.pin:
        out.append(f"    pp: those copies read the mmap'd model file (pageable memory), at half the rate of "
                   f"pinned memory (an assumption, below): {h.pin} loads the {h.cpu}'s weights into pinned "
                   "RAM instead (the same bytes, read at load)")
    if h.room or h.pp_share:  # what fit searches: where the routed experts go, and -ub (not -ngl, not mmap)
        what = ("where the routed experts go and the -ub" if h.moe
                else "the -ub (a dense model's layers stay where -ngl puts them)")
        out.append(f"    `offload-planner fit` with the same options and arguments searches {what} for you"
                   + (held_text(h.held) if h.held else ""))
    return out


def held_text(n: int) -> str:
    """After the pointer to ``fit`` where the command's rules hold routed experts on the CPU."""
    return (f", but keeps your -ot rules, which hold {n} routed-expert tensors on the CPU: drop the rule "
            "that sends them there (fit adds --cpu-moe itself) to let it place them")


def layer_spans(layers: list[int]) -> str:
    """``0-1, 11, 59-60``."""
    runs: list[list[int]] = []
    for il in sorted(layers):
        if runs and il == runs[-1][1] + 1:
            runs[-1][1] = il
        else:
            runs.append([il, il])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def layers_text(layers: list[int]) -> str:
    """``layer 3``, ``2 layers (3-4)``, ``5 layers (3-4, 10, 59-60)``: which layers, not only how many."""
    return f"layer {layers[0]}" if len(layers) == 1 else f"{len(layers)} layers ({layer_spans(layers)})"


def experts_text(plan: Plan, placement: Placement) -> str:
    """Which GPU holds which layers' routed experts, in words (the command says it as an -ot regex a
    newcomer cannot read): ``routed experts by device: CUDA0 layer 3, CUDA1 2 layers (59-60) + 3
    tensors of 2 layers (57-58), CPU the other 55 layers`` ("" without routed experts on a GPU)."""
    cpu = plan.devices.cpu.name
    by_layer: dict[int, list[str]] = {}
    for p in placement.items:
        t = p.tensor
        if t.role.is_routed_expert and t.layer is not None and p.device is not None and not p.copy:
            by_layer.setdefault(t.layer, []).append(p.device)
    parts = []
    for g in plan.devices.gpus:
        whole = [il for il, devs in by_layer.items() if set(devs) == {g.name}]
        some = {il: devs.count(g.name) for il, devs in by_layer.items()
                if g.name in devs and il not in whole}
        if not whole and not some:
            continue
        n = sum(some.values())
        singles = f"{n} tensor{'s' if n > 1 else ''} of {layers_text(list(some))}" if some else ""
        said = (layers_text(whole) if whole else "", singles)
        parts.append(f"{g.name} " + " + ".join(x for x in said if x))
    if not parts:
        return ""
    rest = sum(1 for devs in by_layer.values() if set(devs) == {cpu})
    tail = f", {cpu} the other {rest} layers" if rest else ""
    return "routed experts by device: " + ", ".join(parts) + tail
