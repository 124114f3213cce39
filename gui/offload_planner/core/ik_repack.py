"""ik_llama.cpp's run-time repack (``-rtr``) and what it does to op offload.

With ``-rtr`` (which turns mmap off) ik rewrites every weight in a host buffer (``CPU`` or the GPU's
``CUDA_Host``) into a row-interleaved type at load (``src/llama.cpp``: ``iqk_repack_tensor`` for every
tensor with ``ggml_backend_buffer_is_host``; ``ggml/src/iqk/iqk_quantize.cpp``: ``get_repack_info``),
except the token embeddings and matrices whose row count is not a multiple of the interleave.  The CUDA
backend's ``supports_op`` lists only a few of the repacked types (the ``IQ*_K_R4`` family), so the
scheduler cannot offload an op whose host weight was repacked to another one: those matrix
multiplications stay on the CPU at every batch size, and the first GPU's compute buffer holds no copy of
them.  The same in ik's builds of May 2025 (056f0818), June 2025 (5236c98b) and August 2026 (8337e4cd).
"""

from __future__ import annotations

from collections.abc import Iterable

from offload_planner.core.ggml_types import IK_TYPES

IK_TYPES_BY_NAME = {t.name.lower(): t.id for t in IK_TYPES.values()}

#: ``get_repack_info``: ggml type -> rows interleaved, for the types whose repacked type the CUDA backend
#: cannot multiply (``ggml_backend_cuda_supports_op`` lacks Q*_R4/R8, IQ*_XXS/XS/S_R4, IQ4_NL_R4, IQ4_XS_R8,
#: IQ2_BN_R4, MXFP4_R8; the bf16/f16 repack exists only in AVX512-BF16 builds and is left out).
REPACK_ROWS_NOT_ON_CUDA: dict[str, int] = {
    "iq4_xs": 8, "iq4_nl": 4, "iq2_bn": 4, "iq2_xxs": 4, "iq2_xs": 4, "iq2_s": 4, "iq3_xxs": 4, "iq3_s": 4,
    "q2_k": 4, "q3_k": 4, "q4_k": 4, "q5_k": 4, "q6_k": 4, "q4_0": 8, "q5_0": 4, "q6_0": 4, "q8_0": 8,
    "q8_k": 8, "q8_kv": 8, "mxfp4": 8,
}
#: ``ggml_backend_cuda_supports_op`` (MUL_MAT, MUL_MAT_ID, MOE_FUSED_UP_GATE) of ik's current source: the only
#: row-interleaved types the CUDA backend multiplies (PRs 461/462 of May 2025, 494 of June 2025).  A file's
#: weight of another ``_R4``/``_R8`` type (ik's type ids 202-399) in a host buffer is never offloaded either.
CUDA_R4_TYPES = frozenset({"iq2_k_r4", "iq3_k_r4", "iq4_k_r4", "iq4_ks_r4", "iq5_k_r4", "iq5_ks_r4",
                           "iq1_s_r4", "iq1_m_r4"})
_R4_IDS = range(202, 400)  # GGML_TYPE_Q4_0_R8 .. GGML_TYPE_Q8_K_R8 in ik's enum
#: ``is_forbidden_tensor``: never repacked.
NOT_REPACKED = frozenset({"token_embd.weight", "per_layer_token_embd.weight"})


def interleaved_off_gpu(weights: Iterable[tuple[str, tuple[int, ...], str]],
                        cuda_multiplies_r4: bool = True) -> frozenset[str]:
    """Names of the host weights whose file type is row-interleaved and not one the CUDA backend multiplies
    (none of them before ik's PR 461 of 2025-05-26: ``cuda_multiplies_r4`` False)."""
    out = set()
    for name, _shape, type_name in weights:
        t = type_name.lower()
        if IK_TYPES_BY_NAME.get(t, -1) in _R4_IDS and not (cuda_multiplies_r4 and t in CUDA_R4_TYPES):
            out.add(name)
    return frozenset(out)


def repacked_off_gpu(weights: Iterable[tuple[str, tuple[int, ...], str]]) -> frozenset[str]:
    """Names of the host weights (name, shape, ggml type name) that ``-rtr`` repacks into a type the
    CUDA backend cannot run: ops reading them are not offloaded."""
    out = set()
    for name, shape, type_name in weights:
        rows = REPACK_ROWS_NOT_ON_CUDA.get(type_name.lower())
        ne1 = shape[1] if len(shape) > 1 else 1
        if rows and name not in NOT_REPACKED and ne1 % 4 == 0 and ne1 % rows == 0:
            out.add(name)
    return frozenset(out)
