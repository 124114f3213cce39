"""The one pipeline: file -> Model -> Plan -> Projection -> Analysis.

``open_model`` reads the file; :func:`~offload_planner.core.plan.plan_from_args` (or the window's
edits) make the Plan; :func:`projected` projects it as llama.cpp allocates it; :func:`analysis_of`
adds what a reader needs: warnings (one list, assembled here for the window, ``plan`` and
``launch``), notes, the rules' reports and the command that reproduces the plan.
:func:`analyse_command` runs the whole pipeline on a llama-server command line (with the pinned
build's ``--fit`` report, :func:`fit_report`, on request); :func:`analyse` is the window's form (it
never raises: a failure is ``Analysis.error``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from offload_planner.core.cmdline import ParsedArgs
from offload_planner.core.device_figures import CapacityHint
from offload_planner.core.devices import DeviceSet
from offload_planner.core.diagnostics import RuleReport, plan_warnings, rule_reports
from offload_planner.core.dialects import LLAMA_CPP, Dialect
from offload_planner.core.engine import command_notes, device_selection
from offload_planner.core.errors import PlannerError
from offload_planner.core.extra_context import attach
from offload_planner.core.memory import Projection, project
from offload_planner.core.model import Model
from offload_planner.core.placement import CPU, selected_gpus
from offload_planner.core.plan import Plan, plan_command, plan_from_args
from offload_planner.core.plan_report import mmap_notes
from offload_planner.core.speculative import draft_warning, spec_refusals

if TYPE_CHECKING:
    from offload_planner.core.fit import FitResult
    from offload_planner.core.fit_extra import ExtraShortfall


@dataclass(frozen=True)
class Analysis:
    plan: Plan
    projection: Projection | None
    command: list[str] = field(default_factory=list)  # llama-server arguments (no program name)
    warnings: list[str] = field(default_factory=list)
    rules: list[RuleReport] = field(default_factory=list)
    error: str = ""  # the projection failed: one line for the user
    seconds: float = 0.0
    preliminary: bool = False  # weights/KV/output current; compute, command, problems from before
    notes: list[str] = field(default_factory=list)  # how figures are counted (mmap span vs read)
    command_notes: list[str] = field(default_factory=list)  # what the server's defaults decided
    fit: FitReport | None = None  # what the pinned build's --fit does with the command (analyse_command)


@dataclass(frozen=True)
class FitReport:
    """What the pinned build's --fit would do at start: its summary (None: it is off, there is no
    GPU or it cannot run), notes for the reader, and whether it makes the GPUs fit (it succeeded
    and changed the command)."""

    summary: dict[str, object] | None = None
    notes: list[str] = field(default_factory=list)
    fixes_gpus: bool = False


def fit_report(plan: Plan, parsed: ParsedArgs) -> FitReport:
    """The pinned llama-server's --fit on ``plan`` (read from ``parsed``); nothing for other builds."""
    if not plan.dialect.fits_by_default or getattr(getattr(parsed, "args", parsed), "fit", None) is False:
        return FitReport()  # -fit off: no fit to run (nor its modules to import: a one-shot plan's)
    from offload_planner.core.fit import fit_note, fit_summary, fitted_command, server_fit

    model, devices = plan.model, plan.devices
    fitted = server_fit(model, devices, parsed, plan.placement_options, plan.context)
    unknown = [g.name for g in selected_gpus(devices, plan.placement_options) if g.capacity is None]
    if fitted is None:
        if unknown and parsed.args.fit is not False:
            return FitReport(notes=[
                f"--fit is on (this build's default): at start it adapts -c, -ngl and expert "
                f"overrides to each GPU's free memory; declare {', '.join(unknown)} with "
                "--device NAME=SIZE to see what it will do"])
        return FitReport()
    fcmd = (fitted_command(fitted, model, devices, plan.placement_options, plan.context)
            if fitted.changed else [])
    note = fit_note(fitted, fcmd)
    short = _fit_extra_shortfalls(plan, fitted)
    notes = ([note] if note else []) + [sf.message() for sf in short]
    spans = _fit_span_note(plan, fitted)
    notes += [spans] if spans else []
    fixes = (fitted.changed and fitted.status == "success" and all(sf.over <= sf.margin for sf in short)
             and not spans)
    return FitReport(fit_summary(fitted, devices, fcmd), notes, fixes)


def _fit_extra_shortfalls(plan: Plan, fitted: FitResult) -> list[ExtraShortfall]:
    """With a draft model or MTP, the devices the fitted command leaves short of llama.cpp's margin
    because its fit counted the draft/MTP context with the command's own parameters (one more
    projection, of the fitted command, where that can happen: fit_extra.may_fall_short)."""
    from offload_planner.core.fit_extra import extra_shortfalls, may_fall_short

    if not may_fall_short(fitted, plan.spec):
        return []

    popts, ctx = fitted.apply(plan.placement_options, plan.context, plan.model.summary.n_layer,
                              has_gpu=bool(plan.devices.gpus))
    proj = replace(plan, placement_options=popts, context=ctx, moves={}).projection()
    return extra_shortfalls(fitted, proj, {g.name: g.capacity or 0 for g in plan.devices.gpus})


