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

#: ``get_repack_info``: ggml type -> rows interleaved, for the types whose repacked type the CUDA backend
#: cannot multiply (``ggml_backend_cuda_supports_op`` lacks Q*_R4/R8, IQ*_XXS/XS/S_R4, IQ4_NL_R4, IQ4_XS_R8,
#: IQ2_BN_R4, MXFP4_R8; the bf16/f16 repack exists only in AVX512-BF16 builds and is left out).
REPACK_ROWS_NOT_ON_CUDA: dict[str, int] = {
    "iq4_xs": 8, "iq4_nl": 4, "iq2_bn": 4, "iq2_xxs": 4, "iq2_xs": 4, "iq2_s": 4, "iq3_xxs": 4, "iq3_s": 4,
    "q2_k": 4, "q3_k": 4, "q4_k": 4, "q5_k": 4, "q6_k": 4, "q4_0": 8, "q5_0": 4, "q6_0": 4, "q8_0": 8,
    "q8_k": 8, "q8_kv": 8, "mxfp4": 8,
}
#: ``is_forbidden_tensor``: never repacked.
NOT_REPACKED = frozenset({"token_embd.weight", "per_layer_token_embd.weight"})


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
