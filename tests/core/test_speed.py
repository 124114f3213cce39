"""The speed estimate honours physical facts on real header-only models (resources/ and core.synth):
bytes read per token equal the sum from the tensor list, more GPU never slows generation, a deeper
context never speeds it up, larger micro-batches speed op-offloaded prompt processing up; hardware
declarations parse and bad ones are refused naming the flag."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.compute import simulate
from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.errors import PlannerError
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import resolve_context
from offload_planner.core.model import Model
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.speed.efficiency import DEFAULT, calibrated, gpu_rows_factor
from offload_planner.core.speed.estimate import estimate, ubatch_sweep
from offload_planner.core.speed.hardware import Source, hardware_for
from offload_planner.core.speed.report import speed_json, speed_label, speed_lines
from offload_planner.core.speed.splits import split_pairs
from offload_planner.core.units import GiB

RES = Path(__file__).resolve().parents[2] / "resources"


@pytest.fixture(scope="module")
def qwen() -> Model:
    return open_model(str(RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf"))


@pytest.fixture(scope="module")
def deepseek() -> Model:
    return open_model(str(RES / "DeepSeek-V3-Q4_K_M.header.gguf"))


def devices(*decls: str, cpu: str = "CPU=512GiB,ram=8xDDR5-4800") -> DeviceSet:
    return DeviceSet(parse_device_decl(cpu), tuple(parse_device_decl(d) for d in decls))


def plan(model: Model, ds: DeviceSet, args: str) -> Plan:
    return plan_from_args(model, ds, parse_server_args(args.split()))


# --- hardware declarations -------------------------------------------------------------------------


def test_catalogue_name_sets_size_and_speeds() -> None:
    d = parse_device_decl("CUDA0=rtx3090")
    assert d.total == 24 * GiB
    g = hardware_for(DeviceSet(parse_device_decl("CPU=64GiB"), (d,)))["CUDA0"]
    assert (g.bandwidth.value, g.bandwidth.source) == (936, Source.CATALOGUE)
    assert "RTX 3090" in g.bandwidth.note
    assert g.link.value == pytest.approx(16 * 1.969, abs=0.01)  # PCIe 4.0 x16
    assert g.link.source is Source.CATALOGUE


def test_declared_keys_override_and_the_rest_default() -> None:
    d = parse_device_decl("CUDA0=24GiB,bw=936GB/s,pcie=3x8,tflops=71")
    g = hardware_for(DeviceSet(parse_device_decl("CPU=64GiB"), (d,)))["CUDA0"]
    assert (g.bandwidth.value, g.bandwidth.source) == (936, Source.DECLARED)
    assert (g.tflops.value, g.tflops.source) == (71, Source.DECLARED)
    assert g.link.value == pytest.approx(8 * 0.985, abs=0.01)
    partial = hardware_for(DeviceSet(parse_device_decl("CPU=64GiB"),
                                     (parse_device_decl("CUDA0=24GiB,bw=1TB/s"),)))
    assert partial["CUDA0"].bandwidth.value == 1000
    assert partial["CUDA0"].tflops.source is Source.DEFAULT


def test_host_ram_declaration_and_threads() -> None:
    hw = hardware_for(devices(cpu="CPU=512GiB,ram=12xDDR5-4800"), threads=16)
    assert hw["CPU"].bandwidth.value == pytest.approx(12 * 4800 * 8 / 1000)
    assert hw["CPU"].threads == 16
    bw = hardware_for(devices(cpu="CPU=512GiB,bw=200GB/s"))["CPU"].bandwidth
    assert (bw.value, bw.source) == (200, Source.DECLARED)
    rpc = hardware_for(devices("RPC0=64GiB,bw=100GB/s,link=10Gb/s"))["RPC0"]
    assert rpc.link.value == pytest.approx(1.25) and rpc.link.source is Source.DECLARED


@pytest.mark.parametrize(("decl", "named"), [
    ("CUDA0=24GiB,bw=fast", "bw"), ("CUDA0=24GiB,pcie=9x16", "PCIe"), ("CUDA0=24GiB,pcie=4x3", "PCIe"),
    ("CPU=64GiB,ram=DDR5", "RAM"), ("CUDA0=24GiB,tflops=-3", "TFLOPS"), ("CUDA0=rtx9999", "card"),
    ("Metal0=m2ultra", "memory sizes"), ("CUDA0=24GiB,speed=3", "unknown field"),
    ("RPC0=8GiB,link=fast", "rate"),
])
def test_bad_values_are_refused_naming_the_flag(decl: str, named: str) -> None:
    with pytest.raises(PlannerError) as e:
        parse_device_decl(decl)
    msg = str(e.value)
    assert msg.startswith(f"--device {decl!r}:")
    assert named.lower() in msg.lower()


# --- token generation --------------------------------------------------------------------------


def test_bytes_per_token_is_the_sum_over_the_tensor_list(qwen: Model) -> None:
    """Counted here from the file's tensors and the rule the -ot pattern states, not from the plan."""
    est = estimate(plan(qwen, devices("CUDA0=rtx3090"), "-ngl 999 -ot exps=CPU -c 4096"),
                   hardware_for(devices("CUDA0=rtx3090")))
    n_used = qwen.metadata["qwen3moe.expert_used_count"]
    n_exp = qwen.metadata["qwen3moe.expert_count"]
    want = {"CPU": 0, "CUDA0": 0}
    for t in qwen.tensors:
        if t.name.startswith("token_embd."):
            want["CPU"] += t.nbytes // t.shape[1]  # one row per token, the input layer stays on the CPU
        elif "_exps." in t.name:
            want["CPU"] += int(t.nbytes * n_used / n_exp)
        else:
            want["CUDA0"] += t.nbytes
    got = {d.name: d.bytes_per_token for d in est.devices}
    assert got["CUDA0"] == want["CUDA0"]
    assert got["CPU"] == pytest.approx(want["CPU"], abs=len(qwen.tensors))  # int() per tensor