def _fit_span_note(plan: Plan, fitted: FitResult) -> str:
    """Where the fitted server maps the model file on a GPU (Metal with mmap), the fit's dry runs did not
    (common/fit.cpp:58): the fitted command projected with mmap, and a note where that GPU is then over
    because its mapped span holds the CPU's tensors ("" elsewhere: no projection for other GPUs)."""
    from offload_planner.core.mapped_span import fit_span_note, mapping_gpus, spans_over

    if not fitted.changed or not mapping_gpus(plan):
        return ""
    popts, ctx = fitted.apply(plan.placement_options, plan.context, plan.model.summary.n_layer,
                              has_gpu=bool(plan.devices.gpus))
    over = spans_over(replace(plan, placement_options=popts, context=ctx, moves={}).projection())
    return fit_span_note(over, " ".join(plan.dialect.no_mmap_flags)) if over else ""


def fit_simulates(dialect: Dialect, devices: DeviceSet, parsed: ParsedArgs) -> bool:
    """:func:`fit_report` runs the fit's dry runs (simulations of the command's graphs): the build fits
    by default, -fit is not off, and every GPU's memory is known (:func:`~offload_planner.core.fit.
    server_fit`): the GPUs the command's -dev selects (every GPU without one)."""
    chosen = dialect.selected_gpus(parsed.args.devices, devices.gpus)
    gpus = [g for g in devices.gpus if chosen is None or g.name in chosen]
    return (dialect.fits_by_default and parsed.args.fit is not False and bool(gpus)
            and all(g.capacity is not None for g in gpus))


def projected(plan: Plan) -> Projection:
    """The plan's projection; a :class:`~offload_planner.core.errors.PlannerError` for an -ot rule
    the planner cannot evaluate."""
    plan.placement().raise_rule_errors()
    return plan.projection()


def command_projection(plan: Plan) -> tuple[Projection, list[str]]:
    """The projection of a plan read from a command line as llama-server allocates it
    (:meth:`Plan.projection`: the model, the draft/MTP context, then the --mmproj projector as the
    arguments and the environment set it), and notes on the projector."""
    placement = plan.placement()
    placement.raise_rule_errors()
    return plan.projection(placement=placement), plan.mmproj_buffers()[1]


def unknown_device_warnings(plan: Plan) -> list[str]:
    """-ot rules and moves that name a device the plan does not have."""
    names = {n.lower() for n in plan.devices.names}
    out = [
        f"{o.source} {o.pattern}={o.buft} names {o.buft}, which is not among the devices "
        f"({', '.join(plan.devices.names)})"
        for o in plan.placement_options.overrides
        if o.buft.lower() not in names
    ]
    lost = sorted({d for d in plan.moves.values() if d.lower() not in names})
    out += [f"tensors moved to {d}, which is not among the devices" for d in lost]
    return out


def unselected_device_warnings(plan: Plan, projection: Projection) -> list[str]:
    """Weights an -ot rule or a move puts on a GPU that ``-dev`` leaves out: llama-server loads them
    into that device's buffer, then no backend of the scheduler can use the buffer and it aborts
    while reserving the compute buffers (seen on the real server with ``-dev RPC0`` and an -ot naming
    RPC1: ``pre-allocated tensor (blk.1.attn_q.weight) in a buffer (RPC0[...]) that cannot run the
    operation``)."""
    selected = plan.placement_options.selected
    if selected is None:
        return []
    held: dict[str, list[str]] = {}
    for p in projection.placement.items:
        if p.device is not None and p.device not in selected and p.device != CPU:
            held.setdefault(p.device, []).append(p.name)
    chosen = ",".join(selected) or "none"
    return [f"{dev} holds {len(names)} weight(s) ({names[0]}, ...) by an -ot rule or a move, but "
            f"-dev {chosen} leaves {dev} out: llama-server loads them there and aborts while reserving the "
            f"compute buffers (\"pre-allocated tensor ... in a buffer ... that cannot run the operation\"); "
            f"name {dev} in -dev or place those weights elsewhere" for dev, names in held.items()]


def _context_errors(plan: Plan) -> list[str]:
    from offload_planner.core.loadable import context_error

    err = context_error(plan.model, plan.context.n_ctx)
    max_seq, n_seq = plan.dialect.max_seq, plan.context.n_seq_max
    # a plan made for ik (no limit) then switched to a build with LLAMA_MAX_SEQ (cmdline.semantics says it
    # of a command line)
    over = (f"llama-server exits: llama_init_from_model: failed to initialize the context: n_seq_max must be "
            f"<= {max_seq} (-np {n_seq}: this build takes at most {max_seq} sequences, LLAMA_MAX_SEQ)"
            if max_seq and n_seq > max_seq else "")
    return [e for e in (err, over) if e]


def _override_refusal(plan: Plan) -> list[str]:
    """An ``--override-kv`` the model cannot load with (the projection keeps the file's values)."""
    from offload_planner.core.kv_override import overrides_in, refusal

    ovs = overrides_in(plan.extra_args, plan.dialect.kv_override_csv)
    said = refusal(plan.model, ovs) if ovs else ""
    return [f"llama-server aborts while loading the model: {said}"] if said else []


