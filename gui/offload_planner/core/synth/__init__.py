"""GGUF model factory: tiny loadable models and header-only copies of real ones.

Used by the tests (llama.cpp must load every small model and agree with our reader) and to
generate the demo models shipped in ``resources/`` (``python -m offload_planner.core.synth``).
"""

from offload_planner.core.synth.catalog import BIG_MODELS, DEMO_MODELS, SMALL_MODELS, all_models
from offload_planner.core.synth.spec import (
    ModelSpec,
    QuantMix,
    RopeScaling,
    TokenizerKind,
    TokenizerSpec,
)
from offload_planner.core.synth.tensors import TensorDef, tensor_defs
from offload_planner.core.synth.writer import count_tensors, total_tensor_bytes, write_model

__all__ = [
    "BIG_MODELS",
    "DEMO_MODELS",
    "SMALL_MODELS",
    "ModelSpec",
    "QuantMix",
    "RopeScaling",
    "TensorDef",
    "TokenizerKind",
    "TokenizerSpec",
    "all_models",
    "count_tensors",
    "tensor_defs",
    "total_tensor_bytes",
    "write_model",
]
