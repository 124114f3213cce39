"""The speed estimate's graph splits of a generated token (``split_pairs``) are the splits the simulated
scheduler makes of the one-token graph (``ggml_backend_sched_split_graph`` over the architecture's
graph, :mod:`offload_planner.core.compute`): the same count and the same (from, to) devices in order,
on the small complete models core.synth writes and the bundled DeepSeek-V3 header, over whole layers on
GPUs, experts on the CPU (``-ot exps=CPU``, ``--n-cpu-moe``), ``-ngl`` partial, attention on one GPU
and the experts on another, and single expert, shared expert and dense FFN matrices moved to another
device (a layer's matrices on two devices: every step of the FFN that moves is a split), attention
matrices moved one at a time (Q, K, V, output; MLA's q_a, q_b, kv_a_mqa, k_b, v_b; norms and sinks: each
architecture's ``build_attn`` order, the KV store and pinned norms on the layer's device); on Qwen3-30B's
header with ``-ngl`` partial, each CPU layer's one-token ``MUL`` by its 32-head Q norm goes to the GPU
by op offload and back (two splits a layer; none with ``--no-op-offload``)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.compute.graph import Builder
from offload_planner.core.compute.scheduler import Scheduler
from offload_planner.core.compute.simulate import (
    backends_for,
    full_offload,
    graph_builder,
    reserve_shapes,
    weight_factory,
)
from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import resolve_context
from offload_planner.core.model import Model
from offload_planner.core.placement import CPU
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.speed.splits import token_split_pairs

RES = Path(__file__).resolve().parents[2] / "resources"
TWO_GPUS = (parse_device_decl("CUDA0=80GiB"), parse_device_decl("CUDA1=80GiB"))

#: Placements (after ``-c 4096 -np 1``: the one-token graph holds one token).
WHOLE = ["-ngl 99", "-ngl 2", "-ngl 99 -ts 1,0 -ot exps=CUDA1"]
MOE = ["-ngl 99 -ot exps=CPU", "-ngl 99 --n-cpu-moe 3",
       r"-ngl 99 -ot blk\.[1-3]\.ffn_up_exps=CUDA1 -ot blk\.[4-5]\.ffn_down_exps=CUDA0 -ot exps=CPU",
       r"-ngl 99 -ot blk\.[0-9]\.ffn_gate_exps=CPU -ot blk\.[0-9]\.ffn_down_exps=CPU",
       r"-ngl 99 -ot blk\.[0-9]\.ffn_up_exps=CPU",
       r"-ngl 99 -ot blk\.[0-9]\.ffn_gate_exps=CUDA1 -ot exps=CPU"]
DENSE = [r"-ngl 99 -ot blk\.[0-9]\.ffn_up\.=CPU", r"-ngl 99 -ot blk\.[0-9]\.ffn_down\.=CUDA1",
         r"-ngl 99 -ot blk\.[0-9]\.ffn_gate\.=CPU"]
SHARED = [r"-ngl 99 -ot blk\.[0-9]\.ffn_up_shexp=CPU", r"-ngl 99 -ot blk\.[0-9]\.ffn_down_shexp=CUDA1",
          "-ngl 99 -ot shexp=CPU"]
#: Attention matrices moved one at a time (each layer's graph runs its Q, K, V in the order its
#: ``build_attn`` expands them: Q, V, K; Q, K, V with the sliding-window cache; the attention op where
#: the layer's KV cache is): Q alone to the CPU, K and V to the CPU, K alone, V alone to the other GPU,
#: the output alone, Q, K and V to the CPU (the KV cache and the attention op stay on the GPU).
ATTN = [r"-ngl 99 -ot blk\.[0-9]\.attn_q\.=CPU", r"-ngl 99 -ot blk\.[0-9]\.attn_[kv]\.=CPU",
        r"-ngl 99 -ot blk\.[0-9]\.attn_k\.=CPU", r"-ngl 99 -ot blk\.[0-9]\.attn_v\.=CUDA1",
        r"-ngl 99 -ot blk\.[0-9]\.attn_output\.=CPU", r"-ngl 99 -ot blk\.[0-9]\.attn_[qkv]\.=CPU",
        r"-ngl 2 -ot blk\.[0-9]\.attn_q\.=CUDA0", r"-ngl 99 -ot blk\.[0-9]\.attn_norm=CPU",
        r"-ngl 1 -ot blk\.[0-9]\.attn_[qkvo].*=CUDA0"]
#: DeepSeek's MLA (Q through its LoRA, the absorbed K and V): q_a, q_b, kv_a_mqa, k_b, v_b singly.
MLA = [r"-ngl 99 -ot blk\.[0-9]\.attn_q_a\.=CPU", r"-ngl 99 -ot blk\.[0-9]\.attn_q_b\.=CPU",
       r"-ngl 99 -ot blk\.[0-9]\.attn_kv_a_mqa\.=CPU", r"-ngl 99 -ot blk\.[0-9]\.attn_k_b\.=CPU",
       r"-ngl 99 -ot blk\.[0-9]\.attn_v_b\.=CUDA1", r"-ngl 99 -ot blk\.[0-9]\.attn_q_b\.=CPU "
       r"-ot blk\.[0-9]\.attn_v_b\.=CPU", r"-ngl 99 -ot blk\.[0-9]\.attn_output\.=CPU"]
SINGLE = ([(m, a) for m in ("llama", "qwen3moe", "gemma3", "gpt-oss", "glm4moe") for a in ATTN]
          + [(m, a) for m in ("deepseek2", "DeepSeek-V3") for a in MLA]
          + [("gpt-oss", "-ngl 99 -ot attn_sinks=CPU"), ("gpt-oss", "-ngl 99 -fa off -ot attn_sinks=CPU"),
             ("Qwen3-30B", r"-ngl 99 -ot blk\.[0-9]\.attn_q_norm=CPU"),
             ("Qwen3-30B", r"-ngl 20 -ot blk\.[0-9]\.attn_k\.=CUDA0")])
CASES = ([("llama", a) for a in WHOLE + DENSE] + [("gemma3", a) for a in WHOLE + DENSE]
         + [("qwen3moe", a) for a in WHOLE + MOE] + [("gpt-oss", a) for a in WHOLE + MOE]
         + [(m, a) for m in ("deepseek2", "glm4moe") for a in WHOLE + MOE + SHARED + DENSE[:2]]
         + [("DeepSeek-V3", a) for a in WHOLE + MOE + SHARED]
         + [("Qwen3-30B", a) for a in [*WHOLE, "-ngl 20", "-ngl 20 --no-op-offload", *MOE[:3]]]
         + SINGLE)


def scheduled_pairs(plan: Plan) -> list[tuple[str, str]]:
    """(from, to) of the simulated scheduler's splits of the one-token graph the server reserves."""
    model, placement, p = plan.model, plan.placement(), plan.context
    s = model.summary
    ctx = resolve_context(p, s.n_ctx_train, s.n_swa)
    shape = reserve_shapes(model, ctx, p, full_offload(placement))[-1]
    assert shape.n_tokens == 1
    backends = backends_for(plan.devices, placement)
    b = Builder(shape, weight_factory(model, placement), placement.layer_device,
                lambda il: placement.layer_device(il) if p.offload_kqv else CPU)
    arch = graph_builder(model)
    assert arch is not None
    arch(b)
    sched = Scheduler(backends, 1, p.op_offload)
    sched.split_graph(b.g)
    names = [backends[sp.backend].name for sp in sched.splits]
    return list(itertools.pairwise(names))


