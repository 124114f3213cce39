"""The exported command means the plan: parsing it places every tensor where the plan had it.

Random plans (random -ngl, -ts and tensor-by-tensor moves) on several architectures; the
exported argument list goes through the real command-line parser and the engine again.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offload_planner.cli import demo_model_path
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.placement import PlacementOptions
from offload_planner.core.plan import Plan, plan_command, plan_from_args

GIB = 1024**3
CPU_DEV = Device("CPU", DeviceKind.CPU, 256 * GIB, 256 * GIB)
DEVICES = {
    "cuda": DeviceSet(CPU_DEV, tuple(Device(f"CUDA{i}", DeviceKind.CUDA, 24 * GIB, 24 * GIB)
                                     for i in range(2))),
    "rpc": DeviceSet(CPU_DEV, tuple(Device(f"RPC{i}", DeviceKind.RPC, 24 * GIB, 24 * GIB,
                                           endpoint=f"127.0.0.1:{5000 + i}") for i in range(2))),
}


@pytest.fixture(scope="module")
def models(small_models: dict[str, Path]) -> dict[str, Model]:
    out = {name: open_model(small_models[name]) for name in ("qwen3moe", "deepseek2", "glm4moe", "gemma3")}
    out["deepseek-v3"] = open_model(demo_model_path())
    return out


@st.composite
def plans(draw: st.DrawFn, models: dict[str, Model]) -> Plan:
    model = models[draw(st.sampled_from(sorted(models)))]
    devices = DEVICES[draw(st.sampled_from(sorted(DEVICES)))]
    n_layer = model.summary.n_layer
    ngl = draw(st.integers(0, n_layer + 1))
    ts = draw(st.lists(st.integers(0, 5), min_size=2, max_size=2).filter(any))
    parsed = parse_server_args(["-ngl", str(ngl), "-ts", ",".join(map(str, ts)), "-c", "4096"])
    plan = plan_from_args(model, devices, parsed.args)
    names = [t.name for t in model.tensors if plan.movable(t.name)[0]]
    moved = draw(st.lists(st.sampled_from(names), max_size=40, unique=True))
    targets = [d.name for d in devices]
    return plan.with_moves({n: draw(st.sampled_from(targets)) for n in moved})


def test_round_trip_on_random_plans(models: dict[str, Model]) -> None:
    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(plans(models))
    def check(plan: Plan) -> None:
        argv = plan_command(plan)
        parsed = parse_server_args(argv)
        assert not parsed.errors, (argv, parsed.errors)
        again = plan_from_args(plan.model, plan.devices, parsed)
        assert again.placement().tensor_devices() == plan.placement().tensor_devices(), argv
        assert again.placement().unit_devices == plan.placement().unit_devices

    check()


def test_export_uses_compact_ranges(models: dict[str, Model]) -> None:
    m = models["deepseek-v3"]
    plan = plan_from_args(m, DEVICES["cuda"], parse_server_args(["-ngl", "999", "-ts", "1,1"]).args)
    exps = {t.name: "CPU" for t in m.tensors
            if t.role.is_routed_expert and t.layer is not None and t.layer >= 20}
    argv = plan_command(plan.with_moves(exps))
    ot = argv[argv.index("-ot") + 1]
    assert ot == r"blk\.([2-5][0-9]|60)\.ffn_(up|gate|down|gate_up)_exps=CPU", ot
    assert isinstance(plan.placement_options, PlacementOptions)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["-ot", "exps=CPU"], ["--cpu-moe"]),
        (["--n-cpu-moe", "30"], ["--n-cpu-moe", "30"]),
        ([r"-ot", r"blk\.(3|4)\.ffn_.*_exps=CUDA1", "-ot", "exps=CPU"],
         ["-ot", r"blk\.[3-4]\.ffn_(up|gate|down|gate_up)_exps=CUDA1", "--cpu-moe"]),
    ],
)
def test_export_prefers_the_moe_shorthands_when_they_say_the_same(
    models: dict[str, Model], args: list[str], expected: list[str]
) -> None:
    m = models["deepseek-v3"]
    plan = plan_from_args(m, DEVICES["cuda"], parse_server_args(["-ngl", "999", "-ts", "1,1", *args]))
    argv = plan_command(plan)
    i = argv.index("-ts") + 2
    assert argv[i:i + len(expected)] == expected
    again = plan_from_args(m, DEVICES["cuda"], parse_server_args(argv))
    assert again.placement().tensor_devices() == plan.placement().tensor_devices()



@pytest.mark.parametrize(("name", "server"), [
    ("qwen3moe", ["-ngl", "999"]), ("qwen3moe", ["-ngl", "999", "--cpu-moe"]),
    ("qwen3moe", ["-ngl", "5", "--n-cpu-moe", "2"]), ("qwen3moe", ["-ngl", "5", "-ot", "exps=CPU"]),
    ("gemma3", ["-ngl", "999"]), ("deepseek2", ["-ngl", "3", "-ts", "1,2"])])
def test_command_reuses_the_plans_own_placement(models: dict[str, Model], name: str, server: list[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The reproducing command does not place the model again for the rules the plan already has (its
    placement's devices are what those rules place), and says what it said placing them: the same
    command as for the plan with a move that changes nothing (whose rules it places again)."""
    from offload_planner.core import plan as plan_mod

    plan = plan_from_args(models[name], DEVICES["cuda"], parse_server_args([*server, "-c", "4096"]).args)
    real = plan_mod.placed_devices
    seen: list[tuple[object, ...]] = []

    def counting(model: Model, devices: DeviceSet, opts: PlacementOptions) -> dict[str, str]:
        seen.append(opts.overrides)
        return real(model, devices, opts)

    monkeypatch.setattr(plan_mod, "placed_devices", counting)
    argv = plan_command(plan)
    assert plan.placement_options.overrides not in seen, seen
    name0 = next(t.name for t in models[name].tensors if t.layer == 0)  # (no tied output copy)
    unmoved = plan.with_moves({name0: plan.placement().tensor_devices()[name0]})
    assert unmoved.moves and unmoved.placement().tensor_devices() == plan.placement().tensor_devices()
    assert plan_command(unmoved) == argv
