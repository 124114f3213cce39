"""The flag table of each dialect, plus the flags each one no longer (or never) accepted."""

from __future__ import annotations

import difflib
from functools import cache

from offload_planner.core.cmdline.dialect import Dialect
from offload_planner.core.cmdline.flags_2025 import MAINLINE_2025_FLAGS
from offload_planner.core.cmdline.flags_ik import IK_FLAGS
from offload_planner.core.cmdline.flagspec import FlagTable
from offload_planner.core.cmdline.mainline_flags import MAINLINE_FLAGS


@cache
def flag_table(dialect: Dialect) -> FlagTable:
    flags = {
        Dialect.LLAMA_CPP: MAINLINE_FLAGS,
        Dialect.LLAMA_CPP_2025: MAINLINE_2025_FLAGS,
        Dialect.IK: IK_FLAGS,
    }[dialect]
    return FlagTable(flags)


# Spellings a dialect rejects although a neighbouring dialect takes them: what to use instead.
_MOVED: dict[Dialect, dict[str, str]] = {
    Dialect.LLAMA_CPP: {
        "--no-mmap": "-lm none",
        "--mmap": "-lm mmap",
        "--mlock": "-lm mlock (no mmap) or -lm mmap+mlock",
        "-dio": "-lm dio",
        "--direct-io": "-lm dio",
        "-ndio": "-lm auto",
        "--no-direct-io": "-lm auto",
        "-fmoe": "nothing (ik_llama.cpp only)",
        "-mla": "nothing (ik_llama.cpp only)",
        "-amb": "nothing (ik_llama.cpp only)",
        "-rtr": "nothing (ik_llama.cpp only)",
        "-no-fa": "-fa off",
        "--no-flash-attn": "-fa off",
    },
    Dialect.LLAMA_CPP_2025: {
        "-lm": "--no-mmap / --mlock",
        "--load-mode": "--no-mmap / --mlock",
        "-fit": "nothing (--fit came with 2026 builds)",
        "--fit": "nothing (--fit came with 2026 builds)",
        "-ncffn": "-ot 'blk\\.N\\.ffn_(up|down|gate)\\.=CPU'",
        "--n-cpu-ffn": "-ot 'blk\\.N\\.ffn_(up|down|gate)\\.=CPU'",
        "-no-fa": "-fa off",
    },
    Dialect.IK: {
        "-lm": "--no-mmap / --mlock",
        "--load-mode": "--no-mmap / --mlock",
        "-fmoe": "nothing: fused MoE is on by default (-no-fmoe turns it off)",
        "--fused-moe": "nothing: fused MoE is on by default (-no-fmoe turns it off)",
        "-ooae": "nothing: only-active-experts offload is on by default (-no-ooae turns it off)",
        "-lv": "--verbosity N",
        "-kvo": "nothing (KV offload is the default; -nkvo turns it off)",
        "-kvu": "nothing (ik always uses one KV stream)",
        "--kv-unified": "nothing (ik always uses one KV stream)",
        "-fitt": "--fit-margin / -gfm",
        "--fit-target": "--fit-margin / -gfm",
    },
}


def moved_hint(dialect: Dialect, spelling: str) -> str | None:
    """What to write instead of ``spelling``, when the dialect rejects a flag others accept."""
    return _MOVED[dialect].get(spelling)


def unknown_flag_hint(dialect: Dialect, spelling: str) -> str:
    """Why ``spelling`` is refused and what to write instead: a flag of another dialect, or the
    closest spelling this dialect accepts (``--n-gpu-layer`` -> ``did you mean --n-gpu-layers?``)."""
    label = dialect.label
    moved = moved_hint(dialect, spelling)
    if moved:
        return f"not a flag of {label}; use {moved}"
    if not spelling.startswith("-"):
        return f"llama-server takes no positional arguments; not a flag of {label}"
    spellings = [s for spec in flag_table(dialect) for s in spec.spellings]
    close = difflib.get_close_matches(spelling, spellings, n=1, cutoff=0.75)
    return f"not a flag of {label}" + (f"; did you mean {close[0]}?" if close else "")
