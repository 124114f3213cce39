"""Compute buffers: the simulated graph/scheduler/allocator against values llama.cpp printed.

The expected MiB below were read from ``sched_reserve: ... compute buffer size`` lines of the
pinned llama-server (``-lv 4``) on the project's small models, CPU only or with ggml-rpc-server
devices (``tests/integration/test_compute_vs_llama.py`` re-measures them).  The server's defaults
apply unless a case says otherwise: ``-np`` auto (4 slots, unified KV), n_outputs_max = 4, ``-fa on``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from offload_planner.core import compute as C
from offload_planner.core.compute.simulate import ReserveMemo
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.ggml_types import type_by_name
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import Buffer, ContextParams, project, resolve_context
from offload_planner.core.model import Model
from offload_planner.core.placement import Override, Placement, PlacementOptions, place, resolve_ngl
from offload_planner.core.units import MiB


@dataclass
class Case:
    """A llama-server-like configuration of a small model."""

    model: str
    gpus: str = ""  # "" | "RPC" | "RPC,RPC" | "CUDA" | "CUDA,CUDA"
    ngl: int | None = None
    ot: tuple[tuple[str, str], ...] = ()
    c: int = 4096
    b: int = 2048
    ub: int = 512
    np: int | None = None  # None: -np auto (4 slots, unified KV)
    kvu: bool = False
    fa: bool = True
    ctk: str = "f16"
    ctv: str = "f16"
    nkvo: bool = False
    swa_full: bool = False
    ts: tuple[float, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


def _devices(spec: str) -> DeviceSet:
    gpus = []
    for i, kind in enumerate(k for k in spec.split(",") if k):
        gpus.append(Device(f"{kind}{i}", DeviceKind(kind), total=24 << 30, free=24 << 30))
    return DeviceSet(Device("CPU", DeviceKind.CPU), tuple(gpus))


def _setup(model: Model, case: Case) -> tuple[DeviceSet, Placement, ContextParams]:
    devices = _devices(case.gpus)
    ngl = resolve_ngl(case.ngl, model.summary.n_layer, has_gpu=bool(devices.gpus))
    opts = PlacementOptions(n_gpu_layers=ngl, tensor_split=case.ts,
                            overrides=tuple(Override(p, d) for p, d in case.ot))
    np_, kvu = (4, True) if case.np is None else (case.np, case.kvu)
    n_batch = min(case.c, case.b)
    params = ContextParams(n_ctx=case.c, n_batch=case.b, n_ubatch=case.ub, n_seq_max=np_, kv_unified=kvu,
                           flash_attn=case.fa, type_k=case.ctk, type_v=case.ctv, offload_kqv=not case.nkvo,
                           swa_full=case.swa_full, n_outputs_max=min(n_batch, np_))
    return devices, place(model, devices, opts), params


def _compute(model: Model, case: Case) -> dict[str, Buffer]:
    devices, placement, params = _setup(model, case)
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    return {b.device: b for b in C.compute_buffers(model, devices, placement, ctx, params)}


def _mib(b: Buffer) -> float:
    return round(b.bytes / MiB, 2)


@pytest.fixture(scope="module")
def models(small_models: dict[str, Path]) -> dict[str, Model]:
    return {name: open_model(path) for name, path in small_models.items()}


# measured with llama-server on the small models: device -> MiB
MEASURED: list[tuple[Case, dict[str, float]]] = [
    (Case("qwen3moe"), {"CPU": 9.52}),
    (Case("qwen3moe", c=8192), {"CPU": 13.52}),
    (Case("qwen3moe", ub=256), {"CPU": 4.76}),
    (Case("qwen3moe", fa=False), {"CPU": 43.51}),
    (Case("qwen3moe", c=8192, fa=False), {"CPU": 83.51}),
    (Case("qwen3moe", np=2), {"CPU": 7.52}),
    (Case("llama", fa=False), {"CPU": 75.26}),
    (Case("llama", ctk="q8_0", ctv="q8_0"), {"CPU": 9.52}),
    (Case("deepseek2"), {"CPU": 11.51}),
    (Case("deepseek2", fa=False), {"CPU": 47.51}),
    (Case("glm4moe"), {"CPU": 9.52}),
    (Case("gpt-oss"), {"CPU": 10.53}),
    (Case("gpt-oss", fa=False), {"CPU": 79.52}),
    (Case("gemma3"), {"CPU": 10.53}),
    (Case("gemma3", fa=False), {"CPU": 45.02}),
    (Case("gemma3", swa_full=True), {"CPU": 13.53}),
    (Case("qwen3moe", gpus="RPC"), {"CPU": 6.02, "RPC0": 9.01}),
    (Case("qwen3moe", gpus="RPC,RPC"), {"CPU": 21.07, "RPC0": 27.05, "RPC1": 19.54}),
    (Case("qwen3moe", gpus="RPC,RPC", fa=False), {"CPU": 39.05, "RPC0": 74.54, "RPC1": 69.52}),
    (Case("qwen3moe", gpus="RPC", ngl=2), {"CPU": 9.52, "RPC0": 6.01}),
    (Case("qwen3moe", gpus="RPC,RPC", ngl=3), {"CPU": 9.52, "RPC0": 8.51, "RPC1": 0.03}),
    (Case("qwen3moe", gpus="RPC,RPC", ot=(("exps", "CPU"),)), {"CPU": 8.03, "RPC0": 7.01, "RPC1": 6.01}),
    (Case("qwen3moe", gpus="RPC", nkvo=True), {"CPU": 6.02, "RPC0": 9.51}),
    (Case("qwen3moe", gpus="RPC", nkvo=True, fa=False), {"CPU": 42.01, "RPC0": 5.01}),
    (Case("qwen3moe", gpus="RPC,RPC", ub=16), {"CPU": 0.66, "RPC0": 0.85, "RPC1": 0.61}),
    (Case("qwen3moe", gpus="RPC,RPC", ctk="q4_0", ctv="q4_0", c=8192),
     {"CPU": 37.2, "RPC0": 42.71, "RPC1": 35.66}),
    (Case("deepseek2", gpus="RPC,RPC", fa=False, c=2048), {"CPU": 21.05, "RPC0": 45.34, "RPC1": 40.02}),
    (Case("gemma3", gpus="RPC,RPC"), {"CPU": 25.11, "RPC0": 14.56, "RPC1": 26.07}),
    (Case("gpt-oss", gpus="RPC,RPC", c=16384, ub=1024, b=1024),
     {"CPU": 150.2, "RPC0": 163.17, "RPC1": 141.08}),
    (Case("llama", gpus="RPC", ngl=2, fa=False), {"CPU": 75.26, "RPC0": 74.26}),
]


@pytest.mark.parametrize(("case", "expected"), MEASURED, ids=[repr(c) for c, _ in MEASURED])
def test_matches_llama_server(models: dict[str, Model], case: Case, expected: dict[str, float]) -> None:
    got = {dev: _mib(b) for dev, b in _compute(models[case.model], case).items()}
    assert got == expected


# graph: nodes = N printed by llama-server for the 4096-token context, CPU only
NODES = {"llama": 133, "qwen3moe": 213, "deepseek2": 258, "glm4moe": 211, "gpt-oss": 216, "gemma3": 250}


@pytest.mark.parametrize("name", sorted(NODES))
def test_graph_has_llama_cpp_node_count(models: dict[str, Model], name: str) -> None:
    model = models[name]
    devices, placement, params = _setup(model, Case(name))
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    sim = C.simulate(model, devices, placement, ctx, params)
    assert sim is not None
    assert [r.n_nodes for r in sim.reserves] == [NODES[name], NODES[name]]
    assert [r.n_splits for r in sim.reserves] == [1, 1]


def test_buffers_are_one_per_backend_with_names_and_reasons(models: dict[str, Model]) -> None:
    bufs = _compute(models["qwen3moe"], Case("qwen3moe", gpus="RPC,RPC"))
    assert list(bufs) == ["RPC0", "RPC1", "CPU"]
    assert [b.name for b in bufs.values()] == ["RPC0", "RPC1", "CPU"]
    assert all(b.kind == "compute" and b.why for b in bufs.values())
    assert "pipeline parallelism" in bufs["RPC0"].why
    assert "logits" in bufs["RPC1"].why  # the output layer's device
    assert "logits" not in bufs["RPC0"].why


def test_cpu_side_uses_the_first_gpus_host_buffer(models: dict[str, Model]) -> None:
    bufs = _compute(models["llama"], Case("llama", gpus="CUDA"))
    assert bufs["CPU"].name == "CUDA_Host"
    assert bufs["CUDA0"].name == "CUDA0"
    assert _compute(models["llama"], Case("llama", gpus="RPC"))["CPU"].name == "CPU"


def test_project_puts_compute_buffers_on_their_devices(models: dict[str, Model]) -> None:
    model = models["glm4moe"]
    devices, placement, params = _setup(model, Case("glm4moe", gpus="RPC"))
    proj = project(model, devices, placement, params)
    assert round(proj.device("RPC0").compute / MiB, 2) > 0
    assert round(proj.device("CPU").compute / MiB, 2) > 0


# --- pipeline parallelism and op offload -----------------------------------------------------------------


def _sim(model: Model, case: Case) -> C.Simulation:
    devices, placement, params = _setup(model, case)
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    sim = C.simulate(model, devices, placement, ctx, params)
    assert sim is not None
    return sim


@pytest.mark.parametrize(("case", "copies"), [
    (Case("llama", gpus="RPC,RPC"), 4),
    (Case("llama", gpus="CUDA,CUDA"), 4),
    (Case("llama", gpus="RPC"), 1),  # one device
    (Case("llama", gpus="RPC,RPC", ngl=3), 1),  # output layer on the CPU
    (Case("llama", gpus="RPC,RPC", ot=(("ffn_up", "CPU"),)), 1),  # tensor overrides
    (Case("llama", gpus="RPC,RPC", nkvo=True), 1),  # KV not offloaded
])
def test_pipeline_parallelism_needs_full_layer_split_offload(models: dict[str, Model], case: Case,
                                                              copies: int) -> None:
    assert _sim(models[case.model], case).n_copies == copies


def test_cuda_op_offload_copies_host_experts_into_the_first_gpu(models: dict[str, Model]) -> None:
    """With experts on the CPU a CUDA device runs the expert matmuls of >= 32-token batches and holds
    a copy of each expert tensor (rows padded to 512) in its compute buffer; RPC never does."""
    model = models["qwen3moe"]
    ot = (("exps", "CPU"),)
    down = model.tensor("blk.0.ffn_down_exps.weight")
    cuda = _sim(model, Case("qwen3moe", gpus="CUDA", ot=ot))
    # gate, up and down of layers 0-2; the last layer's experts see only the 4 output rows (out_ids),
    # a batch < 32, so they stay on the CPU
    expected = sum(t.nbytes for t in model.tensors if "exps" in t.name and t.layer in (0, 1, 2))
    assert cuda.reserves[0].weight_copies_bytes[0] == expected
    assert cuda.sizes[0] >= down.nbytes
    small = _sim(model, Case("qwen3moe", gpus="CUDA", ot=ot, ub=16))  # batch < 32: no offload
    assert small.reserves[0].weight_copies_bytes == [0, 0]
    rpc = _sim(model, Case("qwen3moe", gpus="RPC", ot=ot))
    assert rpc.reserves[0].weight_copies_bytes == [0, 0]


def test_op_offload_copy_memory_is_reused_between_splits(models: dict[str, Model]) -> None:
    """Each offloaded expert matmul starts a split; its weight copy is freed after use, so the peak
    holds about one expert tensor, not all of them."""
    model = models["qwen3moe"]
    on_gpu = _sim(model, Case("qwen3moe", gpus="CUDA"))
    on_cpu = _sim(model, Case("qwen3moe", gpus="CUDA", ot=(("exps", "CPU"),)))
    all_copies = on_cpu.reserves[0].weight_copies_bytes[0]
    assert on_cpu.sizes[0] < on_gpu.sizes[0] + all_copies / 4


def test_cuda_flash_attention_converts_quantized_kv_to_f16() -> None:
    q = C.T(C.F32, [64, 512, 4, 1])
    k8 = C.T(type_by_name("q8_0"), [64, 4096, 2, 1])
    v8 = C.T(type_by_name("q8_0"), [64, 4096, 2, 1])
    mask = C.T(C.F16, [4096, 512, 1, 1])
    fa = C.flash_attn_ext(q, k8, v8, mask, None)
    extra = C.cuda_fa_alloc_size(fa) - C.nbytes(fa)
    assert extra == 2 * (2 * 64 * 4096 * 2)  # f16 K and V, each padded to 128 B
    kf = C.T(C.F16, [64, 4096, 2, 1])
    assert C.cuda_fa_alloc_size(C.flash_attn_ext(q, kf, kf, mask, None)) == C.nbytes(fa)


def test_no_alloc_dry_run_drops_forced_norms(models: dict[str, Model]) -> None:
    """llama-fit-params reserves through ggml_backend_sched_reserve_size, which resets the scheduler
    and so forgets the norms forced onto their layer's device; the server keeps them."""
    model = models["qwen3moe"]
    devices, placement, params = _setup(model, Case("qwen3moe", gpus="RPC,RPC"))
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    server = C.simulate(model, devices, placement, ctx, params)
    dry = C.simulate(model, devices, placement, ctx, params, no_alloc=True)
    assert server is not None and dry is not None
    assert len(dry.reserves) == 1 and len(server.reserves) == 2
    # the first norm of RPC1's first layer runs on RPC0 and is copied over as well
    assert dry.reserves[0].copies_bytes[1] > server.reserves[0].copies_bytes[1]


