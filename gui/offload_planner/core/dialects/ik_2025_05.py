"""ik_llama.cpp as built before 2025-05-26 (PR 461): the CUDA backend multiplies no row-interleaved type.

``ggml_backend_cuda_supports_op`` (``ggml/src/ggml-cuda.cu``, read at a2b5057a, build 3703) lists no
``*_R4``/``*_R8`` type for MUL_MAT, MUL_MAT_ID or MOE_FUSED_UP_GATE; PR 461 (2025-05-26) added
``IQ2_K_R4``..``IQ5_K_R4``, PR 462 (2025-05-27) ``IQ4_KS_R4``/``IQ5_KS_R4``.  So the routed experts of a
file in ubergarm's ``IQ*_K_R4`` mixes, overridden to the CPU, are never offloaded: their ops and
activations stay in the host compute buffer (the May-2025 DeepSeek-V3 log of issue 450: 352.01 MiB logged
and projected this way, 156.01 with June's rule) and the first GPU holds no copy of them.  Everything
else is :mod:`ik_2025`'s.
"""

from __future__ import annotations

from offload_planner.core.dialects.base import register
from offload_planner.core.dialects.ik_2025 import Ik2025


class Ik2025May(Ik2025):
    cuda_multiplies_r4 = False  # from PR 461 (2025-05-26)


IK_2025_05 = register(Ik2025May("ik_llama.cpp-2025-05", "ik_llama.cpp (builds before 2025-05-26)"),
                      "IK_2025_05")
