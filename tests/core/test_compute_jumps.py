"""From-scratch walks over a kept graph that jump whole periods of equal layers (``compute.jumps``)
against the walk without jumps, on the catalogue's big shapes.

Each case simulates a random placement on the graph kept from the one before (the path the ``--fit``
search's dry runs far from every reference take: ``simulate(..., incremental=True)`` with nothing
recorded near it) and from scratch (``simulate(...)``, a graph built for it and walked node by node),
and wants the same reserves: bytes per backend, peak labels, copied-input bytes, node and split counts.
The placements cover layer splits over 2-4 GPUs, -ngl below the layer count, routed experts of a range
of layers on the host (the --fit search's overflow patterns), pipeline parallelism, the dry run and the
server's reserves (a graph's first walk codes no layers and jumps nothing; the later ones do); the
models a Q4_K_M file whose layers repeat every third one (DeepSeek-V3, Qwen3-235B), one alternating
sliding-window and full attention (gpt-oss) and a dense one.
"""

from __future__ import annotations

import random
import zlib

import pytest
from tests.support.fit_placements import BIG_NAMES, big_models, random_fit_opts

from offload_planner.core import compute as C
from offload_planner.core.compute import incremental as CI
from offload_planner.core.compute.stats import stats
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.fit import PATTERN_MOE_ALL
from offload_planner.core.memory import ContextParams, resolve_context
from offload_planner.core.model import Model
from offload_planner.core.placement import Override, PlacementOptions, place

GIB = 1 << 30
NAMES = BIG_NAMES


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Model]:
    return big_models(tmp_path_factory.mktemp("jump_headers"))


def _params(c: int, ub: int) -> ContextParams:
    return ContextParams(n_ctx=c, n_batch=2048, n_ubatch=ub, n_seq_max=1, kv_unified=True, flash_attn=True,
                         type_k="f16", type_v="f16", offload_kqv=True, swa_full=False, n_outputs_max=1)


def _fields(sim: C.Simulation | None) -> list[tuple[object, ...]]:
    assert sim is not None
    return [(r.n_tokens, r.sizes, r.peaks, r.copies_bytes, r.weight_copies_bytes, r.n_nodes, r.n_splits)
            for r in sim.reserves]


@pytest.mark.parametrize("name", NAMES)
def test_jumping_walk_equals_walk_from_scratch(big: dict[str, Model], name: str) -> None:
    model = big[name]
    rng = random.Random(zlib.crc32(f"jumps-{name}".encode()))
    jumps, restarts = stats["walk_jumps"], stats["walk_restarts"]
    # one context per model: its graphs are built once (a first walk codes no layers) and kept
    params = _params(c=rng.choice([4096, 32768]), ub=rng.choice([512, 2048]))
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    for i in range(12):
        n_gpu = rng.choice([2, 3, 4])
        gpus = tuple(Device(f"CUDA{k}", DeviceKind.CUDA, 24 * GIB, 24 * GIB) for k in range(n_gpu))
        devices = DeviceSet(Device("CPU", DeviceKind.CPU, 512 * GIB, 480 * GIB), gpus)
        opts = random_fit_opts(rng, model, n_gpu)
        placement = place(model, devices, opts)
        no_alloc = i % 2 == 0
        CI._SEEN.clear()  # a first sight each time: the plain path, on the kept graph
        kept = C.simulate(model, devices, placement, ctx, params, no_alloc=no_alloc, incremental=True)
        full = C.simulate(model, devices, placement, ctx, params, no_alloc=no_alloc)
        assert _fields(kept) == _fields(full), (opts, no_alloc)
    assert stats["walk_restarts"] == restarts  # no jump came out inexact
    assert stats["walk_jumps"] - jumps >= 10


@pytest.mark.parametrize("name", ["DeepSeek-V3", "gpt-oss-120b-MXFP4"])
def test_graph_copied_from_a_recorded_one_equals_built(big: dict[str, Model], name: str) -> None:
    """A reference recorded on the kept graph takes it; the next simulation far from it runs on a copy
    of that graph (``compute.template``), then the copy is kept: each equals the simulation from scratch,
    and the reference still replays a move near it exactly."""
    model = big[name]
    gpus = tuple(Device(f"CUDA{k}", DeviceKind.CUDA, 24 * GIB, 24 * GIB) for k in range(4))
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 512 * GIB, 480 * GIB), gpus)
    params = _params(c=32768, ub=512)
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    n = model.summary.n_layer
    near = [PlacementOptions(n_gpu_layers=n + 1, tensor_split=(2.0, 0.0, 0.0, float(n - 1)),
                             overrides=(Override(PATTERN_MOE_ALL, "CPU"),)),
            PlacementOptions(n_gpu_layers=n + 1, tensor_split=(3.0, 0.0, 0.0, float(n - 2)),
                             overrides=(Override(PATTERN_MOE_ALL, "CPU"),))]
    far = [PlacementOptions(n_gpu_layers=n + 1, tensor_split=(2.0, float(n - 2), 0.0, 1.0)),
           PlacementOptions(n_gpu_layers=n + 1, tensor_split=(2.0, 1.0, float(n - 3), 1.0))]
    CI._SEEN.clear()
    copies, replays = stats["graph_copies"], stats["replays"]

    def check(opts: PlacementOptions) -> None:
        placement = place(model, devices, opts)
        kept = C.simulate(model, devices, placement, ctx, params, no_alloc=True, incremental=True)
        full = C.simulate(model, devices, placement, ctx, params, no_alloc=True)
        assert _fields(kept) == _fields(full), opts

    check(near[0])  # first sight: on a graph kept for the next ones
    check(near[0])  # second: recorded as a reference, which takes the kept graph
    check(far[0])  # far from it: on a copy of the graph the reference took
    check(near[1])  # replayed against the reference
    CI._SEEN.clear()
    check(far[1])  # on the copy kept
    assert stats["graph_copies"] - copies == 1
    assert stats["replays"] - replays >= 1