def test_moving_expert_layers_to_a_faster_gpu_never_lowers_tg(qwen: Model) -> None:
    ds = devices("CUDA0=rtx4090")
    hw = hardware_for(ds, threads=16)
    p = plan(qwen, ds, "-ngl 999 -ot exps=CPU -c 8192")
    last = estimate(p, hw).tg_tps
    for il in range(qwen.summary.n_layer):
        names = [t.name for t in qwen.tensors if t.layer == il and t.role.is_routed_expert]
        p = p.with_moves(dict.fromkeys(names, "CUDA0"))
        tg = estimate(p, hw).tg_tps
        assert tg >= last * (1 - 1e-9), f"layer {il}: {tg} < {last}"
        last = tg
    assert last > 2 * estimate(plan(qwen, ds, "-ngl 999 -ot exps=CPU -c 8192"), hw).tg_tps


def test_depth_never_speeds_generation_up(qwen: Model, deepseek: Model) -> None:
    for m in (qwen, deepseek):
        ds = devices("CUDA0=rtx3090", "CUDA1=rtx3090")
        for args in ("-ngl 999 -ot exps=CPU -c 32768", "-ngl 10 -c 8192", "-ngl 999 -nkvo -c 16384"):
            est = estimate(plan(m, ds, args), hardware_for(ds))
            assert est.tg_tps_at_ctx < est.tg_tps, (m.arch, args)
            kv = sum(d.kv_bytes_at_ctx for d in est.devices)
            assert kv > 0


def test_kv_read_at_full_context_is_the_projected_kv_cache(qwen: Model) -> None:
    """One sequence at the full context reads the whole cache the engine projects."""
    ds = devices("CUDA0=rtx3090")
    p = plan(qwen, ds, "-ngl 999 -ot exps=CPU -c 16384 -np 1")
    est = estimate(p, hardware_for(ds))
    proj = p.projection()
    assert est.device("CUDA0").kv_bytes_at_ctx == proj.device("CUDA0").kv


def test_split_count_agrees_with_the_scheduler_simulation(deepseek: Model) -> None:
    """Device changes along the graph against the one-token graph the engine's scheduler splits."""
    ds = devices("CUDA0=24GiB")
    for args in ("-ngl 999 -ot exps=CPU -c 4096", "-ngl 999 -c 4096 -ot blk\\.(1[0-9])\\.ffn_.*_exps=CPU"):
        p = plan(deepseek, ds, args)
        pl = p.placement()
        ctx = resolve_context(p.context, deepseek.summary.n_ctx_train, deepseek.summary.n_swa)
        sim = simulate(deepseek, ds, pl, ctx, p.context)
        assert sim is not None
        tg_reserve = sim.reserves[1]
        assert abs(len(split_pairs(deepseek, pl)) + 1 - tg_reserve.n_splits) <= 2, args


