"""A deadline for code that could hang on a regression: the test fails instead of hanging."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Raise TimeoutError in the main thread after ``seconds`` (where SIGALRM exists).

    Python's ``re`` checks for signals while it backtracks, so a runaway match is interrupted too.
    """
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def fire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
