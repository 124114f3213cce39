"""Random placements as llama.cpp's ``--fit`` search writes them, for the compute tests that compare a
shortcut (period jumps, layer-by-layer scheduling) with the plain walk."""

from __future__ import annotations

import random
from pathlib import Path

from offload_planner.cli import demo_model_path
from offload_planner.core.fit import PATTERN_MOE_ALL, overflow_pattern
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.placement import Override, PlacementOptions
from offload_planner.core.synth import BIG_MODELS, write_model

#: the big models these tests walk: the bundled DeepSeek-V3 header and three the synth writes
BIG_NAMES = ["DeepSeek-V3", "Qwen3-235B-A22B-Q4_K_M", "gpt-oss-120b-MXFP4", "Llama-3.1-70B-Q4_K_M"]


def big_models(root: Path) -> dict[str, Model]:
    """:data:`BIG_NAMES` opened: the synth's headers written under ``root``, DeepSeek-V3 bundled."""
    out = {n: open_model(write_model(BIG_MODELS[n], root / f"{n}.header.gguf", header_only=True)[0])
           for n in BIG_NAMES[1:]}
    out["DeepSeek-V3"] = open_model(demo_model_path())
    return out


def random_fit_opts(rng: random.Random, model: Model, n_gpu: int) -> PlacementOptions:
    """-ngl, -ts and overrides as the --fit search writes them (or none: pipeline parallelism)."""
    n_layer = model.summary.n_layer
    moe = any(t.role.is_routed_expert for t in model.tensors)
    ngl = rng.choice([n_layer + 1, n_layer + 1, n_layer - rng.randint(1, n_layer // 2)])
    ts = tuple(float(rng.randint(0, 20)) for _ in range(n_gpu))
    ot: tuple[Override, ...] = ()
    kind = rng.random()
    if moe and kind < 0.3:
        ot = (Override(PATTERN_MOE_ALL, "CPU"),)
    elif moe and kind < 0.8:
        lo = rng.randint(0, n_layer - 2)
        ot = tuple(Override(overflow_pattern(il, rng.choice([1, 2, 3, 4]) if il == lo else 4), "CPU")
                   for il in range(lo, rng.randint(lo + 1, n_layer)))
    return PlacementOptions(n_gpu_layers=ngl, tensor_split=ts if any(ts) else (), overrides=ot)