# --- prompt processing ---------------------------------------------------------------------------


def test_pp_grows_with_ubatch_under_op_offload(deepseek: Model) -> None:
    ds = devices("CUDA0=rtx4090")
    hw = hardware_for(ds, threads=32)
    p = plan(deepseek, ds, "-ngl 999 -ot exps=CPU -c 32768")
    sweep = ubatch_sweep(p, hw, [32, 64, 128, 256, 512, 1024, 2048, 4096], prompt=8192)
    tps = [t for _, t in sweep]
    assert all(b >= a for a, b in itertools.pairwise(tps)), sweep
    assert tps[-1] > 4 * tps[0]
    # below the op-offload batch the experts stay on the CPU: no copies
    assert not estimate(plan(deepseek, ds, "-ngl 999 -ot exps=CPU -c 32768 -ub 16 -b 16"), hw).op_offload
    assert estimate(p, hw).op_offload


def test_pp_is_compute_bound_when_everything_is_on_the_gpu(qwen: Model) -> None:
    ds = devices("CUDA0=80GiB,bw=2000GB/s,tflops=300")
    hw = hardware_for(ds)
    p = plan(qwen, ds, "-ngl 999 -c 8192")
    est = estimate(p, hw)
    assert est.pp_bottleneck.startswith("CUDA0 compute")
    ubs = [1024, 2048, 4096]
    sweep = [t for _, t in ubatch_sweep(p, hw, ubs)]
    # compute-bound: faster only as each expert multiplies more tokens (ub x 8 / 128), by at most the
    # GPU's gain in efficiency from those rows (efficiency.gpu_rows_factor)
    gain = [gpu_rows_factor(ub * 8 / 128) for ub in ubs]
    for i in range(len(ubs) - 1):
        assert 1.0 <= sweep[i + 1] / sweep[i] <= gain[i + 1] / gain[i] + 1e-9


def test_ik_keeps_experts_on_the_cpu_below_its_moe_threshold(deepseek: Model) -> None:
    """ik: MoE ops offload only from batch x 8 >= 32 x 256, i.e. 1024 tokens."""
    ds = devices("CUDA0=rtx4090")
    hw = hardware_for(ds, threads=32)
    def ik(args: str) -> Plan:
        return plan_from_args(deepseek, ds, parse_server_args(args.split(), dialect="ik_llama.cpp"),
                              "ik_llama.cpp")

    low = ik("-ngl 999 -ot exps=CPU -c 8192 -ub 512")
    high = ik("-ngl 999 -ot exps=CPU -c 8192 -ub 1024 -b 1024")
    e_low, e_high = estimate(low, hw), estimate(high, hw)
    assert e_low.device("CPU").pp_ms > 10 * e_high.device("CPU").pp_ms
    assert e_high.pp_transfer_ms > 0


# --- output -------------------------------------------------------------------------------------------


def test_json_and_text_carry_the_estimate(qwen: Model) -> None:
    ds = devices("CUDA0=rtx3090")
    est = estimate(plan(qwen, ds, "-ngl 999 --n-cpu-moe 24 -c 32768"), hardware_for(ds), prompt=2048)
    j = speed_json(est)
    for key in ("tg_tps", "tg_tps_at_ctx", "pp_tps", "devices", "bottleneck", "assumptions"):
        assert key in j
    assert {d["name"] for d in j["devices"]} == {"CUDA0", "CPU"}
    assert all({"name", "bytes_per_token", "tg_ms_per_token"} <= set(d) for d in j["devices"])
    assert j["prompt"] == 2048
    sources = {a["source"] for a in j["assumptions"]}
    assert {"catalogue", "declared", "default"} <= sources
    text = "\n".join(speed_lines(est))
    assert re.search(r"tg \d+(\.\d)? t/s at depth 0", text)
    assert "catalogue" in text and "uncalibrated" in text
    assert re.fullmatch(r"est\. tg [\d.]+ t/s · pp [\d.]+ t/s \(CUDA0 \d+% · CPU \d+%\)", speed_label(est))


