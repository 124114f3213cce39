"""Each dialect's flag table and the flags it no longer (or never) accepted, asked of the dialect."""

from __future__ import annotations

from functools import cache

from offload_planner.core.cmdline.flagspec import FlagTable
from offload_planner.core.dialects.base import Dialect


@cache
def flag_table(dialect: Dialect) -> FlagTable:
    return Dialect(dialect).flag_table()


def moved_hint(dialect: Dialect, spelling: str) -> str | None:
    """What to write instead of ``spelling``, when the dialect rejects a flag others accept."""
    return Dialect(dialect).moved_flags().get(spelling)


def unknown_flag_hint(dialect: Dialect, spelling: str) -> str:
    """Why ``spelling`` is refused and what to write instead: a flag of another dialect, or the
    closest spelling this dialect accepts (``--n-gpu-layer`` -> ``did you mean --n-gpu-layers?``)."""
    label = dialect.label
    moved = moved_hint(dialect, spelling)
    if moved:
        return f"not a flag of {label}; use {moved}"
    if not spelling.startswith("-"):
        return f"llama-server takes no positional arguments; not a flag of {label}"
    import difflib  # only for a refused flag

    spellings = [s for spec in flag_table(dialect) for s in spec.spellings]
    close = difflib.get_close_matches(spelling, spellings, n=1, cutoff=0.75)
    return f"not a flag of {label}" + (f"; did you mean {close[0]}?" if close else "")
