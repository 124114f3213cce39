"""Mainline llama.cpp as built in late 2025 (b6xxx-b7xxx).

``--mmap/--no-mmap/--mlock``; ``-fa on|off|auto`` (a bare ``-fa`` before September 2025); ``-np``
default 1; no ``--fit``; ``-ngl N`` only (default 999 from August 2025, 0 before); the output layer
offloaded only if ngl > n_layer; logits reserved for every token of the ubatch; the experts pattern
without ``(ch|)``/``gate_up``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from offload_planner.core.dialects.base import register
from offload_planner.core.dialects.mainline import Mainline

if TYPE_CHECKING:
    from offload_planner.core.cmdline.flagspec import FlagTable
    from offload_planner.core.cmdline.model import DraftArgs
    from offload_planner.core.devices import DeviceSet
    from offload_planner.core.placement import PlacementOptions


#: ``common_params_speculative`` of the 2025 builds (common/common.h): ``n_max = 16``, ``p_min = 0.75f``
DEFAULT_2025_N_MAX, DEFAULT_2025_P_MIN = 16, 0.75


class Mainline2025(Mainline):
    #: one ``KEY=TYPE:VALUE`` an ``--override-kv`` (the comma split came with PR 18056, December 2025)
    kv_override_csv = False
    #: one Metal device, ``Metal``, and its buffer types ``Metal`` / ``Metal_Private`` / ``Metal_Mapped``
    #: (ggml-metal.cpp before ggml sync e1fda9de of llama.cpp PR 18919: ``ggml_backend_metal_device_get_name``
    #: and ``ggml_backend_metal_buffer_type_shared_get_name`` return "Metal"; ggml-metal.m before PR 15995
    #: of September 2025 the same)
    metal_device = "Metal"
    reserves_ubatch_outputs = True
    legacy_graph_inputs = True
    bare_flash_attn = True
    detect_rank = 30
    batch_floor = 64  # GGML_KQ_MASK_PAD (src/llama-context.cpp of 2025)
    # a common_arg style help (2025 mainline), or --no-mmap / --mlock without the pinned -lm
    help_markers: tuple[str, ...] = (
        r"----- common params -----", r"\(env: LLAMA_ARG_", r"--no-mmap", r"--mlock")
    # "version: 6123 (abcdef0)": a 2025 mainline build or ik_llama.cpp (the numbers overlap; ik's
    # help tells them apart)
    version_markers: tuple[str, ...] = (r"(?m)^version:\s*(\d+)\s*\(",)

    def flag_table(self) -> FlagTable:
        from offload_planner.core.cmdline.flags_2025 import MAINLINE_2025_FLAGS
        from offload_planner.core.cmdline.flagspec import FlagTable

        return FlagTable(MAINLINE_2025_FLAGS)

    def moved_flags(self) -> Mapping[str, str]:
        return {
            "-lm": "--no-mmap / --mlock",
            "--load-mode": "--no-mmap / --mlock",
            "-fit": "nothing (--fit came with 2026 builds)",
            "--fit": "nothing (--fit came with 2026 builds)",
            "-ncffn": "-ot 'blk\\.N\\.ffn_(up|down|gate)\\.=CPU'",
            "--n-cpu-ffn": "-ot 'blk\\.N\\.ffn_(up|down|gate)\\.=CPU'",
            "-no-fa": "-fa off",
        }

    def draft_n_max(self, draft: DraftArgs) -> int:
        """``--draft-max N`` (``--draft``, ``--draft-n``), else 16: these builds'
        ``common_params_speculative::n_max`` (common/common.h; the pinned build's is 3)."""
        return DEFAULT_2025_N_MAX if draft.n_max is None else max(0, draft.n_max)

    def draft_stop(self, draft: DraftArgs) -> tuple[float, str, bool]:
        """``--draft-p-min P``, else 0.75: these builds' ``common_params_speculative::p_min`` (the
        pinned build's is 0: drafts run full length by default)."""
        if draft.p_min is not None:
            return draft.p_min, f"--draft-p-min {draft.p_min:g}", True
        what = ("the 2025 builds' default p_min" if draft.n_max is not None else
                f"the 2025 builds' defaults n_max {DEFAULT_2025_N_MAX} and p_min")
        return DEFAULT_2025_P_MIN, f"{what} {DEFAULT_2025_P_MIN:g} (common/common.h)", False

    def exps_regex(self) -> str:
        from offload_planner.core.cmdline.moe import MAINLINE_2025_EXPS_REGEX

        return MAINLINE_2025_EXPS_REGEX

    def notes(self, popts: PlacementOptions, devices: DeviceSet) -> list[str]:
        from offload_planner.core.placement import selected_gpus

        cpu_rule = any(o.buft.upper() == "CPU" for o in popts.overrides)
        if not (cpu_rule and any(g.host_buffer_name for g in selected_gpus(devices, popts))):  # -dev's
            return []
        return ["two rules for -ot ...=CPU in 2025 builds: from b6050 (PR 14990, August 2025) the "
                "weights take the CPU list's first buffer type (the GPU's host buffer, "
                f"{'CUDA_Host' if not popts.use_mmap else 'CPU_Mapped with mmap'}), as projected; "
                "earlier builds use the plain CPU buffer type (logged as CPU, or CPU_Mapped with mmap)"]


LLAMA_CPP_2025 = register(Mainline2025("llama.cpp-2025", "llama.cpp (2025 builds)"), "LLAMA_CPP_2025")