def warnings_of(plan: Plan, projection: Projection, rules: Sequence[RuleReport],
                capacity_hint: CapacityHint | None = None) -> list[str]:
    """Every warning about a plan, in one order: what the backend refuses or changes, devices the
    plan names but lacks, devices over capacity, then the rules and placements
    (:func:`~offload_planner.core.diagnostics.plan_warnings`)."""
    unused = draft_warning(plan.model, plan.spec)
    refusals = (spec_refusals(plan.model, plan.spec) + ([unused] if unused else [])
                + plan.dialect.model_errors(plan.model) + _context_errors(plan) + _override_refusal(plan)
                + plan.dialect.warnings(plan.model, plan.placement_options, plan.devices))
    core = plan_warnings(projection, plan.placement_options.overrides, reports=rules,
                         capacity_hint=capacity_hint)
    return refusals + unselected_device_warnings(plan, projection) + unknown_device_warnings(plan) + core


def analysis_of(plan: Plan, *, notes: Sequence[str] = (), command: bool = True,
                capacity_hint: CapacityHint | None = None, projection: Projection | None = None) -> Analysis:
    """Project (unless ``projection`` is given) and analyse ``plan``; raises what the pipeline raises
    (PlannerError for bad input). ``notes``: what reading the command decided; ``command``: also the
    reproducing command."""
    t0 = time.perf_counter()
    projection = projected(plan) if projection is None else projection
    rules = rule_reports(projection, plan.placement_options.overrides, tensors=plan.model.tensors)
    warnings = warnings_of(plan, projection, rules, capacity_hint)
    argv = plan_command(plan) if command else []
    return Analysis(plan, projection, argv, warnings, rules, seconds=time.perf_counter() - t0,
                    notes=[*mmap_notes(projection), *_window_selection(plan, notes)],
                    command_notes=list(notes))


def _window_selection(plan: Plan, command_notes: Sequence[str]) -> list[str]:
    """The ``-dev`` note among the window's notes (the window shows no command notes; ``plan``
    prints it with them, so it is not said twice there)."""
    said = device_selection(plan.placement_options, plan.devices, plan.dialect)
    return [n for n in said if n not in command_notes]


def analyse_command(model: Model, devices: DeviceSet, args: Any, dialect: Dialect = LLAMA_CPP, *,
                    command: bool = False, fit: bool = False) -> Analysis:
    """The pipeline on a llama-server command line (a ParsedArgs or bare ServerArgs): the plan
    llama-server would run, projected and analysed, with a note for every default it filled in;
    ``fit`` (a ParsedArgs only): also what the pinned build's --fit does with it."""
    plan = plan_from_args(model, devices, args, dialect)
    projection, projector_notes = command_projection(plan)
    notes = command_notes(model, devices, args, dialect, plan.placement_options, projector_notes)
    analysis = analysis_of(plan, notes=notes, command=command, projection=projection)
    return replace(analysis, fit=fit_report(plan, args)) if fit else analysis


def analyse(plan: Plan, capacity_hint: CapacityHint | None = None) -> Analysis:
    """The window's analysis: never raises (bad input and core bugs become ``error``)."""
    t0 = time.perf_counter()
    try:
        return analysis_of(plan, capacity_hint=capacity_hint)
    except PlannerError as e:  # bad input the core names (an -ot rule it cannot evaluate): as is
        return Analysis(plan, None, error=str(e), seconds=time.perf_counter() - t0)
    except Exception as e:  # a core bug must not take the window down: show it
        import traceback  # here: a one-shot `plan` imports this module and never needs it

        last = traceback.extract_tb(e.__traceback__)[-1]
        where = f"{last.filename.rsplit('/', 1)[-1]}:{last.lineno}"
        return Analysis(
            plan,
            None,
            error=f"projection failed: {type(e).__name__}: {e} ({where})",
            seconds=time.perf_counter() - t0,
        )


def quick_analysis(plan: Plan, previous: Analysis | None) -> Analysis | None:
    """An instant update after an edit: weights, KV and output projected now (about 1 ms on
    DeepSeek-V3), compute buffers, command and problems kept from the previous analysis until
    the full one arrives. None when there is nothing to reuse (new model or devices)."""
    if previous is None or previous.projection is None or previous.plan.model is not plan.model:
        return None
    if previous.plan.devices != plan.devices:
        return None
    t0 = time.perf_counter()
    compute = [replace(b, why=b.why + " (from before the last edit; updating)")
               for b in previous.projection.buffers() if b.kind in ("compute", "mmproj") and not b.owner]
    projection = project(plan.model, plan.devices, plan.placement(), plan.context, compute=compute)
    projection = attach(projection, previous.projection.extras)  # draft/MTP: as before the edit
    return Analysis(plan, projection, previous.command, previous.warnings, previous.rules,
                    seconds=time.perf_counter() - t0, preliminary=True, notes=previous.notes)
