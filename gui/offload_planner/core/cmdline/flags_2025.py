"""2025 mainline llama-server flags: the pinned table with hand-written deltas.

The 2025 builds (b6xxx-b7xxx, before ``--fit`` and ``--load-mode``) used the same ``common_arg``
parser.  The deltas cover what a placement plan touches; flags that are new in 2026 but unrelated
to placement are still accepted (the table is approximate there).

* removed later / not yet there: ``--load-mode``, ``--lazy-mode``, ``--fit``, ``--fit-target``,
  ``--fit-ctx``, ``--n-cpu-ffn``, ``--kv-unified-per-slot``
* still there: ``--mmap/--no-mmap`` (env ``LLAMA_ARG_MMAP``, ``LLAMA_ARG_NO_MMAP``), ``--mlock``,
  ``-dio/--direct-io``, ``-cd/--ctx-size-draft``, ``--spec-replace TARGET DRAFT``
* ``-ngl`` read with ``std::stoi`` (no ``auto``/``all``); ``-sm`` without ``tensor``
"""

from __future__ import annotations

from offload_planner.core.cmdline.flagspec import FlagSpec, ValueKind
from offload_planner.core.cmdline.mainline_flags import MAINLINE_FLAGS

REMOVED_KEYS = frozenset(
    {
        "--load-mode",
        "--lazy-mode",
        "--fit",
        "--fit-target",
        "--fit-ctx",
        "--n-cpu-ffn",
        "--kv-unified-per-slot",
    }
)

REPLACED: dict[str, FlagSpec] = {
    "--gpu-layers": FlagSpec(
        names=("-ngl", "--gpu-layers", "--n-gpu-layers"),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_N_GPU_LAYERS",
        help="number of layers to store in VRAM",
    ),
    "--split-mode": FlagSpec(
        names=("-sm", "--split-mode"),
        kind=ValueKind.STRING,
        hint="{none,layer,row}",
        env="LLAMA_ARG_SPLIT_MODE",
        help="how to split the model across multiple GPUs",
    ),
}

ADDED: tuple[FlagSpec, ...] = (
    FlagSpec(
        names=("--mlock",),
        env="LLAMA_ARG_MLOCK",
        help="force system to keep model in RAM rather than swapping or compressing",
    ),
    FlagSpec(
        names=("--mmap",),
        kind=ValueKind.BOOL,
        neg=("--no-mmap",),
        env="LLAMA_ARG_MMAP",
        help="whether to memory-map model",
    ),
    FlagSpec(
        names=("-dio", "--direct-io"),
        kind=ValueKind.BOOL,
        neg=("-ndio", "--no-direct-io"),
        env="LLAMA_ARG_DIO",
        help="use DirectIO if available",
    ),
    FlagSpec(
        names=("-cd", "--ctx-size-draft"),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_CTX_SIZE_DRAFT",
        help="size of the prompt context for the draft model",
    ),
    FlagSpec(
        names=("--spec-replace",),
        kind=ValueKind.PAIR,
        hint="TARGET",
        help="translate the string in TARGET into DRAFT if the draft model and main model are not compatible",
    ),
)


def _build() -> tuple[FlagSpec, ...]:
    out = [REPLACED.get(f.key, f) for f in MAINLINE_FLAGS if f.key not in REMOVED_KEYS]
    return (*out, *ADDED)


MAINLINE_2025_FLAGS: tuple[FlagSpec, ...] = _build()
