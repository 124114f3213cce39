"""Fuzzing on a fixed time budget: a seeded stream of inputs, each under its own deadline, and a
tally of outcomes printed at the end (run pytest with ``-s`` to see it).  ``FUZZ_SEED`` and
``FUZZ_SECONDS_SCALE`` select another input stream and a longer budget for exploratory runs."""

from __future__ import annotations

import os
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TypeVar

from tests.support.deadline import deadline

T = TypeVar("T")


class Tally:
    """Outcomes of one fuzz run: how many inputs were tried, how each ended, how long it took."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.counts: Counter[str] = Counter()
        self.t0 = time.monotonic()

    @property
    def tried(self) -> int:
        return sum(self.counts.values())

    def report(self) -> str:
        parts = ", ".join(f"{k}: {v}" for k, v in sorted(self.counts.items(), key=lambda kv: -kv[1]))
        return f"{self.name}: {self.tried} inputs in {time.monotonic() - self.t0:.1f} s ({parts})"


def run_budget(
    name: str,
    make: Callable[[random.Random], T],
    check: Callable[[T], str],
    *,
    seed: int,
    seconds: float,
    per_input: int = 10,
    max_inputs: int = 100_000,
) -> Tally:
    """Feed ``check`` inputs from ``make`` until ``seconds`` have passed; ``check`` returns the
    outcome's name and raises on a failure (an error type that must not escape, or the per-input
    deadline).  The failing input is named in the error."""
    seed += int(os.environ.get("FUZZ_SEED", "0"))  # exploratory runs: another stream, longer
    seconds *= float(os.environ.get("FUZZ_SECONDS_SCALE", "1"))
    rng = random.Random(seed)
    tally = Tally(name)
    end = tally.t0 + seconds
    for i in _inputs(max_inputs, end):
        value = make(rng)
        try:
            with deadline(per_input):
                outcome = check(value)
        except BaseException as e:
            raise AssertionError(f"{name} input {i} ({_short(value)}) failed: {type(e).__name__}: {e}") from e
        tally.counts[outcome] += 1
    sys.stdout.write(tally.report() + "\n")
    return tally


def _inputs(limit: int, end: float) -> Iterator[int]:
    for i in range(limit):
        if time.monotonic() >= end:
            return
        yield i


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 400 else text[:397] + "..."
