"""Random placements as llama.cpp's ``--fit`` search writes them, for the compute tests that compare a
shortcut (period jumps, layer-by-layer scheduling) with the plain walk."""

from __future__ import annotations

import random

from offload_planner.core.fit import PATTERN_MOE_ALL, overflow_pattern
from offload_planner.core.model import Model
from offload_planner.core.placement import Override, PlacementOptions


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
