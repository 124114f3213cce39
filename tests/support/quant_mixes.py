"""Quantization mixes for synthetic models in tests."""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q

from offload_planner.core.synth import QuantMix


def uniform_mix(t: Q, ftype: int) -> QuantMix:
    """Every tensor of the model in ``t`` (``ftype``: the file type the header names)."""
    return QuantMix(name=f"uniform-{t.name}", ftype=ftype, embd=t, output=t, attn=t, attn_v=t, ffn=t,
                    ffn_down=t, shexp=t, shexp_down=t, exps=t, exps_down=t, nextn=t)