@pytest.fixture(scope="module")
def models(small_models: dict[str, Path]) -> dict[str, Model]:
    out = {name: open_model(str(path)) for name, path in small_models.items()}
    out["DeepSeek-V3"] = open_model(str(RES / "DeepSeek-V3-Q4_K_M.header.gguf"))
    out["Qwen3-30B"] = open_model(str(RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf"))
    return out


@pytest.mark.parametrize(("name", "args"), CASES)
def test_estimated_splits_are_the_schedulers(models: dict[str, Model], name: str, args: str) -> None:
    model = models[name]
    plan = plan_from_args(model, DeviceSet(parse_device_decl("CPU=1024GiB"), TWO_GPUS),
                          parse_server_args([*args.split(), "-c", "4096", "-np", "1"]))
    assert token_split_pairs(plan, plan.placement()) == scheduled_pairs(plan)


def test_a_layer_with_its_experts_on_two_devices_costs_a_split_per_step(models: dict[str, Model]) -> None:
    """DeepSeek-V3 on two GPUs, the down experts of layers 10-19 on the CPU: each such layer goes to
    the CPU for its down experts and back for the shared expert (the old count, by each stage's first
    tensor, saw none of them: 2 splits)."""
    model = models["DeepSeek-V3"]
    args = ["-ngl", "99", "-c", "4096", "-np", "1", "-ot", r"blk\.1[0-9]\.ffn_down_exps=CPU"]
    ds = DeviceSet(parse_device_decl("CPU=1024GiB"), TWO_GPUS)
    plan = plan_from_args(model, ds, parse_server_args(args))
    pairs = token_split_pairs(plan, plan.placement())
    assert len(pairs) == 2 + 2 * 10
    assert pairs.count(("CUDA0", "CPU")) == pairs.count(("CPU", "CUDA0")) - 1 == 10


def test_a_cpu_layers_query_norm_goes_to_the_gpu_by_op_offload(models: dict[str, Model]) -> None:
    """Qwen3-30B, -ngl 20 on one GPU (19 of 48 layers and the output): the 29 CPU layers' one-token
    Q-norm ``MUL`` (32 rows of a host weight) is offloaded to the GPU and back: 2 x 29 splits beside
    the layer boundary's."""
    model = models["Qwen3-30B"]
    ds = DeviceSet(parse_device_decl("CPU=1024GiB"), TWO_GPUS[:1])
    on = plan_from_args(model, ds, parse_server_args(["-ngl", "20", "-c", "4096", "-np", "1"]))
    off = plan_from_args(model, ds, parse_server_args(["-ngl", "20", "-c", "4096", "-np", "1",
                                                      "--no-op-offload"]))
    assert len(token_split_pairs(off, off.placement())) == 1
    placement = on.placement()
    assert sum(placement.layer_device(il) == CPU for il in range(48)) == 29
    assert len(token_split_pairs(on, placement)) == 1 + 2 * 29 == len(scheduled_pairs(on))
