"""ik_llama.cpp from PR 2312 (2026-08-13, build 4832): ``-amb`` defaults to 256 MiB instead of 0.

``common/common.h`` ``attn_max_batch = 256`` and ``llama_context_default_params``: a command without
``-amb`` caps the attention scratch at 256 MiB (``-amb 0`` turns the cap off).  Its ``--help`` prints
the default, which tells it from earlier ik builds.
"""

from __future__ import annotations

from offload_planner.core.dialects.base import register
from offload_planner.core.dialects.ik import IkLlamaCpp


class IkAmb256(IkLlamaCpp):
    default_amb = 256
    detect_rank = 5  # before ik_llama.cpp: the same markers, plus the help's -amb default
    help_markers = (r"--attention-max-batch\s+max batch size for attention computations \(default: 256\)",)
    version_markers: tuple[str, ...] = ()

    @property
    def graph_split_archs(self) -> frozenset[str]:
        """August 2026 builds split muse-glimmer too (src/llama.cpp 3926 at 8337e4cd, 2026-08-12)."""
        return super().graph_split_archs | {"muse-glimmer"}


IK_AMB256 = register(IkAmb256("ik_llama.cpp-2026-08", "ik_llama.cpp (from August 2026: -amb 256)"),
                     "IK_AMB256")