def test_calibrated_efficiencies_change_the_estimate_and_say_so(qwen: Model) -> None:
    ds = devices("CUDA0=rtx3090")
    p = plan(qwen, ds, "-ngl 999 -ot exps=CPU -c 8192")
    base = estimate(p, hardware_for(ds))
    cal = estimate(p, hardware_for(ds), eff=calibrated({"cpu_bandwidth": 0.3}, "bench on this machine"))
    assert cal.calibrated and not base.calibrated
    assert cal.tg_tps < base.tg_tps
    with pytest.raises(ValueError, match="unknown efficiencies"):
        calibrated({"warp_speed": 2.0}, "x")


def test_calibration_recovers_the_efficiency_a_measurement_implies(qwen: Model) -> None:
    """A 'measurement' made with known efficiencies is explained by those efficiencies again."""
    from offload_planner.core.speed.calibrate import calibrate
    from offload_planner.core.speed.efficiency import DEFAULT

    ds = devices("CUDA0=rtx3090")
    hw = hardware_for(ds)
    p = plan(qwen, ds, "-ngl 999 -ot exps=CPU -c 8192 -ub 16 -b 16")  # no op offload: CPU computes
    truth = calibrated({"cpu_bandwidth": 0.4, "cpu_compute": 0.2}, "truth")
    measured = estimate(p, hw, eff=truth)
    est = estimate(p, hw, eff=DEFAULT)
    fitted = calibrate(est, hw, DEFAULT, tg_tps=measured.tg_tps, pp_tps=measured.pp_tps).values
    assert fitted["cpu_bandwidth"] == pytest.approx(0.4, rel=1e-3)
    assert fitted["cpu_compute"] == pytest.approx(0.2, rel=1e-3)
    again = estimate(p, hw, eff=calibrated(fitted, "fitted"))
    assert again.tg_tps == pytest.approx(measured.tg_tps, rel=1e-3) and again.calibrated
    # a measurement faster than the other terms allow is not explained by this one
    assert "gpu_bandwidth" not in calibrate(est, hw, DEFAULT, tg_tps=1e6).values
    # with -t limiting the CPU, the per-thread bandwidth is what the measurement sets
    hw16 = hardware_for(ds, threads=4)
    slow = estimate(p, hw16, eff=calibrated({"cpu_thread_bandwidth": 5.0}, "truth"))
    got = calibrate(estimate(p, hw16, eff=DEFAULT), hw16, DEFAULT, tg_tps=slow.tg_tps).values
    assert got == {"cpu_thread_bandwidth": pytest.approx(5.0, rel=1e-3)}


def test_plan_files_keep_declared_speed_figures(tmp_path: Path, qwen: Model) -> None:
    import json

    from offload_planner.core.plan_file import PlanFile, PlanFileError, load_plan, plan_json, save_plan

    ds = devices("CUDA0=rtx3090,pcie=4x8", cpu="CPU=64GiB,ram=2xDDR5-5600")
    p = plan(qwen, ds, "-ngl 999 -ot exps=CPU -c 4096")
    target = tmp_path / "speed.plan.json"
    save_plan(target, PlanFile.of(p))
    again, _ = load_plan(target).to_plan(qwen)
    assert again.devices == ds
    assert estimate(again, hardware_for(again.devices)).tg_tps == estimate(p, hardware_for(ds)).tg_tps
    data = plan_json(PlanFile.of(p))
    data["devices"]["gpus"][0]["hardware"] = [["pcie", "9x16"]]
    target.write_text(json.dumps(data))
    with pytest.raises(PlanFileError, match=r"\$\.devices\.gpus\[0\]\.hardware: .*PCIe"):
        load_plan(target)


