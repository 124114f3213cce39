"""A plan: model + devices + options + the user's moves, projected as llama.cpp would allocate it.

Data flows one way: ``Plan`` -> :class:`Placement` -> :class:`Projection` -> views and command line.
The base placement comes from the command-line settings (-ngl, -ts, -ot of a pasted command);
user moves (tensor name -> device) are applied on top, as llama.cpp applies -ot overrides: the
tensor's buffer type is chosen again on its new device, and KV stays with the layer's device.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from offload_planner.core.devices import DeviceSet, llama_order
from offload_planner.core.dialects import LLAMA_CPP, Dialect
from offload_planner.core.extra_context import attach
from offload_planner.core.item_changes import note_changed
from offload_planner.core.kv_override import file_model, loaded, overrides_in
from offload_planner.core.memory import (
    DEFAULT_N_BATCH,
    DEFAULT_N_UBATCH,
    Buffer,
    ContextParams,
    Projection,
    project,
)
from offload_planner.core.mmproj.attach import (
    MmprojSetup,
    add_to_projection,
    argv_mmproj_setup,
    mmproj_buffers,
    project_setup,
)
from offload_planner.core.model import Model
from offload_planner.core.placement import (
    CPU,
    Override,
    Placed,
    Placement,
    PlacementOptions,
    device_buft,
    place,
    placed_devices,
    selected_gpus,
)
from offload_planner.core.roles import ROUTED_EXPERT_ROLES
from offload_planner.core.speculative import SpecSettings, extra_contexts, load_spec


def _dedupe_tied_copy(items: list[Placed]) -> list[Placed]:
    """llama.cpp reuses the token embedding for the output when both land in one buffer type."""
    orig = next((p for p in items if p.tensor.name == "token_embd.weight" and not p.copy), None)
    if orig is None:
        return items
    return [p for p in items if not (p.copy and (p.device, p.buft) == (orig.device, orig.buft))]


@functools.lru_cache(maxsize=16)
def _cached_place(model: Model, devices: DeviceSet, opts: PlacementOptions) -> Placement:
    return place(model, devices, opts)


@functools.lru_cache(maxsize=16)
def _item_index(model: Model, devices: DeviceSet, opts: PlacementOptions) -> dict[str, list[int]]:
    """Positions of each tensor's items (the tensor, its output copy) in the base placement's list
    (``place`` is deterministic: the same for every placement of these arguments)."""
    index: dict[str, list[int]] = {}
    for i, p in enumerate(_cached_place(model, devices, opts).items):
        index.setdefault(p.tensor.name, []).append(i)
    return index


@dataclass
class Plan:
    model: Model
    devices: DeviceSet
    placement_options: PlacementOptions
    context: ContextParams  # its ``dialect`` is the plan's: stored there once
    moves: dict[str, str] = field(default_factory=dict)  # tensor name -> device name
    extra_args: list[str] = field(default_factory=list)  # passthrough flags, kept verbatim
    spec: SpecSettings | None = None  # a draft model / the MTP context (core.speculative)
    #: the LLAMA_ARG_* variables that set flags the plan keeps (not exported: the environment sets
    #: them at launch too); read with ``extra_args``, which win, as llama-server reads them
    env: dict[str, str] = field(default_factory=dict)
    #: the load mode maps the model but the build turned mmap off for what the plan places on the host
    #: (ik from PR 1510: a weight sent to the CPU by an -ot rule); an edit that takes the cause away
    #: maps it again (``placement_options.use_mmap`` is the mmap the server uses)
    mmap_off_by_overrides: bool = False

    def __post_init__(self) -> None:
        """What placement takes from the dialect follows it (the output layer first; no CPU_REPACK
        buffers where the build has none; mmap off where its rule turns it off)."""
        d, po = self.dialect, self.placement_options
        repack = po.use_extra_bufts and d.has_cpu_repack
        if (po.output_first, po.use_extra_bufts, po.plain_cpu_overrides) != (
                d.output_first, repack, d.plain_cpu_overrides):
            self.placement_options = replace(po, output_first=d.output_first, use_extra_bufts=repack,
                                             plain_cpu_overrides=d.plain_cpu_overrides)
        self._follow_the_mmap_rule()
        self._load_with_overrides()

    def _load_with_overrides(self) -> None:
        """The model as llama.cpp loads it: the file's, with the kept ``--override-kv`` items it models
        (:func:`~offload_planner.core.kv_override.loaded`; the file's again once they are gone)."""
        ovs = overrides_in(self.extra_args, self.dialect.kv_override_csv)
        if ovs or file_model(self.model) is not self.model:
            self.model = loaded(self.model, ovs)

    def _follow_the_mmap_rule(self) -> None:
        """``use_mmap`` as the server will have it after the edits: mapped when the load mode asks for it,
        unless the dialect turns mmap off for a weight on the host (``host_overrides_turn_mmap_off``) and
        the plan has one there by a rule: the command's ``-ot ...=CPU``, or a move to the CPU of a
        weight the command places elsewhere (the exported command sends it there by ``-ot NAME=CPU``,
        adding ``--no-mmap``: :func:`plan_command`)."""
        po = self.placement_options
        wanted = po.use_mmap or self.mmap_off_by_overrides
        off = wanted and self.dialect.host_overrides_turn_mmap_off and self._weights_ruled_to_host()
        if (po.use_mmap, self.mmap_off_by_overrides) != (wanted and not off, off):
            self.placement_options = replace(po, use_mmap=wanted and not off)
            self.mmap_off_by_overrides = off

    def _weights_ruled_to_host(self) -> bool:
        """A weight placed on the CPU by a rule: the command's (as ik reads them) or the export's (a move
        to the CPU of a weight that the command's settings without its rules place on a GPU)."""
        from offload_planner.core.engine import places_on_host

        po = self.placement_options
        if places_on_host(self.model, po.overrides):
            return True
        to_cpu = [name for name, dev in self.moves.items() if dev == CPU]
        if not to_cpu:
            return False
        start = replace(po, overrides=())
        items = _cached_place(self.model, self.devices, start).items
        index = _item_index(self.model, self.devices, start)
        return any(items[i].device not in (CPU, None) for name in to_cpu for i in index.get(name, ()))

    @property
    def dialect(self) -> Dialect:
        return self.context.dialect

    def base_placement(self) -> Placement:
        """What the command-line settings alone place (cached: plans differ mostly in moves)."""
        return _cached_place(self.model, self.devices, self.placement_options)

    def placement(self) -> Placement:
        """The base placement with the user's moves applied as llama.cpp applies -ot entries: the
        buffer type is chosen again on the new device; a moved ``token_embd`` of a tied-embedding
        model takes its output copy along (-ot matches both: they share the name)."""
        base = self.base_placement()
        if not self.moves:
            return base
        index = _item_index(self.model, self.devices, self.placement_options)
        items = list(base.items)
        moved = tied = False
        changed: list[int] = []
        for name, dev in self.moves.items():  # O(moves): only the moved tensors' items change
            for i in index.get(name, ()):
                p = base.items[i]
                if p.device is None or dev == p.device:
                    continue
                moved = True
                changed.append(i)
                tied = tied or name == "token_embd.weight"
                buft = device_buft(dev, p.tensor, self.devices, self.placement_options, as_output=p.copy,
                                   cpu_override=True)  # exported as -ot NAME=CPU
                items[i] = Placed(p.tensor, dev, buft, "moved in the planner", copy=p.copy)
        if tied:  # the base holds no copy equal to its original (``place``): only a move makes one
            items = _dedupe_tied_copy(items)
        else:  # (the parts of a projection that compare items with the base's need not scan for them)
            note_changed(items, base.items, sorted(changed))
        return dataclasses.replace(base, items=items, has_overrides=base.has_overrides or moved)

    def projection(self, *, placement: Placement | None = None,
                   compute: list[Buffer] | None = None) -> Projection:
        """Every buffer the server allocates for this plan: the model's context, the ``--mmproj``
        projector and the draft/MTP contexts.  ``placement``: this plan's, when already computed;
        ``compute``: the model context's compute buffers, when known (memory.project)."""
        placement = self.placement() if placement is None else placement
        proj = project(self.model, self.devices, placement, self.context, compute=compute)
        if self.spec is not None and self.spec.active:  # the server loads the draft, then the projector
            proj = attach(proj, extra_contexts(self.model, self.devices, placement, self.context,
                                               proj.context, self.spec))
        return add_to_projection(proj, self.mmproj_buffers()[0])

    def mmproj(self) -> MmprojSetup | None:
        """The ``--mmproj`` projector the server loads: from the kept flags, over the environment's; its
        device without ``-mmdev`` is the first of ``-dev``'s (common/arg.cpp), which the plan keeps."""
        setup = argv_mmproj_setup(tuple(self.extra_args), tuple(self.env.items()))
        selected = self.placement_options.selected
        if setup is None or selected is None:
            return setup
        return replace(setup, devices=selected or ("none",))

    def mmproj_buffers(self) -> tuple[list[Buffer], list[str]]:
        """The projector's buffers (none without one, or where the dialect's are not projected) and
        the notes on what is not projected."""
        setup = self.mmproj()
        if setup is None:
            return [], []
        if not self.dialect.projects_mmproj:
            return [], [f"--mmproj: the projector's memory is projected for the pinned llama.cpp only, "
                        f"not {self.dialect}"]
        mb = project_setup(setup, self.devices, self.context.flash_attn)  # -fa auto: on, as clip takes it
        return mmproj_buffers(mb, self.devices), [f"--mmproj {mb.projector.name}: {mb.why}"] if mb.why else []

    def with_moves(self, moves: Mapping[str, str | None]) -> Plan:
        """This plan with the user's move of each named tensor set (a device) or cleared (None:
        back to where the command places it)."""
        merged = dict(self.moves)
        for name, dev in moves.items():
            if dev is None:
                merged.pop(name, None)
            else:
                merged[name] = dev
        return replace(self, moves=merged)

    def movable(self, name: str) -> tuple[bool, str]:
        """Can the user move this tensor? llama.cpp skips NextN blocks without MTP."""
        t = self.model.get(name)
        if t is None:
            return False, "no such tensor"
        from offload_planner.core.roles import Role

        if t.role is Role.NEXTN and not self.placement_options.load_mtp:
            return False, "NextN/MTP block: llama.cpp does not load it without MTP"
        return True, ""


def overrides_of(plan: Plan) -> tuple[Override, ...]:
    return plan.placement_options.overrides


#: Flags (canonical keys) that :func:`plan_command` writes itself from the plan.
REGENERATED_FLAGS = frozenset({
    "--model", "--rpc", "--ctx-size", "--gpu-layers", "--tensor-split", "--split-mode", "--main-gpu",
    "--override-tensor", "--cpu-moe", "--n-cpu-moe", "--batch-size", "--ubatch-size", "--parallel",
    "--kv-unified", "--flash-attn", "--cache-type-k", "--cache-type-v", "--kv-offload", "--no-kv-offload",
    "--swa-full", "--load-mode", "--mmap", "--no-mmap", "--mlock", "--no-host", "--repack", "--fit",
    "--mla-use", "--attention-max-batch", "--device",
})


def kept_args(parsed: Any) -> list[str]:
    """Every command-line flag the plan does not regenerate, verbatim and in order (--host,
    --port, -a, -t, --jinja, ik's -mla/-amb, ...); flags set through the environment stay there."""
    out: list[str] = []
    for f in getattr(parsed, "flags", []):
        if f.index < 0 or f.key in REGENERATED_FLAGS:
            continue
        out += [f.spelling, *f.values]
    return out


def kept_env(parsed: Any) -> dict[str, str]:
    """The variables that set, through the environment, flags the plan does not regenerate."""
    return {f.env: f.values[0] if f.values else "1" if f.positive else "0"
            for f in getattr(parsed, "flags", []) if f.index < 0 and f.env and f.key not in REGENERATED_FLAGS}


def plan_from_args(model: Model, devices: DeviceSet, args: Any, dialect: Dialect = LLAMA_CPP,
                   passthrough: list[str] | None = None) -> Plan:
    """A plan whose base is what llama-server would do with these arguments (a ParsedArgs, whose
    other flags are kept for the exported command, or bare ServerArgs)."""
    from offload_planner.core.engine import context_params, mmap_requested, placement_options

    extra = list(passthrough) if passthrough is not None else kept_args(args)
    model = loaded(model, overrides_in(extra, Dialect(dialect).kv_override_csv))
    popts = placement_options(model, devices, args, dialect)
    cparams, _ = context_params(model, args, dialect)
    spec = load_spec(devices, args, dialect, placement_options)
    extra = Dialect(dialect).draft_kept_args(extra, spec.draft)
    return Plan(model, devices, popts, cparams, extra_args=extra, spec=spec, env=kept_env(args),
                mmap_off_by_overrides=mmap_requested(args, dialect) and not popts.use_mmap)


def _units_per_gpu(placement: Placement, gpus: list[str]) -> list[int]:
    return [sum(1 for d in placement.unit_devices if d == g) for g in gpus]


def plan_command(plan: Plan) -> list[str]:
    """The shortest argument list that makes llama-server reproduce this plan, pinning what would
    otherwise vary at run time (-c, -ngl, -ts, --fit)."""
    m, opts, ctx = plan.model, plan.placement_options, plan.context
    target = plan.placement().tensor_devices()
    chosen = selected_gpus(plan.devices, opts)
    gpus = [g.name for g in chosen]
    base_opts = replace(opts, overrides=())
    argv: list[str] = ["-m", m.path]
    # every server, by its devices' numbers: -dev names them RPC<i> in --rpc order (a device set in the
    # order a -dev run logged them, devices_from_log, may list RPC1 first)
    rpc = [g.endpoint for g in sorted(plan.devices.gpus, key=llama_order) if g.endpoint]
    if rpc:
        argv += ["--rpc", ",".join(rpc)]
    if opts.selected is not None:
        argv += ["-dev", ",".join(plan.dialect.dev_name(d) for d in chosen) or "none"]  # those it has
    argv += ["-c", str(ctx.n_ctx or m.summary.n_ctx_train)]
    n_layer = m.summary.n_layer
    ngl = opts.n_gpu_layers
    argv += ["-ngl", "999" if ngl > n_layer else str(ngl)]
    if len(gpus) > 1 and opts.split_mode != "none":  # units do not depend on the overrides
        argv += ["-ts", ",".join(str(n) for n in _units_per_gpu(plan.base_placement(), gpus))]
    if opts.split_mode != "layer":
        argv += ["-sm", opts.split_mode]
        if opts.split_mode == "none":
            argv += ["-mg", str(opts.main_gpu)]
    ot, host = _shortest_overrides(plan, target, base_opts)
    argv += ot
    argv += _context_flags(ctx, plan.dialect)
    argv += plan.dialect.mla_flags(m, ctx)
    if not opts.use_mmap or host:  # ik turns mmap off for it anyway: the command says so
        argv += list(plan.dialect.no_mmap_flags)
    if opts.no_host:
        argv += ["--no-host"]
    if not opts.use_extra_bufts and plan.dialect.has_cpu_repack:  # -nr only where CPU_REPACK exists
        argv += ["-nr"]
    if plan.dialect.fits_by_default:
        argv += ["-fit", "off"]
    return argv + plan.extra_args


def _shortest_overrides(plan: Plan, target: dict[str, str], base_opts: PlacementOptions
                        ) -> tuple[list[str], bool]:
    """The shortest way to place every tensor on its ``target`` device from ``base_opts``: -ot
    patterns after one of the MoE shorthands (:func:`_moe_shorthands`; the first of equal length),
    and whether they turn mmap off where mmap was on (ik from PR 1510: a weight overridden to the
    CPU; then exact patterns are used instead of grouped ones when they avoid it).

    A shorthand's patterns only grow when checked (:func:`~offload_planner.core.export.fit_overrides`
    adds exact ones), so the unchecked ones bound its length from below: shorthands are checked
    shortest bound first, and one whose bound cannot beat the best found is not checked at all."""
    from offload_planner.core.export import candidate_overrides, fit_overrides

    m = plan.model
    buft = {n: plan.dialect.server_device_name(b) for n, b in plan.devices.buffer_types().items()}
    placed: dict[tuple[Override, ...], dict[str, str]] = {}
    if not plan.moves:  # the plan's own rules place what it places (placed_devices is place's devices)
        placed[tuple(plan.placement_options.overrides)] = target

    def devices_with(ovs: tuple[Override, ...]) -> dict[str, str]:
        if ovs not in placed:
            placed[ovs] = placed_devices(m, plan.devices, replace(base_opts, overrides=ovs))
        return placed[ovs]

    def argv_of(ovs: list[Override], flags: list[str]) -> list[str]:
        # -ot before the shorthand: llama.cpp appends --cpu-moe's entries at its position
        ot = ",".join(f"{o.pattern}={buft.get(o.buft, o.buft)}" for o in ovs)
        return (["-ot", ot] if ovs else []) + flags

    def length(argv: list[str]) -> int:
        return len(" ".join(argv))

    todo = []
    for i, (flags, fixed) in enumerate(_moe_shorthands(m, target, plan.dialect)):
        start = devices_with(tuple(fixed))
        cands = candidate_overrides(m, start, target)
        todo.append((length(argv_of(cands, flags)), i, flags, fixed, start, cands))
    best: tuple[int, int, list[str], tuple[Override, ...]] | None = None
    for bound, i, flags, fixed, start, cands in sorted(todo, key=lambda c: c[:2]):
        if best is not None and (bound, i) > best[:2]:
            break  # neither shorter nor earlier than the best

        def place_with(ovs: list[Override], fixed: list[Override] = fixed) -> Mapping[str, str | None]:
            return devices_with((*ovs, *fixed))

        ovs = fit_overrides(m, start, target, place_with, cands)
        cand = argv_of(ovs, flags)
        if best is None or (length(cand), i) < best[:2]:
            best = (length(cand), i, cand, (*ovs, *fixed))
    if best is None:
        return [], False
    return _keeping_mmap(plan, best[2], best[3], target, base_opts, devices_with)


def _keeping_mmap(plan: Plan, argv: list[str], chosen: tuple[Override, ...], target: dict[str, str],
                  base_opts: PlacementOptions, devices_with: Callable[[tuple[Override, ...]], dict[str, str]]
                  ) -> tuple[list[str], bool]:
    """``argv`` (made of the rules ``chosen``) and whether they send a weight to the CPU while the
    plan maps the model: ik then turns mmap off (``use_mmap_buffer &= !has_buft_overrides``), so
    exact patterns (a CPU rule only for what the target itself moves there) replace grouped ones
    when they avoid it; else the command must say --no-mmap to mean what ik does."""
    from offload_planner.core.engine import places_on_host
    from offload_planner.core.export import exact_overrides, fit_overrides

    m = plan.model
    if not (plan.dialect.host_overrides_turn_mmap_off and base_opts.use_mmap and places_on_host(m, chosen)):
        return argv, False
    start = devices_with(())
    ovs = fit_overrides(m, start, target, lambda o: devices_with(tuple(o)), exact_overrides(m, start, target))
    if places_on_host(m, tuple(ovs)):
        return argv, True
    buft = {n: plan.dialect.server_device_name(b) for n, b in plan.devices.buffer_types().items()}
    return ["-ot", ",".join(f"{o.pattern}={buft.get(o.buft, o.buft)}" for o in ovs)], False


def _moe_shorthands(model: Model, target: dict[str, str], dialect: Dialect
                    ) -> list[tuple[list[str], list[Override]]]:
    """Ways to start the -ot list: nothing, --cpu-moe, or --n-cpu-moe N (mainline: the experts of
    layers 0..N-1), each with the overrides llama.cpp generates for it."""
    out: list[tuple[list[str], list[Override]]] = [([], [])]
    if not dialect.mainline_moe_rules:
        return out  # ik appends its generated entries after -ot and picks layers from the model
    from offload_planner.core.cmdline.moe import cpu_moe_overrides, n_cpu_moe_overrides

    d = dialect
    exps: dict[int, list[str]] = {}
    experts = ROUTED_EXPERT_ROLES
    for t in model.tensors:
        if t.role in experts and t.layer is not None and t.name in target:
            exps.setdefault(t.layer, []).append(t.name)
    if not exps:
        return out
    on_cpu = {il for il, names in exps.items() if all(target[n] == CPU for n in names)}
    out.append((["--cpu-moe"], [Override(o.pattern, o.buft, o.source) for o in cpu_moe_overrides(d)]))
    n = 0
    while n < model.summary.n_layer and (n in on_cpu or n not in exps):
        n += 1
    if 0 < n < model.summary.n_layer and any(il < n for il in on_cpu):
        out.append((["--n-cpu-moe", str(n)],
                    [Override(o.pattern, o.buft, o.source) for o in n_cpu_moe_overrides(d, n)]))
    return out


def _context_flags(ctx: ContextParams, dialect: Dialect) -> list[str]:
    out: list[str] = []
    if ctx.n_batch != DEFAULT_N_BATCH:
        out += ["-b", str(ctx.n_batch)]
    if ctx.n_ubatch != DEFAULT_N_UBATCH:
        out += ["-ub", str(ctx.n_ubatch)]
    server_auto = dialect.auto_parallel and ctx.n_seq_max == 4 and ctx.kv_unified
    if not server_auto:
        out += ["-np", str(ctx.n_seq_max)]
        if ctx.kv_unified:
            out += ["-kvu"]
    out += ["-fa", "on" if ctx.flash_attn else "off"]
    if ctx.type_k != "f16":
        out += ["-ctk", ctx.type_k]
    if ctx.type_v != "f16":
        out += ["-ctv", ctx.type_v]
    if not ctx.offload_kqv:
        out += ["-nkvo"]
    if ctx.swa_full:
        out += ["--swa-full"]
    return out


__all__ = ["CPU", "Plan", "overrides_of", "plan_command", "plan_from_args"]
