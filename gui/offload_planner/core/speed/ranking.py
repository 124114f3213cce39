"""How the fastest-plan search ranks candidates: the goal's score, and the pick among those that fit."""

from __future__ import annotations

from offload_planner.core.speed.candidate import Candidate
from offload_planner.core.speed.result import SpeedEstimate

BALANCED_ANSWER = 512  # tokens generated per request in the balanced score
GOALS = ("tg", "pp", "balanced")


def score(est: SpeedEstimate, goal: str) -> float:
    """Higher is better: tokens/s for tg or pp; for balanced, requests per second of a prompt of
    ``est.prompt`` tokens and an answer of :data:`BALANCED_ANSWER` tokens."""
    if goal == "tg":
        return est.tg_tps
    if goal == "pp":
        return est.pp_tps
    return 1.0 / (est.prompt / est.pp_tps + BALANCED_ANSWER / est.tg_tps)


def pick(ours: list[Candidate], baselines: list[Candidate], goal: str) -> Candidate | None:
    """The best-scoring of our candidates that fit and the baselines that fit or are predicted over
    a GPU only (a baseline predicted over is projected in full too if it would win: never slower
    than a baseline that fits; RAM is exact without it); the first of equals."""
    fitting = [c for c in ours if c.fits] + [c for c in baselines
                                             if c.fits or not (c.verified or c.host_over)]
    return max(fitting, key=lambda x: score(x.estimate, goal)) if fitting else None
