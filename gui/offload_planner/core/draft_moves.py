"""Moving a draft model's tensors: llama.cpp places them only by the draft's own flags, so a move
becomes an ``-otd`` rule (``^name$=<buffer type>``) ahead of the user's, which the plan's command keeps.

Draft tensors are named ``draft:<tensor name>`` wherever they share a namespace with the main model's
(the tensor map's cells, a move's names).
"""

from __future__ import annotations

import re
from dataclasses import replace

from offload_planner.core.placement import Override, Placement, place
from offload_planner.core.plan import Plan

DRAFT_PREFIX = "draft:"
OTD_SPELLINGS = ("-otd", "--override-tensor-draft", "--spec-draft-override-tensor")


def is_draft_name(name: str) -> bool:
    return name.startswith(DRAFT_PREFIX)


def draft_placement(plan: Plan) -> Placement | None:
    """Where the plan's draft model's tensors land (None: no draft model)."""
    d = plan.spec.draft if plan.spec is not None else None
    return None if d is None else place(d.model, d.devices, d.placement_options)


def draft_moves_for(plan: Plan, names: list[str], device: str | None) -> dict[str, str]:
    """The draft tensors among ``names`` that ``device`` would move (None: none; a rule the user
    wrote is edited in the command)."""
    placed = draft_placement(plan)
    if placed is None or device is None or not plan.dialect.moves_draft_tensors:
        return {}
    d = plan.spec.draft if plan.spec is not None else None
    if d is None or d.devices.by_name(device) is None:
        return {}
    current = {DRAFT_PREFIX + p.tensor.name: p.device for p in placed.items if not p.copy}
    return {n: device for n in dict.fromkeys(names) if n in current and current[n] != device}


def with_draft_moves(plan: Plan, moves: dict[str, str]) -> Plan:
    """The plan with an ``-otd`` rule per moved draft tensor, first in the draft's rule list and in
    the kept arguments (merged into the first ``-otd`` there: llama.cpp warns about a repeated flag)."""
    if plan.spec is None or plan.spec.draft is None or not moves:
        return plan
    d = plan.spec.draft
    bufts = {n: plan.dialect.server_device_name(b) for n, b in plan.devices.buffer_types().items()}
    new = tuple(Override(f"^{re.escape(n[len(DRAFT_PREFIX):])}$", dev, "-otd") for n, dev in moves.items())
    text = ",".join(f"{o.pattern}={bufts.get(o.buft, o.buft)}" for o in new)
    args = list(plan.extra_args)
    at = next((i for i, a in enumerate(args[:-1]) if a in OTD_SPELLINGS), None)
    if at is None:
        args = ["-otd", text, *args]
    else:
        args[at + 1] = f"{text},{args[at + 1]}"
    popts = replace(d.placement_options, overrides=(*new, *d.placement_options.overrides))
    spec = replace(plan.spec, draft=replace(d, placement_options=popts))
    return replace(plan, spec=spec, extra_args=args)
