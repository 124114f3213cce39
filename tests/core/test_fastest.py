"""The fastest plan that fits: on real header-only models it fits every GPU with its margin (checked
on a fresh projection of the chosen plan), keeps the user's -ot rules, moves and -c, and is never
slower in estimate than the baselines that fit (--cpu-moe, the best --n-cpu-moe, llama.cpp's --fit)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.speed.candidate import DEFAULT_MARGIN
from offload_planner.core.speed.fastest import fastest_plan
from offload_planner.core.speed.hardware import hardware_for
from offload_planner.core.speed.ranking import score
from offload_planner.core.units import GiB

RES = Path(__file__).resolve().parents[2] / "resources"


@pytest.fixture(scope="module")
def qwen() -> Model:
    return open_model(str(RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf"))


def _devices(*gpus: str, ram: str = "256GiB") -> DeviceSet:
    return DeviceSet(parse_device_decl(f"CPU={ram},ram=4xDDR5-5600"),
                     tuple(parse_device_decl(f"CUDA{i}={g}") for i, g in enumerate(gpus)))


def _assert_fits(plan, devices: DeviceSet) -> None:  # type: ignore[no-untyped-def]
    proj = plan.projection()  # fresh, not the search's own
    for g in devices.gpus:
        margin = g.margin or DEFAULT_MARGIN
        assert proj.device(g.name).resident() + margin <= (g.capacity or 0), g.name


@pytest.mark.parametrize("goal", ["tg", "pp", "balanced"])
def test_fastest_fits_and_beats_every_fitting_baseline(qwen: Model, goal: str) -> None:
    ds = _devices("12GiB,bw=936GB/s,pcie=4x16,tflops=142")
    r = fastest_plan(qwen, ds, ["-c", "16384"], hardware_for(ds, threads=16), goal=goal, prompt=4096)
    assert r.best is not None
    _assert_fits(r.best.plan, ds)
    for c in r.candidates:
        if c.fits:
            assert score(r.best.estimate, goal) >= score(c.estimate, goal), c.label
    cpu_moe = next(c for c in r.candidates if c.label == "--cpu-moe")
    assert r.best.estimate.tg_tps > cpu_moe.estimate.tg_tps  # 12 GiB holds many expert layers
    assert r.best.plan.context.n_ctx == 16384
    if goal == "tg":
        assert r.best.plan.context.n_ubatch == 512  # no reason to grow the compute buffer


def test_user_rules_and_moves_are_kept(qwen: Model) -> None:
    ds = _devices("rtx4090")
    pinned = [t.name for t in qwen.tensors if t.layer == 5 and t.role.is_routed_expert]
    moved = [t.name for t in qwen.tensors if t.layer == 7 and t.role.is_routed_expert]
    r = fastest_plan(qwen, ds, ["-c", "8192", "-ot", r"blk\.5\.ffn_.*_exps=CPU"], hardware_for(ds),
                     goal="tg", moves=dict.fromkeys(moved, "CPU"))
    assert r.best is not None and r.best.label.startswith("fastest")
    devs = r.best.plan.placement().tensor_devices()
    assert {devs[n] for n in pinned} == {"CPU"}
    assert {devs[n] for n in moved} == {"CPU"}
    others = [t.name for t in qwen.tensors if t.layer == 6 and t.role.is_routed_expert]
    assert {devs[n] for n in others} == {"CUDA0"}  # a 24 GiB card takes the rest of this 17 GiB model


def test_margin_is_respected(qwen: Model) -> None:
    ds = DeviceSet(parse_device_decl("CPU=256GiB"), (parse_device_decl("CUDA0=16GiB,margin=5GiB"),))
    r = fastest_plan(qwen, ds, ["-c", "8192"], hardware_for(ds), goal="tg")
    assert r.best is not None
    assert r.best.plan.projection().device("CUDA0").resident() <= 11 * GiB


def test_spreads_over_two_gpus_and_each_fits() -> None:
    m = open_model(str(RES / "DeepSeek-V3-Q4_K_M.header.gguf"))
    ds = _devices("rtx3090", "rtx3090", ram="512GiB")  # the ~336 GiB of experts two cards leave
    r = fastest_plan(m, ds, ["-c", "8192"], hardware_for(ds, threads=32), goal="tg")
    assert r.best is not None
    _assert_fits(r.best.plan, ds)
    devs = r.best.plan.placement().tensor_devices()
    on = {d for n, d in devs.items() if "_exps" in n}
    assert {"CUDA0", "CUDA1", "CPU"} <= on


def test_nothing_fits_is_said(qwen: Model) -> None:
    ds = DeviceSet(parse_device_decl("CPU=256GiB"), (parse_device_decl("CUDA0=1GiB"),))
    r = fastest_plan(qwen, ds, ["-c", "8192"], hardware_for(ds), goal="tg")
    assert r.best is None
    assert r.notes and "does not fit" in r.notes[0]


def test_unknown_goal_is_refused(qwen: Model) -> None:
    ds = _devices("rtx3090")
    with pytest.raises(ValueError, match="--goal"):
        fastest_plan(qwen, ds, [], hardware_for(ds), goal="fast")


def test_from_an_open_plan_keeps_its_moves_and_fits(qwen: Model) -> None:
    from offload_planner.core.cmdline import parse_server_args
    from offload_planner.core.plan import plan_from_args
    from offload_planner.core.speed.estimate import estimate
    from offload_planner.core.speed.fastest import fastest_from_plan

    ds = _devices("12GiB,bw=936GB/s")
    hw = hardware_for(ds)
    base = plan_from_args(qwen, ds, parse_server_args(["-c", "8192", "-ot", r"blk\.1\.ffn_.*_exps=CPU",
                                                       "--cpu-moe"]))
    pinned = [t.name for t in qwen.tensors if t.layer == 1 and t.role.is_routed_expert]
    kept = {t.name: "CPU" for t in qwen.tensors if t.layer == 3 and t.role.is_routed_expert}
    plan = base.with_moves(kept)
    r = fastest_from_plan(plan, hw, goal="balanced")
    assert r.best is not None
    _assert_fits(r.best.plan, ds)
    devs = r.best.plan.placement().tensor_devices()
    assert {devs[n] for n in kept} == {"CPU"}
    assert {devs[n] for n in pinned} == {"CPU"}
    assert r.best.estimate.tg_tps > 1.5 * estimate(plan, hw).tg_tps


def test_chosen_plan_is_verified_and_best_n_cpu_moe_is_the_smallest_that_fits(qwen: Model) -> None:
    """Candidates are ranked on predicted compute buffers; the answer is projected in full, and the
    --n-cpu-moe baseline's N (projected in full only where it could beat the answer) fits by a
    fresh projection while N-1 does not."""
    from offload_planner.core.cmdline import parse_server_args
    from offload_planner.core.plan import plan_from_args

    ds = _devices("12GiB,bw=936GB/s,pcie=4x16,tflops=142")
    r = fastest_plan(qwen, ds, ["-c", "16384"], hardware_for(ds, threads=16), goal="balanced")
    assert r.best is not None and r.best.verified
    assert 2 * r.projections < r.evaluations  # most candidates are never simulated
    fresh = r.best.plan.projection()
    assert [d.resident() for d in fresh.devices] == [d.resident() for d in r.best.projection.devices]
    [ncm] = [c for c in r.candidates if c.label.startswith("--n-cpu-moe")]
    n = int(ncm.label.split()[-1])

    def fits(k: int) -> bool:
        p = plan_from_args(qwen, ds, parse_server_args(["-c", "16384", "--n-cpu-moe", str(k)]))
        return p.projection().device("CUDA0").resident() + DEFAULT_MARGIN <= 12 * GiB

    assert fits(n) and not fits(n - 1)


def test_optimistic_predictions_are_caught_by_the_full_projection(qwen: Model) -> None:
    """Compute buffers predicted far too small make every fill look like it fits: the full
    projection of the choice says otherwise and the search fills again with the real buffers."""
    from offload_planner.core.buffer import Buffer
    from offload_planner.core.cmdline import parse_server_args
    from offload_planner.core.speed.efficiency import defaults_for
    from offload_planner.core.speed.fastest import _Search
    from offload_planner.core.speed.variants import variant

    ds = _devices("12GiB,bw=936GB/s,pcie=4x16,tflops=142")
    s = _Search(qwen, ds, ["-c", "16384"], "llama.cpp", parse_server_args, hardware_for(ds), defaults_for(
        "llama.cpp"), 4096, {})
    start = s.full("start", s.plan(["--cpu-moe"]))
    real = dict(s._compute)
    s._compute = {512: [Buffer("CUDA0", "CUDA0", "compute", 1, "too small")]}
    s._seen.clear()
    s.starts = {variant(start.plan): s.cheap("start", start.plan)}
    ours = s.fill(s.starts[variant(start.plan)])
    assert all(c.fits and not c.verified for c in ours)
    best = s.choose(ours, [], "tg")
    assert best is not None and best.verified and best.fits
    # simulated buffers (of the plan verified last) replaced the bogus ones
    assert {b.device for b in s._compute[512]} == {b.device for b in real[512]}
    assert min(b.bytes for b in s._compute[512]) > 1 << 20
    _assert_fits(best.plan, ds)
    assert any(c.verified and not c.fits for c in ours)  # the first choice was over after all


# --- KV cache types: only where the user allows it --------------------------------------------------

Q8_0_PER_F16 = 34 / 64  # q8_0: 32 values in 34 bytes (2-byte scale + 32 int8); f16: 2 bytes a value


def _kv_bytes(plan, device: str) -> int:  # type: ignore[no-untyped-def]
    return sum(b.bytes for b in plan.projection().device(device).buffers if b.kind == "kv")


def test_kv_types_are_kept_unless_allowed_then_q8_0_where_it_is_faster(qwen: Model) -> None:
    from offload_planner.core.plan import plan_command

    ds = _devices("12GiB,bw=936GB/s,pcie=4x16,tflops=142")
    args = ["-c", "40960", "-np", "1"]
    kept = fastest_plan(qwen, ds, args, hardware_for(ds, threads=16), goal="tg")
    assert {(c.plan.context.type_k, c.plan.context.type_v) for c in kept.candidates} == {("f16", "f16")}
    r = fastest_plan(qwen, ds, args, hardware_for(ds, threads=16), goal="tg", allow_kv_quant=True)
    assert r.best is not None and kept.best is not None
    ctx = r.best.plan.context
    assert (ctx.type_k, ctx.type_v, ctx.flash_attn) == ("q8_0", "q8_0", True)
    cmd = plan_command(r.best.plan)
    assert cmd[cmd.index("-ctk") + 1] == "q8_0" and cmd[cmd.index("-ctv") + 1] == "q8_0"
    _assert_fits(r.best.plan, ds)
    # the halved cache leaves room for more experts on the GPU: faster generation
    assert r.best.estimate.tg_tps > kept.best.estimate.tg_tps
    f16 = replace(r.best.plan, context=replace(ctx, type_k="f16", type_v="f16"))
    assert abs(_kv_bytes(r.best.plan, "CUDA0") / _kv_bytes(f16, "CUDA0") - Q8_0_PER_F16) < 1e-3


def test_without_flash_attention_only_k_is_quantized(qwen: Model) -> None:
    ds = _devices("12GiB,bw=936GB/s,pcie=4x16,tflops=142")
    r = fastest_plan(qwen, ds, ["-c", "40960", "-np", "1", "-fa", "off"], hardware_for(ds, threads=16),
                     goal="tg", allow_kv_quant=True)
    types = {(c.plan.context.type_k, c.plan.context.type_v, c.plan.context.flash_attn) for c in r.candidates}
    assert ("q8_0", "f16", False) in types  # quantized K needs no flash attention
    assert all(v == "f16" and not fa for _, v, fa in types)  # a quantized V cache would need it


def test_kv_choices_follow_llama_cpp_rules(qwen: Model) -> None:
    """MLA models take one type for K and V (so nothing without flash attention); a type the user
    gave is kept."""
    from offload_planner.core.cmdline import parse_server_args
    from offload_planner.core.plan import plan_from_args
    from offload_planner.core.speed.variants import kv_choices

    ds = _devices("rtx3090")
    ds3 = open_model(str(RES / "DeepSeek-V3-Q4_K_M.header.gguf"))

    def choices(model: Model, *args: str) -> list[tuple[str, str]]:
        return kv_choices(plan_from_args(model, ds, parse_server_args(["-c", "8192", *args])), True)

    assert choices(ds3) == [("f16", "f16"), ("q8_0", "q8_0")]
    assert choices(ds3, "-fa", "off") == [("f16", "f16")]
    assert choices(qwen, "-ctk", "q4_0") == [("q4_0", "f16")]
    assert choices(qwen, "-fa", "off") == [("f16", "f16"), ("q8_0", "f16")]
    assert kv_choices(plan_from_args(qwen, ds, parse_server_args(["-c", "8192"])), False) == [("f16", "f16")]


def test_compute_buffers_between_two_ubatches_are_predicted_by_a_straight_line() -> None:
    """The search projects the starts at the command's -ub and the largest in full and predicts the
    -ub between them per buffer on the straight line through the two: on DeepSeek-V3 with four GPUs
    the prediction at -ub 2048 is within 2% (and 64 MiB) of the simulated buffers."""
    from offload_planner.core.buffer import Buffer
    from offload_planner.core.cmdline import parse_server_args
    from offload_planner.core.plan import plan_from_args
    from offload_planner.core.speed.evaluator import interpolate

    m = open_model(str(RES / "DeepSeek-V3-Q4_K_M.header.gguf"))
    ds = _devices("rtx3090", "rtx3090", "rtx3090", "rtx3090")

    def compute(ub: int) -> list[Buffer]:
        args = ["-c", "32768", "--cpu-moe", "-ub", str(ub), "-b", "4096"]
        p = plan_from_args(m, ds, parse_server_args(args))
        return [b for d in p.projection().devices for b in d.buffers if b.kind == "compute"]

    known = {512: compute(512), 4096: compute(4096)}
    real = {(b.device, b.name): b.bytes for b in compute(2048)}
    got = {(b.device, b.name): b.bytes for b in interpolate(known, 2048)}
    assert got.keys() == real.keys()
    for k, v in real.items():
        assert abs(got[k] - v) <= max(0.02 * v, 64 * 1024**2), (k, got[k], v)


def test_a_ubatch_between_the_starts_is_predicted_from_both(qwen: Model) -> None:
    """The starts at the command's and the largest -ub are projected in full before anything is
    predicted, so the -ub between them is interpolated from both (it had been predicted from the
    command's -ub alone: on two 8 GiB GPUs its fills looked like they fit and were over on their full
    projection, 5 full projections in all)."""
    ds = _devices("8GiB,bw=936GB/s", "8GiB,bw=936GB/s")
    r = fastest_plan(qwen, ds, ["-c", "16384"], hardware_for(ds, threads=16), goal="balanced")
    assert r.best is not None and r.best.verified
    _assert_fits(r.best.plan, ds)
    over = [c for c in r.candidates if c.verified and not c.fits]
    assert all(c.plan.context.n_ubatch in (512, 4096) for c in over), [c.label for c in over]
    assert r.projections <= 4


def _big_devices(*gpus: str) -> DeviceSet:
    """The bench's host for the big models (their experts need more RAM than _devices' 256 GiB)."""
    return DeviceSet(parse_device_decl("CPU=768GiB,ram=8xDDR5-4800"),
                     tuple(parse_device_decl(f"CUDA{i}={g}") for i, g in enumerate(gpus)))


def _outcome(r) -> list[object]:  # type: ignore[no-untyped-def]
    from offload_planner.core.plan import plan_command

    return [r.best.label, plan_command(r.best.plan), r.projections, r.evaluations, r.notes,
            [(c.label, c.fits, c.verified, c.over, c.estimate.tg_tps, c.estimate.pp_tps,
              [d.resident() for d in c.projection.devices]) for c in r.candidates]]


@pytest.mark.parametrize(("name", "gpus"), [
    ("DeepSeek-V3-Q4_K_M", ("rtx3090",) * 4),  # the case for the command's time
    ("Qwen3-235B-A22B-Q4_K_M", ("rtx4090", "rtx3060")),
    ("gpt-oss-120b-MXFP4", ("rtx3090",)),
])
def test_on_big_models_the_answer_fits_and_no_baseline_is_faster(tmp_path: Path, name: str,
                                                                 gpus: tuple[str, ...]) -> None:
    """The fit command's search on the big header-only models the project writes (as
    bench/fit_vs_baselines.py runs it, llama.cpp's --fit in a forked child beside the search where
    it can): the answer fits every GPU with its margin by a fresh projection, no baseline that fits
    scores higher, and each of --cpu-moe, the best --n-cpu-moe and --fit is there."""
    from offload_planner.core.speed.forked import fork_useful
    from offload_planner.core.synth import BIG_MODELS, write_model

    [path] = write_model(BIG_MODELS[name], tmp_path / f"{name}.gguf", header_only=True)
    m = open_model(str(path))
    ds = _big_devices(*gpus)
    r = fastest_plan(m, ds, ["-c", "32768", "-t", "32"], hardware_for(ds, threads=32), concurrent=True)
    assert r.fit_forked == fork_useful()
    assert r.best is not None and r.best.verified
    _assert_fits(r.best.plan, ds)
    labels = [c.label for c in r.candidates]
    assert "--cpu-moe" in labels and "llama.cpp --fit" in labels
    assert any(x.startswith("--n-cpu-moe") for x in labels)
    for c in r.candidates:
        if c.fits:
            assert score(r.best.estimate, "balanced") >= score(c.estimate, "balanced"), c.label
    cpu_moe = next(c for c in r.candidates if c.label == "--cpu-moe")
    assert r.best.estimate.tg_tps > cpu_moe.estimate.tg_tps


@pytest.mark.parametrize(("name", "gpus", "args"), [
    ("DeepSeek-V3-Q4_K_M", ("rtx3090",) * 4, ["-c", "32768", "-t", "32"]),
    # MTP: the --fit row is projected in full after the child's result, with a note
    ("GLM-4.5-Air-Q4_K_M", ("24GiB,bw=936GB/s",), ["-c", "32768", "--spec-type", "draft-mtp"]),
])
def test_the_fit_baseline_beside_the_search_changes_nothing(tmp_path: Path, name: str, gpus: tuple[str, ...],
                                                            args: list[str]) -> None:
    """llama.cpp's --fit run in a forked child (the fit command's way) or in the process before the
    search: the same candidates, memory, estimates, notes, answer and command."""
    from offload_planner.core.speed.forked import fork_useful
    from offload_planner.core.synth import BIG_MODELS, write_model

    if not fork_useful():
        pytest.skip("no fork here: both ways run in the process")
    [path] = write_model(BIG_MODELS[name], tmp_path / f"{name}.gguf", header_only=True)
    ds = _big_devices(*gpus)
    hw = hardware_for(ds, threads=32)
    beside = fastest_plan(open_model(str(path)), ds, args, hw, goal="tg", concurrent=True)
    before = fastest_plan(open_model(str(path)), ds, args, hw, goal="tg", concurrent=False)
    assert beside.fit_forked and not before.fit_forked
    assert _outcome(beside) == _outcome(before)
    assert beside.fit_seconds > 0 and before.fit_seconds > 0
    if "--spec-type" in args:
        assert any(n.startswith("llama.cpp's own --fit leaves CUDA0") for n in beside.notes)
