"""The DSA graph (core.compute.dsa) in the incremental engine: its per-layer zero-filled leaf (the top-k
unmasking's zeros) has no backend until scheduler pass 4 gives it its reader's, and the graph allocator
places every leaf before any node.  A layer split that moves a layer (its KV cache, its attention and so
that leaf) to the other GPU is replayed with the allocator walked again from the start
(``stats["from_start"]``); the reserves equal the from-scratch simulation's, peak labels included.
Compute buffers against the real server: tests/integration/test_dsa_vs_llama.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from tests.core.test_compute_incremental import _bench_setting, _fields

import offload_planner.core.compute as C
import offload_planner.core.compute.incremental as CI
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import Plan
from offload_planner.core.synth import all_models, write_model


@pytest.mark.parametrize("name", ["deepseek32", "glm-dsa", "DeepSeek-V3.2-Q8_0"])
def test_a_moved_layer_split_is_replayed_from_the_start(name: str, tmp_path: Path) -> None:
    [path] = write_model(all_models()[name], tmp_path / f"{name}.gguf", header_only=True)
    model = open_model(path)
    devices, params, ctx, opts = _bench_setting(model)
    base = Plan(model, devices, replace(opts, tensor_split=(1.0, 1.0)), params).placement()
    for _ in range(2):  # the second simulation of a topology records the reference
        C.simulate(model, devices, base, ctx, params, incremental=True)
    before = dict(CI.stats)
    for ts in ((1.2, 1.0), (1.0, 1.2), (1.1, 1.0)):
        placement = Plan(model, devices, replace(opts, tensor_split=ts), params).placement()
        fast = C.simulate(model, devices, placement, ctx, params, incremental=True)
        assert _fields(fast) == _fields(C.simulate(model, devices, placement, ctx, params)), ts
    assert CI.stats["replays"] - before["replays"] == 6  # both reserves of the three splits
    assert CI.stats["from_start"] - before["from_start"] >= 4
    assert CI.stats["replay_errors"] == before["replay_errors"]
