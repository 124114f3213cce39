"""Tensor type selection for synthetic models, following ``llama-quantize`` (``src/llama-quant.cpp``)."""

from __future__ import annotations

from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from offload_planner.core.synth.ik_types import IkQ, ik_type
from offload_planner.core.synth.spec import ModelSpec, QType, QuantMix
from offload_planner.core.synth.tensors import TensorDef

# tensor_type_fallback: a type whose block does not divide ne0 is demoted like this.
_FALLBACK: dict[Q, Q] = {
    Q.Q2_K: Q.Q4_0,
    Q.Q3_K: Q.Q4_0,
    Q.Q4_K: Q.Q5_0,
    Q.Q5_K: Q.Q5_1,
    Q.Q6_K: Q.Q8_0,
    Q.IQ1_S: Q.IQ4_NL,
    Q.IQ1_M: Q.IQ4_NL,
    Q.IQ2_XXS: Q.IQ4_NL,
    Q.IQ2_XS: Q.IQ4_NL,
    Q.IQ2_S: Q.IQ4_NL,
    Q.IQ3_XXS: Q.IQ4_NL,
    Q.IQ3_S: Q.IQ4_NL,
    Q.IQ4_XS: Q.IQ4_NL,
}

_MORE_BITS_SLOTS = frozenset({"attn_v", "ffn_down", "shexp_down", "exps_down"})


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama-quantize's rule for the layers that get a bigger type in the ``_M`` mixes."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def block_size(t: QType) -> int:
    return ik_type(t).block_size if isinstance(t, IkQ) else int(GGML_QUANT_SIZES[t][0])


def tensor_nbytes(t: QType, shape: tuple[int, ...]) -> int:
    if isinstance(t, IkQ):  # ik's sizes, with its per-row metadata
        return ik_type(t).nbytes(shape)
    blck, size = GGML_QUANT_SIZES[t]
    rows = 1
    for d in shape[1:]:
        rows *= d
    return rows * (shape[0] // blck) * size


def fallback(t: QType, ne0: int) -> QType:
    if ne0 % block_size(t) == 0:
        return t
    if isinstance(t, IkQ):
        return Q.F16  # the ik types are written for shapes they divide; no ik fallback is modelled
    demoted = _FALLBACK.get(t, t)
    if ne0 % block_size(demoted) == 0:
        return demoted
    return Q.F16


def pick_type(spec: ModelSpec, td: TensorDef) -> QType:
    mix: QuantMix = spec.quant
    slot = td.slot
    if slot == "embd" and spec.tied_embeddings:
        slot = "output"  # a tied embedding is quantized like the output it doubles as
    t: QType = getattr(mix, slot)
    if (
        mix.more_bits is not None
        and slot in _MORE_BITS_SLOTS
        and td.layer is not None
        and use_more_bits(td.layer, spec.n_layer)
    ):
        t = mix.more_bits
    return fallback(t, td.shape[0])
