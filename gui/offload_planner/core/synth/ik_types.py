"""ik_llama.cpp-only tensor types the synth can write (header-only files: only the type id and the
byte count matter).  The ``gguf`` package knows mainline's types only; these ids are ik's
(``ggml/include/ggml.h`` of ikawrakow/ik_llama.cpp) and their sizes come from
:mod:`offload_planner.core.ggml_types`, so a written file reads back as an ik file."""

from __future__ import annotations

from enum import IntEnum

from offload_planner.core.ggml_types import IK_TYPES, GGMLType


class IkQ(IntEnum):
    """The ik types of the public ik logs' files (ubergarm's mixes and ik's own quantizations)."""

    Q6_0 = 133
    IQ2_K = 137
    IQ3_K = 138
    IQ4_K = 139
    IQ5_K = 140
    IQ6_K = 141
    IQ4_KS = 144
    IQ2_KS = 145
    IQ5_KS = 152
    Q8_0_R8 = 208
    Q2_K_R4 = 210
    Q3_K_R4 = 211
    Q4_K_R4 = 212
    Q5_K_R4 = 213
    Q6_K_R4 = 214
    IQ2_K_R4 = 337
    IQ3_K_R4 = 338
    IQ4_K_R4 = 339
    IQ5_K_R4 = 340
    IQ4_KS_R4 = 344
    IQ5_KS_R4 = 352


def ik_type(t: IkQ) -> GGMLType:
    return IK_TYPES[int(t)]