def test_every_small_model_gets_a_finite_estimate(small_models: dict[str, Path]) -> None:
    """Every architecture the project writes: finite speeds, depth never helps, more GPU never hurts."""
    import math

    for name, path in small_models.items():
        m = open_model(path)
        cpu_only = devices(cpu="CPU=64GiB,bw=50GB/s")
        gpu = devices("CUDA0=rtx3090", cpu="CPU=64GiB,bw=50GB/s")
        e_cpu = estimate(plan(m, cpu_only, "-c 2048"), hardware_for(cpu_only))
        e_gpu = estimate(plan(m, gpu, "-ngl 999 -c 2048"), hardware_for(gpu))
        for e in (e_cpu, e_gpu):
            assert all(math.isfinite(x) and x > 0 for x in (e.tg_tps, e.tg_tps_at_ctx, e.pp_tps)), name
            assert e.tg_tps_at_ctx <= e.tg_tps, name
        assert e_gpu.device("CUDA0").bytes_per_token > 0, name


def test_rpc_server_threads_limit_its_bandwidth(qwen: Model) -> None:
    """An rpc-server computing on its CPU reads memory with its -t threads (ggml-rpc-server's default
    is half the remote's cores): ``threads=`` caps the RPC device's bandwidth at threads x the
    per-thread share (10 GB/s by default) instead of the device's bw= x the GPU efficiency (0.75)."""
    from offload_planner.core.cmdline import parse_server_args
    from offload_planner.core.devices import build_device_set
    from offload_planner.core.plan import plan_from_args

    def rpc_ms(decl: str) -> float:
        ds = build_device_set(cpu=parse_device_decl("CPU=64GiB"), detected=[], rpc_endpoints=["127.0.0.1:1"],
                              declared=[parse_device_decl(decl)])
        plan = plan_from_args(qwen, ds, parse_server_args(["-c", "4096", "-ngl", "999"]))
        return estimate(plan, hardware_for(ds)).device("RPC0").tg_ms_per_token

    free, one = rpc_ms("RPC0=32GiB,bw=20GB/s"), rpc_ms("RPC0=32GiB,bw=20GB/s,threads=1")
    assert one / free == pytest.approx(20 * 0.75 / 10, rel=1e-6)


def test_op_offload_from_mmapped_weights_copies_at_the_pageable_rate(qwen: Model) -> None:
    """With mmap (the default) the experts -ot keeps on the CPU stay in the mapping (pageable:
    ``CPU_Mapped``), so op offload's copies run at ``pageable_copy`` of the pinned rate; with
    --load-mode none they are a pinned ``CUDA_Host`` buffer.  Token generation copies nothing."""
    ds = devices("CUDA0=rtx3090")
    hw = hardware_for(ds)
    args = "-ngl 999 -ot exps=CPU -c 8192 -ub 2048 -b 2048"
    mapped, pinned = plan(qwen, ds, args), plan(qwen, ds, args + " --load-mode none")
    assert {p.buft for p in mapped.placement().items if p.device == "CPU"} == {"CPU_Mapped"}
    assert {p.buft for p in pinned.placement().items if p.device == "CPU"} == {"CUDA_Host"}
    a, b = estimate(mapped, hw), estimate(pinned, hw)
    assert a.pp_transfer_ms == pytest.approx(b.pp_transfer_ms / DEFAULT.pageable_copy.value)
    assert a.pp_tps < b.pp_tps and a.tg_tps == pytest.approx(b.tg_tps)
    assert any("pageable" in x.what for x in a.assumptions)
    assert not any("pageable" in x.what for x in b.assumptions)


def test_a_gpu_layer_costs_its_fixed_time_a_token(qwen: Model) -> None:
    """Each layer with weights on a GPU adds ``gpu_layer_us`` to that GPU's time a token, beyond its
    bytes (its kernels' floors); the CPU's layers do not; and the estimate names the figure."""
    ds = devices("CUDA0=rtx3090")
    hw = hardware_for(ds)
    p = plan(qwen, ds, "-ngl 999 -c 8192 -ot blk\\.(4[0-7])\\.ffn_.*_exps=CPU")
    with_floor = estimate(p, hw)
    without = estimate(p, hw, eff=calibrated({"gpu_layer_us": 0.0}, "none"))
    n = qwen.summary.n_layer
    gpu_extra = with_floor.device("CUDA0").tg_ms_per_token - without.device("CUDA0").tg_ms_per_token
    assert gpu_extra == pytest.approx(n * DEFAULT.gpu_layer_us.value / 1e3)
    assert with_floor.device("CPU").tg_ms_per_token == pytest.approx(without.device("CPU").tg_ms_per_token)
    assert any("GPU layer" in a.what for a in with_floor.assumptions)