def test_unknown_architecture_falls_back_to_the_term_estimate(models: dict[str, Model],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(C.ARCH_GRAPHS, "llama")
    bufs = _compute(models["llama"], Case("llama", gpus="RPC"))
    assert set(bufs) == {"RPC0", "CPU"}
    assert all("estimate" in b.why for b in bufs.values())
    # logits (4 x vocab x 4 B) + mask (4096 x 512 x 2 B) at least
    assert bufs["RPC0"].bytes > 4096 * 512 * 2


# --- the allocator ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(NODES))
def test_peaks_name_the_layer_of_the_tensor_name_suffix(models: dict[str, Model], name: str) -> None:
    """The allocator labels its peaks with the layer a node's name ends in (``-N``, as llama.cpp's
    ``cb`` names them), found without a regex on the walk: the same layer as ``LAYER_SUFFIX`` finds for
    every node of the real graphs, and none for names that do not end in ``-digits``."""
    from offload_planner.core.compute.allocator import layer_suffix
    from offload_planner.core.compute.ggml import LAYER_SUFFIX
    from offload_planner.core.compute.graph import Builder
    from offload_planner.core.compute.simulate import weight_factory

    model = models[name]
    _, placement, params = _setup(model, Case(name))
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    sh = C.reserve_shapes(model, ctx, params, C.full_offload(placement))[0]
    b = Builder(sh, weight_factory(model, placement), placement.layer_device, placement.layer_device)
    arch_fn = C.graph_builder(model)
    assert arch_fn is not None
    arch_fn(b)
    names = [n.name for n in b.g.nodes + b.g.leafs]
    layers = sorted({int(il) for x in names if (il := layer_suffix(x)) is not None})
    assert layers == list(range(model.summary.n_layer_trunk))  # every layer names some nodes
    for x in names:
        m = LAYER_SUFFIX.search(x)
        assert layer_suffix(x) == (m.group(1) if m else None), x
    for x, want in (("l_out-61", "61"), ("ffn_moe_weighted-3", "3"), ("result_norm", None), ("a-", None),
                    ("x-1a", None), ("-0", "0"), ("kq-1-2", "2"), ("", None)):
        assert layer_suffix(x) == want, x


def test_dyn_allocator_best_fit_merge_and_peak() -> None:
    a = C.DynAllocator(32)
    x = a.alloc(100)  # 128
    y = a.alloc(64)
    z = a.alloc(200)  # 224
    assert (x, y, z) == (0, 128, 192)
    a.free(x, 100)
    a.free(z, 200)  # the tail merges back into the last block
    assert a.blocks[0] == [0, 128]
    assert a.alloc(96) == 0  # best fit: the 128-byte hole, not the tail
    a.free(y, 64)
    a.free(0, 96)  # merges 0..128 with 128..192 and the tail
    assert a.blocks == [[0, 1 << 62]]
    assert a.max_size == 416


def test_inplace_reuse_frees_the_parents_extra_space() -> None:
    """A node whose op can run in place takes its parent's memory when it is the only user."""
    be = [C.Backend("CPU", "CPU", 32)]
    x = C.input_tensor(C.F32, [256, 8], "x")
    y = C.dup_op(x, "MUL", x, x)  # 8 KiB, consumes the input
    z = C.dup_op(y, "RMS_NORM", y)  # in place over y
    w = C.T(C.F32, [256, 4], name="w")
    w.dev, w.weights = "CPU", True
    out = C.mul_mat(w, z)
    out.flags |= C.OUTPUT
    g = C.Graph()
    g.expand(out)
    galloc = C.GraphAllocator(be)
    for n in g.nodes + g.leafs:
        n.bid = 0
    sizes = galloc.run(g.nodes, [0] * len(g.nodes), g.leafs, [0] * len(g.leafs))
    assert z.alloc == y.alloc
    assert out.alloc == (0, 0)  # best fit: the input's block, freed once y consumed it
    assert sizes == [8192 * 2]


def test_a_file_that_does_not_fit_the_graph_is_estimated_not_fatal(models: dict[str, Model]) -> None:
    model = models["llama"]
    devices, placement, params = _setup(model, Case("llama", gpus="RPC"))
    placement.items = [p for p in placement.items if p.tensor.name != "blk.1.attn_q.weight"]
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    bufs = C.compute_buffers(model, devices, placement, ctx, params)
    assert {b.device for b in bufs} == {"RPC0", "CPU"}
    assert all("graph not built" in b.why for b in bufs)


def test_remembered_results_are_copies_and_follow_the_placement(models: dict[str, Model]) -> None:
    m = models["qwen3moe"]
    first = _compute(m, Case("qwen3moe", gpus="RPC"))
    first["RPC0"].bytes = -1  # a caller changing its result must not change the remembered one
    again = _compute(m, Case("qwen3moe", gpus="RPC"))
    assert again["RPC0"].bytes > 0 and again["RPC0"] is not first["RPC0"]
    moved = _compute(m, Case("qwen3moe", gpus="RPC", ot=(("exps", "CPU"),)))
    # another placement is simulated afresh (here the CPU side's inputs change, not its peak)
    assert [(b.bytes, b.why) for b in moved.values()] != [(b.bytes, b.why) for b in again.values()]


@pytest.mark.parametrize(("name", "n_reserves"), [("qwen3moe", 3), ("deepseek2", 3), ("gpt-oss", 4)])
def test_a_reserve_memo_shares_the_one_token_graph_across_ubatches(models: dict[str, Model], name: str,
                                                                    n_reserves: int) -> None:
    """A caller that simulates one placement at several -ub (the fastest-plan search) keeps a memo of
    reserves: the one-token graph does not read -ub, so it is simulated once, except on a model with
    sliding-window layers (its SWA cells grow with -ub); every buffer equals a fresh simulation's."""
    m = models[name]
    memo: ReserveMemo = {}
    for ub in (256, 1024):
        case = Case(name, gpus="RPC,RPC", ot=(("exps", "CPU"),), ub=ub, b=1024)
        devices, placement, params = _setup(m, case)
        ctx = resolve_context(params, m.summary.n_ctx_train, m.summary.n_swa)
        got = C.simulate_buffers(m, devices, placement, ctx, params, incremental=False, memo=memo)
        fresh = C.simulate_buffers(m, devices, placement, ctx, params, incremental=False)
        assert [(b.device, b.bytes, b.why) for b in got] == [(b.device, b.bytes, b.why) for b in fresh]
    assert len(memo) == n_reserves  # two prompt graphs, one (or two) one-token graphs
