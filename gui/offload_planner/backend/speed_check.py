"""Measured against estimated speed for a launched server, and the calibration it yields.

:func:`run_speed_check` measures the running server (:mod:`offload_planner.backend.server_bench`),
estimates the same plan with the figures the planner would use now (this machine's RAM probe and
the efficiencies stored for the backend), and derives the efficiencies that make the estimate
match (:mod:`offload_planner.core.speed.calibrate`).  ``store=True`` keeps them for later
estimates of this machine and backend, which then say "calibrated".  Used by ``launch --bench``
and the Launch tab's Bench button; pure Python (the caller runs it off its event loop).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from offload_planner.backend.server_bench import (
    DEFAULT_GEN_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    MeasuredSpeed,
    measure,
)
from offload_planner.backend.speed_store import efficiencies_for, machine_hardware, record_efficiencies
from offload_planner.core.errors import PlannerError
from offload_planner.core.speed.calibrate import Calibration, calibrate
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.result import SpeedEstimate
from offload_planner.core.speed.speculation import with_speculation
from offload_planner.core.speed.tps import tps_fixed, tps_json


@dataclass
class SpeedCheck:
    measured: MeasuredSpeed
    estimated: SpeedEstimate
    calibration: Calibration
    stored: bool = False
    declined: bool = False  # --no-store: the calibration was only shown
    notes: list[str] = field(default_factory=list)

    def _depth(self) -> str:
        e = self.estimated
        return f"; at depth {e.depth}, the tokens' average context" if e.depth and e.tg_tps_at_depth else ""

    def lines(self) -> list[str]:
        m, e = self.measured, self.estimated
        cal = "calibrated" if e.calibrated else "uncalibrated"
        out = [
            f"speed: measured against estimated ({cal}), {m.prompt_tokens}-token prompt, "
            f"{m.gen_tokens} generated tokens",
            f"  pp  {m.pp_tps:9.2f} t/s measured  {tps_fixed(e.pp_tps, 2):>9} t/s estimated  "
            f"(estimate / measured {e.pp_tps / m.pp_tps:.2f})",
            f"  tg  {m.tg_tps:9.2f} t/s measured  {tps_fixed(compared_tg(e), 2):>9} t/s estimated  "
            f"(estimate / measured {compared_tg(e) / m.tg_tps:.2f}{self._depth()})",
        ]
        out += [f"  calibration: {n}" for n in self.calibration.notes]
        if self.stored:
            out.append("  stored: later estimates for this machine and backend use these efficiencies")
        elif self.declined and self.calibration.values:  # "calibration: ... -> ..." read as done
            out.append("  not stored (--no-store): later estimates keep their figures")
        out += [f"  {n}" for n in self.notes]
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "measured": self.measured.as_dict(),
            "estimated": {"pp_tps": tps_json(self.estimated.pp_tps),
                          "tg_tps": tps_json(compared_tg(self.estimated)),
                          "tg_depth": self.estimated.depth if self.estimated.tg_tps_at_depth else 0,
                          "calibrated": self.estimated.calibrated},
            "calibration": dict(self.calibration.values), "stored": self.stored,
        }


def measured_depth(m: MeasuredSpeed) -> int:
    """The average context of the generated tokens a measurement timed: the prompt (the bench's
    request does not reuse a cached prompt) and half of them."""
    return int(m.prompt_tokens + m.gen_tokens // 2)


def compared_tg(e: SpeedEstimate) -> float:
    """The estimate's tg the measurement is compared with: at the measured tokens' depth when the
    estimate has it (:func:`measured_depth`), else at depth 0."""
    return e.tg_tps_at_depth if e.depth and e.tg_tps_at_depth is not None else e.tg_tps


def run_speed_check(base_url: str, plan: Any, parsed: Any = None, *,
                    prompt_tokens: int = DEFAULT_PROMPT_TOKENS, gen_tokens: int = DEFAULT_GEN_TOKENS,
                    store: bool = True, api_key: str | None = None) -> SpeedCheck:
    """Measure the server at ``base_url`` running ``plan`` and compare with its estimate; ``api_key``: the
    server's ``--api-key`` (:func:`~offload_planner.backend.server_bench.api_key_of`)."""
    got = measure(base_url, n_vocab=plan.model.summary.n_vocab, prompt_tokens=prompt_tokens,
                  gen_tokens=gen_tokens, api_key=api_key)
    hw = machine_hardware(plan, parsed)
    eff = efficiencies_for(plan.dialect)
    # the generated tokens the server times follow the prompt: tg at their average depth (their
    # attention over its cells is part of their time: a quarter of a small MoE model's token on a CPU)
    est = estimate(plan, hw, prompt=got.prompt_tokens, eff=eff, depth=measured_depth(got))
    # with a draft model or MTP the measured tg depends on how many drafted tokens this prompt's
    # answer accepted, unknown here: it calibrates nothing (pp does)
    spec = getattr(plan, "spec", None)
    speculative = spec is not None and spec.active
    cal = calibrate(est, hw, eff, tg_tps=None if speculative else got.tg_tps, pp_tps=got.pp_tps)
    check = SpeedCheck(got, with_speculation(est, plan, hw, eff), cal)
    if speculative:
        check.notes.append("tg not calibrated: with speculative decoding the measured rate depends on the "
                           "drafted tokens accepted, which the estimate assumes (--spec-accept)")
    check.declined = not store
    if store and cal.values:
        try:
            cpu = hw.devices.get(plan.devices.cpu.name)
            note = record_efficiencies(plan.dialect, cal.values, cpu_gain=cpu.isa_gain if cpu else 1.0)
            check.stored = True
            if note:
                check.notes.append(note)
        except PlannerError as e:  # the measurement is still reported, only not kept
            check.notes.append(f"calibration not kept: {e}")
    return check
