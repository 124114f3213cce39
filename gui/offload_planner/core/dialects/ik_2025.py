"""ik_llama.cpp as built before July 2025: the public CUDA logs of April-June 2025.

What differs from the current source (``ikawrakow/ik_llama.cpp``, read at each date):

- ``-ot ...=CPU`` (and ``exps=CPU``) takes the plain CPU buffer type: the overridden weights are logged
  as ``CPU`` and the token embedding alone as ``CUDA_Host`` (``src/llama.cpp`` ``create_tensor`` used
  the override's buffer type as given until PR 1508, 2026-03-25, mapped host overrides to
  ``llama_default_buffer_type_cpu(true)``);
- no ``-ngl`` means no layer offloaded (``llama_model_default_params``: 0 until PR 2209, 2026-07-30);
- the KQ mask is an f32 input, cast to f16 where flash attention reads it, its rows padded to 32
  (``build_inp_KQ_mask`` until PR 825, 2025-10-13; ``GGML_KQ_MASK_PAD`` 32 until PR 574, 2025-07-03).

Everything else (the parser, MLA, the op-offload rule of PR 520) is the current ik dialect's; builds
before PR 520 (2025-06-12) offloaded MoE ops from 32 tokens whatever the expert count (with ``-rtr``, as
in the May-2025 logs replayed here, nothing is offloaded either way: :mod:`core.ik_repack`).
"""

from __future__ import annotations

from typing import Any

from offload_planner.core.dialects.base import register
from offload_planner.core.dialects.ik import IkLlamaCpp


class Ik2025(IkLlamaCpp):
    plain_cpu_overrides = True
    f32_kq_mask = True
    detect_rank = 90  # never recognised from a server's output: picked by name
    help_markers: tuple[str, ...] = ()
    version_markers: tuple[str, ...] = ()

    def default_ngl(self, ngl: Any, has_gpu: bool) -> Any:
        return 0 if ngl is None else ngl


IK_2025 = register(Ik2025("ik_llama.cpp-2025", "ik_llama.cpp (builds before July 2025)"), "IK_2025")
