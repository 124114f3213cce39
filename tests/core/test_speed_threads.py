"""More compute threads than physical cores: llama-server's ``-t`` plus the threads of the
rpc-servers on the same machine.  The estimate gives each thread ``cores / threads`` of a core on the
devices computing here (the CPU, loopback RPC devices) and warns; expected figures are computed here
from the GGUF's bytes and the declared bandwidth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offload_planner.backend.speed_store import is_local, physical_cores, thread_use
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
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
    assert (t.total, t.oversubscribed, t.share) == (5, True, 0.8)
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
