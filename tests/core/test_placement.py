"""Placement rules of llama.cpp's load_tensors / create_tensor, on the project's small models.

Expectations follow the pinned source (src/llama-model.cpp, src/llama-model-loader.cpp); the
integration test (tests/integration/test_plan_vs_llama.py) checks the same rules against the real
server's buffers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.placement import (
    CPU,
    CPU_MAPPED,
    CPU_REPACK,
    Override,
    PlacementOptions,
    place,
    placed_devices,
    unit_devices,
)

CPU_DEV = Device("CPU", DeviceKind.CPU)
GIB = 1024**3


def _gpus(kind: DeviceKind, n: int) -> DeviceSet:
    return DeviceSet(CPU_DEV, tuple(Device(f"{kind.value}{i}", kind, 24 * GIB, 24 * GIB) for i in range(n)))


def rpc(n: int) -> DeviceSet:
    return _gpus(DeviceKind.RPC, n)


def cuda(n: int) -> DeviceSet:
    return _gpus(DeviceKind.CUDA, n)


@pytest.fixture(scope="module")
def qwen(small_models: dict[str, Path]) -> Model:
    return open_model(small_models["qwen3moe"])


@pytest.fixture(scope="module")
def glm(small_models: dict[str, Path]) -> Model:
    return open_model(small_models["glm4moe"])


def test_output_layer_is_offloaded_first_in_the_pinned_build() -> None:
    gpus = list(rpc(1).gpus)
    # L = 4 blocks: units 0..4, unit 4 is the output layer
    assert unit_devices(4, 1, gpus, (), output_first=True) == [CPU, CPU, CPU, CPU, "RPC0"]
    assert unit_devices(4, 4, gpus, (), output_first=True) == [CPU, "RPC0", "RPC0", "RPC0", "RPC0"]
    assert unit_devices(4, 5, gpus, (), output_first=True) == ["RPC0"] * 5
    # 2025 mainline and ik: repeating layers first, output only when ngl > L
    assert unit_devices(4, 1, gpus, (), output_first=False) == [CPU, CPU, CPU, "RPC0", CPU]
    assert unit_devices(4, 4, gpus, (), output_first=False) == ["RPC0"] * 4 + [CPU]


def test_tensor_split_counts_units_not_bytes() -> None:
    gpus = list(rpc(2).gpus)
    assert unit_devices(4, 5, gpus, (1, 1), output_first=True) == ["RPC0", "RPC0", "RPC0", "RPC1", "RPC1"]
    assert unit_devices(4, 5, gpus, (3, 1), output_first=True) == ["RPC0"] * 4 + ["RPC1"]
    assert unit_devices(4, 5, gpus, (1, 0), output_first=True) == ["RPC0"] * 5


def test_first_matching_override_wins_and_cpu_overrides_use_the_cpu_list(qwen: Model) -> None:
    opts = PlacementOptions(
        n_gpu_layers=5,
        tensor_split=(1, 1),
        overrides=(Override(r"blk\.1\.", "RPC1"), Override("exps", "CPU")),
    )
    p = place(qwen, rpc(2), opts)
    by = {x.tensor.name: x for x in p.items if not x.copy}
    assert by["blk.1.ffn_up_exps.weight"].device == "RPC1"  # first rule
    assert by["blk.1.attn_q.weight"].device == "RPC1"
    up0 = by["blk.0.ffn_up_exps.weight"]
    assert up0.device == CPU
    # no GPU host buffer with RPC devices: a repackable q4_K expert goes to CPU_REPACK
    assert up0.buft == (CPU_REPACK if up0.tensor.type.name == "q4_K" else CPU_MAPPED)
    assert by["token_embd.weight"].device == CPU and by["token_embd.weight"].buft == CPU_MAPPED
    assert p.override_hits[0] > 0 and p.override_hits[1] > 0


def test_cuda_host_buffer_comes_before_repack(qwen: Model) -> None:
    opts = PlacementOptions(n_gpu_layers=5, overrides=(Override("exps", "CPU"),), use_mmap=False)
    p = place(qwen, cuda(1), opts)
    bufts = {x.buft for x in p.items if x.device == CPU}
    assert bufts == {"CUDA_Host"}
    p = place(qwen, cuda(1), PlacementOptions(n_gpu_layers=5, overrides=(Override("exps", "CPU"),)))
    assert {x.buft for x in p.items if x.device == CPU} == {CPU_MAPPED}


def test_nextn_blocks_are_not_loaded_but_count_for_ngl(glm: Model) -> None:
    s = glm.summary
    assert s.n_nextn == 1
    p = place(glm, rpc(1), PlacementOptions(n_gpu_layers=s.n_layer + 1))
    skipped = [x for x in p.items if x.device is None]
    assert skipped and all(x.tensor.layer == s.n_layer - 1 for x in skipped)
    # -ngl L leaves blk.0 on the CPU even though the last block is NextN
    p = place(glm, rpc(1), PlacementOptions(n_gpu_layers=s.n_layer))
    assert p.layer_device(0) == CPU and p.output_device == "RPC0"


def test_tied_embeddings_get_an_output_copy_on_the_output_device(small_models: dict[str, Path]) -> None:
    m = open_model(small_models["gemma3"])
    assert m.get("output.weight") is None  # Gemma ties its embeddings
    p = place(m, rpc(1), PlacementOptions(n_gpu_layers=99))
    copies = [x for x in p.items if x.copy]
    assert len(copies) == 1 and copies[0].device == "RPC0"
    p = place(m, rpc(1), PlacementOptions(n_gpu_layers=0))
    assert not [x for x in p.items if x.copy]  # same CPU buffer: llama.cpp reuses the tensor


@pytest.mark.parametrize("name", ["gemma3", "glm4moe", "qwen3moe", "llama"])
def test_placed_devices_are_the_placements_devices(small_models: dict[str, Path], name: str) -> None:
    """The export's quick check (devices only) agrees with the full placement: -ngl, -ts, -sm none,
    overrides of layers, experts and the tied embedding (its output copy), MTP, no host buffer."""
    m = open_model(small_models[name])
    ovs = (Override(r"blk\.1\.", "CUDA1"), Override("exps", CPU), Override("token_embd", "CUDA0"),
           Override("output", CPU), Override("nomatch", "CUDA0"))
    embd_cpu = (Override("token_embd", CPU),)  # the tied copy of a host-overridden embedding
    options = [PlacementOptions(n_gpu_layers=n, tensor_split=ts, overrides=o, split_mode=sm, load_mtp=mtp,
                                no_host=nh, use_extra_bufts=nh, use_mmap=mmap, plain_cpu_overrides=plain)
               for n in (0, 2, 99) for ts in ((), (1.0, 3.0)) for o in ((), ovs[:2], ovs[2:], ovs, embd_cpu)
               for sm, mtp, nh, mmap in (("layer", False, False, True), ("none", True, True, True),
                                         ("layer", False, False, False))
               for plain in (False, True)]
    seen = set()
    for opts in options:
        want = place(m, cuda(2), opts).tensor_devices()
        assert placed_devices(m, cuda(2), opts) == want, opts
        seen.add(tuple(sorted(set(want.values()))))
    assert len(seen) > 3  # the options really move tensors around


def test_placed_make_is_the_dataclass_constructor(qwen: Model) -> None:
    """``Placed.make`` (placement's fast path) builds what ``Placed(...)`` builds, every field included:
    equal, same hash and fields (a field added to Placed and not to make fails here)."""
    from dataclasses import fields

    from offload_planner.core.placement import Placed

    t = qwen.tensors[3]
    for args in ((t, "CUDA0", "CUDA0", "layer 0 by -ngl 99"), (t, None, None, "NextN"),
                 (t, CPU, CPU_MAPPED, "-ot exps=CPU", True)):
        fast, plain = Placed.make(*args), Placed(*args)
        assert fast == plain and hash(fast) == hash(plain) and vars(fast) == vars(plain)
        assert set(vars(fast)) == {f.name for f in fields(Placed)}
