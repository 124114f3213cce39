"""Everything the window derives from a plan that takes time: projection, command, diagnostics.

Qt-free, so :mod:`offload_planner.ui.projector` can compute it off the GUI thread.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field, replace

from offload_planner.core.diagnostics import RuleReport, plan_warnings, rule_reports
from offload_planner.core.errors import PlannerError
from offload_planner.core.extra_context import attach
from offload_planner.core.memory import Projection, project
from offload_planner.core.plan import Plan, plan_command
from offload_planner.core.plan_report import mmap_notes
from offload_planner.ui.device_figures import capacity_warnings


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


def analyse(plan: Plan) -> Analysis:
    t0 = time.perf_counter()
    try:
        plan.placement().raise_rule_errors()  # an -ot rule the planner cannot evaluate: a problem
        projection = plan.projection()
        overrides = plan.placement_options.overrides
        names = plan.devices.names
        # TODO(core): diagnostics.plan_warnings counts the whole mmap span against RAM; the window
        # counts what is read (device_figures) and replaces those lines with its own.
        core = [
            w
            for w in plan_warnings(projection, overrides)
            if not any(w.startswith(f"{n} is over capacity") for n in names)
        ]
        refusals = plan.dialect.model_errors(plan.model) + plan.dialect.warnings(
            plan.model, plan.placement_options, plan.devices)
        capacity = capacity_warnings(projection, moe=plan.model.summary.is_moe)
        warnings = refusals + unknown_device_warnings(plan) + capacity + core
        rules = rule_reports(projection, overrides)
        command = plan_command(plan)
    except PlannerError as e:  # bad input the core names (an -ot rule it cannot evaluate): as is
        return Analysis(plan, None, error=str(e), seconds=time.perf_counter() - t0)
    except Exception as e:  # a core bug must not take the window down: show it
        last = traceback.extract_tb(e.__traceback__)[-1]
        where = f"{last.filename.rsplit('/', 1)[-1]}:{last.lineno}"
        return Analysis(
            plan,
            None,
            error=f"projection failed: {type(e).__name__}: {e} ({where})",
            seconds=time.perf_counter() - t0,
        )
    return Analysis(plan, projection, command, warnings, rules, seconds=time.perf_counter() - t0,
                    notes=mmap_notes(projection))
