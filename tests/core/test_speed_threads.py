"""More compute threads than physical cores: llama-server's ``-t`` and the threads of the
rpc-servers on the same machine.  The devices take turns (one split after another), so each device's
own threads are weighed against the cores: when they outnumber them the estimate gives each thread
``cores / threads`` of a core on that device and warns; expected figures are computed here from the
GGUF's bytes and the declared bandwidth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offload_planner.backend.speed_store import is_local, physical_cores, thread_use
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet, build_device_set, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.speed.efficiency import DEFAULT
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import Figure, Source, Threads, hardware_for

GiB = 1024**3


def _cpu() -> Device:
    return Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB, hardware=(("bw", "100"),))


def test_physical_cores_as_llama_cpp_counts_them(tmp_path: Path) -> None:
    for i, sib in enumerate(["00000011", "00000011", "0000000c", "0000000c", "00000030"]):  # 2 SMT pairs + 1
        d = tmp_path / f"cpu{i}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings").write_text(sib + "\n")
    assert physical_cores(tmp_path) == 3
    assert physical_cores() >= 1  # this machine's


def test_a_local_server_is_told_by_the_host_llama_server_connects_to() -> None:
    """ggml-rpc takes the host before the *first* ':' (``127.0.0.1:50052:7`` is port 50052 of 127.0.0.1)."""
    assert is_local("127.0.0.1:50052:7") and is_local("localhost:50052x") and not is_local("10.0.0.5:1:2")


def test_thread_use_counts_local_rpc_servers_only() -> None:
    assert is_local("127.0.0.1:50052") and is_local("localhost:1") and not is_local("10.0.0.5:50052")
    three = (("threads", "3"),)
    gpus = (Device("RPC0", DeviceKind.RPC, 16 * GiB, endpoint="127.0.0.1:50052", hardware=three),
            Device("RPC1", DeviceKind.RPC, 16 * GiB, endpoint="10.0.0.5:50052"))
    t = thread_use(DeviceSet(_cpu(), gpus), 2, cores=4)
    assert t is not None
    assert dict(t.rpc) == {"127.0.0.1:50052": 3} and t.local == ("CPU", "RPC0")
    # 2 + 3 threads on 4 cores, but the CPU's 2 and the rpc-server's 3 compute in turn: neither crowds
    assert (t.total, t.oversubscribed, t.share) == (5, False, 1.0)
    assert (t.threads_of("CPU"), t.threads_of("RPC0"), t.threads_of("RPC1")) == (2, 3, 0)
    crowded = thread_use(DeviceSet(_cpu(), gpus), 2, cores=2)
    assert crowded is not None and crowded.crowded == ("RPC0",)
    assert crowded.share_of("RPC0") == pytest.approx(2 / 3) and crowded.share_of("CPU") == 1.0
    default = thread_use(DeviceSet(_cpu(), ()), None, cores=4)  # llama-server's default -t: the cores
    assert default is not None
    assert (default.total, default.oversubscribed, default.server_given) == (4, False, False)


def test_oversubscribed_cpu_is_slower_by_the_share(small_models: dict[str, Path]) -> None:
    model = open_model(small_models["llama"])
    devices = DeviceSet(_cpu(), ())
    plan = plan_from_args(model, devices, parse_server_args(["-c", "1024", "-t", "3"]))
    # 3 threads cap the bandwidth at 3 x 10 GB/s (< 100 x 0.65); on 2 cores each gets 2/3 of one
    per_token = sum(t.nbytes for t in model.tensors if t.name != "token_embd.weight")
    embd = model.tensor("token_embd.weight")
    per_token += embd.nbytes // embd.shape[1]
    capped = 3 * DEFAULT.cpu_thread_bandwidth.value * 1e9
    def on(cores: int) -> Threads:
        return Threads(cores, 3, True, {}, ("CPU",))

    fits = estimate(plan, hardware_for(devices, threads=3, cores=on(4)), eff=DEFAULT)
    over = estimate(plan, hardware_for(devices, threads=3, cores=on(2)), eff=DEFAULT)
    assert fits.tg_tps == pytest.approx(capped / per_token, rel=1e-9) and not fits.warnings
    assert over.tg_tps == pytest.approx(capped * 2 / 3 / per_token, rel=1e-9)
    assert over.pp_tps < fits.pp_tps
    assert len(over.warnings) == 1
    assert "3 compute threads" in over.warnings[0] and "2 physical cores" in over.warnings[0]
    assert "consider -t 2" in over.warnings[0]
    assert any("oversubscribed" in a.what for a in over.assumptions)


def test_plan_warns_when_t_exceeds_the_cores(small_models: dict[str, Path],
                                             capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from offload_planner.backend import speed_store
    from offload_planner.cli import main

    # this machine's CPU (no bw= declared) without running or caching the RAM probe in the session's
    # config folder (a probe measured while the machine is busy would skew later tests)
    monkeypatch.setenv("OFFLOAD_PLANNER_CONFIG_DIR", str(tmp_path))
    monkeypatch.setattr(speed_store, "host_bandwidth",
                        lambda *, measure=True: Figure(40.0, "GB/s", Source.MEASURED, "pinned by the test"))

    here = ["plan", str(small_models["llama"]), "--no-detect", "--device", "CPU=64GiB"]  # this machine
    assert main([*here, "--json", "--", "-c", "1024", "-t", "4096"]) == 0
    speed = json.loads(capsys.readouterr().out)["speed"]
    cores = physical_cores()
    assert f"4096 compute threads (4096 llama-server (-t)) on {cores} physical core" in speed["warnings"][0]
    assert main([*here, "--", "-c", "1024", "-t", "1"]) == 0
    assert "warning:" not in capsys.readouterr().out
    # a CPU declared by its bandwidth is another machine: its cores are not this one's
    other = ["plan", str(small_models["llama"]), "--no-detect", "--device", "CPU=64GiB,bw=100GB/s"]
    assert main([*other, "--json", "--", "-c", "1024", "-t", "4096"]) == 0
    assert "warnings" not in json.loads(capsys.readouterr().out)["speed"]
    cores16 = ["plan", str(small_models["llama"]), "--no-detect", "--device", "CPU=64GiB,bw=100GB/s,cores=16"]
    assert main([*cores16, "--json", "--", "-c", "1024", "-t", "32"]) == 0
    assert "32 compute threads (32 llama-server (-t)) on 16 physical cores" in json.loads(
        capsys.readouterr().out)["speed"]["warnings"][0]


def _local_rpc_plan(small_models: dict[str, Path], t: int, rpc_threads: int):  # type: ignore[no-untyped-def]
    devices = build_device_set(cpu=parse_device_decl("CPU=64GiB,bw=100GB/s"), detected=[],
                               rpc_endpoints=["127.0.0.1:50052"],
                               declared=[parse_device_decl(f"RPC0=16GiB,bw=50GB/s,tflops=1,threads={rpc_threads}")])
    model = open_model(small_models["llama"])
    return plan_from_args(model, devices, parse_server_args(["-c", "1024", "-t", str(t), "-ngl", "999"]))


def _at(plan, t: int, cores: int):  # type: ignore[no-untyped-def]
    return hardware_for(plan.devices, threads=t, cores=thread_use(plan.devices, t, cores=cores))


def test_devices_taking_turns_do_not_share_the_cores(small_models: dict[str, Path]) -> None:
    """llama-server -t 2 beside a local rpc-server of 1 thread on 2 cores: 3 threads, but the CPU's and
    the rpc-server's compute one after the other, so the estimate is the one on plenty of cores (on
    this 2-core machine -t 1 and -t 2 measured the same, where the old rule gave -t 2 0.67 of a core)."""
    plan = _local_rpc_plan(small_models, 2, 1)
    two, plenty = _at(plan, 2, 2), _at(plan, 2, 64)
    assert two.threads is not None and two.threads.total == 3
    assert two.devices == plenty.devices
    est, ref = estimate(plan, two, eff=DEFAULT), estimate(plan, plenty, eff=DEFAULT)
    assert (est.tg_tps, est.pp_tps) == (ref.tg_tps, ref.pp_tps)
    assert not est.warnings


def test_a_device_s_own_threads_beyond_the_cores_still_crowd(small_models: dict[str, Path]) -> None:
    """llama-server's -t above the cores slows the CPU only; an rpc-server's -t above them its device only."""
    server = _local_rpc_plan(small_models, 3, 1)
    hw, plenty = _at(server, 3, 2), _at(server, 3, 64)
    assert hw["RPC0"] == plenty["RPC0"] and hw["CPU"].share < plenty["CPU"].share == 1.0
    warned = estimate(server, hw, eff=DEFAULT).warnings
    assert len(warned) == 1 and "3 llama-server threads (-t) on 2 physical cores" in warned[0]
    assert "consider -t 2" in warned[0] and "RPC0" not in warned[0]

    rpc = _local_rpc_plan(small_models, 1, 3)
    hw, plenty = _at(rpc, 1, 2), _at(rpc, 1, 64)
    assert hw["CPU"] == plenty["CPU"] and hw["RPC0"].share < plenty["RPC0"].share == 1.0
    est, ref = estimate(rpc, hw, eff=DEFAULT), estimate(rpc, plenty, eff=DEFAULT)
    assert est.tg_tps < ref.tg_tps
    assert len(est.warnings) == 1 and "3 threads of rpc-server 127.0.0.1:50052" in est.warnings[0]
    assert "rpc-server -t 2" in est.warnings[0]
