"""The ``-ot`` entries that ``--cpu-moe`` / ``--n-cpu-moe`` / ``--n-cpu-ffn`` stand for.

Mainline (``common/common.h``)::

    LLM_FFN_EXPS_REGEX  = "\\.ffn_(up|down|gate|gate_up)_(ch|)exps"
    LLM_FFN_DENSE_REGEX = "\\.ffn_(up|down|gate)\\."
    --cpu-moe      -> LLM_FFN_EXPS_REGEX=CPU                      (one entry)
    --n-cpu-moe N  -> blk\\.<i>LLM_FFN_EXPS_REGEX=CPU for i=0..N-1 (at the flag's position)
    --n-cpu-ffn N  -> blk\\.<i>LLM_FFN_DENSE_REGEX=CPU for i=0..N-1

2025 mainline had ``\\.ffn_(up|down|gate)_exps`` (``(ch|)`` and ``gate_up`` came in 2026, b8301).

The rules stop at ``LLAMA_MAX_LAYERS`` (512): llama.cpp loads no model with more blocks, and a file
with a tensor of a block past its block count fails to load, so ``blk\\.600...`` matches nothing it
can place; ``--n-cpu-moe 99999`` is 512 rules here, not 99,999 (the command keeps the count).

ik_llama.cpp keeps only the count (``--cpu-moe`` = ``--n-cpu-moe 999``) and, at load, appends
``blk\\.<i>\\.ffn_(up|down|gate|gate_up)_exps\\.(weight|scale)=CPU`` for the *last* N layers that
have routed experts (single GPU, or N >= n_layer), after the user's ``-ot`` entries.
"""

from __future__ import annotations

from collections.abc import Sequence

from offload_planner.core.cmdline.model import TensorOverride
from offload_planner.core.dialects.base import Dialect
from offload_planner.core.metadata import LLAMA_MAX_LAYERS

MAINLINE_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
MAINLINE_DENSE_REGEX = r"\.ffn_(up|down|gate)\."
MAINLINE_2025_EXPS_REGEX = r"\.ffn_(up|down|gate)_exps"
IK_EXPS_BLOCK = r"blk\.{}\.ffn_(up|down|gate|gate_up)_exps\.(weight|scale)"
IK_CPU_MOE_COUNT = 999
IK_GENERATED_INDEX = -2


def exps_regex(dialect: Dialect) -> str:
    return dialect.exps_regex()


def block_regex(layer: int, ffn_regex: str) -> str:
    """``llm_ffn_block_regex``: ``string_format("blk\\\\.%d%s", idx, ffn_regex)``."""
    return f"blk\\.{layer}{ffn_regex}"


def cpu_moe_overrides(dialect: Dialect, index: int = -1) -> list[TensorOverride]:
    return [TensorOverride(exps_regex(dialect), "CPU", "--cpu-moe", index)]


def n_cpu_moe_overrides(dialect: Dialect, n: int, index: int = -1) -> list[TensorOverride]:
    regex = exps_regex(dialect)
    return [TensorOverride(block_regex(i, regex), "CPU", "--n-cpu-moe", index)
            for i in range(min(n, LLAMA_MAX_LAYERS))]


def n_cpu_ffn_overrides(n: int, index: int = -1) -> list[TensorOverride]:
    return [
        TensorOverride(block_regex(i, MAINLINE_DENSE_REGEX), "CPU", "--n-cpu-ffn", index)
        for i in range(min(n, LLAMA_MAX_LAYERS))
    ]


def ik_n_cpu_moe_layers(n: int, moe_layers: Sequence[int]) -> list[int]:
    """Layers ik_llama.cpp (HEAD, single GPU) keeps on the CPU: the last ``n`` routed-expert layers.

    ``moe_layers`` are the indices of the trunk layers that have ``ffn_down_exps`` (NextN/MTP and
    dense layers excluded).  Returned from the last layer down, the order ik adds them.
    """
    return sorted(moe_layers, reverse=True)[: max(n, 0)]


def ik_cpu_moe_overrides(n: int, moe_layers: Sequence[int]) -> list[TensorOverride]:
    source = "--cpu-moe" if n >= IK_CPU_MOE_COUNT else "--n-cpu-moe"
    layers = ik_n_cpu_moe_layers(n, moe_layers)
    return [TensorOverride(IK_EXPS_BLOCK.format(i), "CPU", source, IK_GENERATED_INDEX) for i in layers]
