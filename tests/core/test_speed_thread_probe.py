"""One compute thread's share of the RAM bandwidth, measured: the RAM probe's single-thread pass
(cached per machine beside the multi-thread figure) times the probe's efficiency replaces the default
10 GB/s a thread for the CPU and the rpc-servers on this machine, unless calibrated; a CPU declared as
another machine keeps the default.  Expected figures are worked out here from the GGUF's bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offload_planner.backend import speed_store
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.speed.calibrate import calibrate
from offload_planner.core.speed.efficiency import DEFAULT, calibrated
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import Figure, Source, hardware_for
from offload_planner.core.speed.rates import thread_bandwidth

GiB = 1024**3
ONE = Figure(24.0, "GB/s", Source.MEASURED, "one thread's copy, pinned by the test")


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OFFLOAD_PLANNER_CONFIG_DIR", str(tmp_path / "cfg"))
    return tmp_path / "cfg"


def _token_bytes(model: Model) -> int:
    """What a generated token reads: every weight but the token embedding, and one row of it."""
    embd = model.tensor("token_embd.weight")
    rest = sum(t.nbytes for t in model.tensors if t.name != "token_embd.weight")
    return rest + embd.nbytes // embd.shape[1]


def test_the_probe_measures_one_thread_too_and_caches_it(cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = speed_store.measure_ram(0.2, 64 * 1024 * 1024)
    assert probe.thread_gbs is not None and 0.1 < probe.thread_gbs < 10_000  # a real copy on any machine
    assert speed_store.thread_bandwidth(measure=False) is None
    monkeypatch.setattr(speed_store.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    ram = speed_store.host_bandwidth()  # one probe: both figures kept
    stored = json.loads((cfg / "speed.json").read_text())["machines"][speed_store.machine_key()]
    assert ram is not None and stored["ram_gbs"] == ram.value and stored["ram_thread_gbs"] > 0

    def no_measure(*a: object, **k: object) -> object:
        raise AssertionError("measured again")

    monkeypatch.setattr(speed_store, "measure_ram", no_measure)
    monkeypatch.setattr(speed_store, "_one_thread_copy", no_measure)
    one = speed_store.thread_bandwidth()
    assert one is not None and one.source is Source.MEASURED and one.value == stored["ram_thread_gbs"]
    assert "one thread's copy on this machine" in one.note


def test_a_store_without_the_single_thread_pass_gets_it_measured(cfg: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A store kept before the pass existed (this machine's: ram_gbs 43.9, quiet) keeps its RAM figure
    and gets the single-thread figure measured once, marked busy when the machine was, measured again
    an hour later then, the larger kept."""
    cfg.mkdir(parents=True)
    key = speed_store.machine_key()
    (cfg / "speed.json").write_text(json.dumps({"machines": {key: {
        "ram_gbs": 43.9, "ram_measured_at": "2026-11-28 12:31", "ram_busy": False}}}))
    got: list[float] = []

    def copy(value: float, share: float) -> None:
        def fake(*a: object, **k: object) -> tuple[float, float]:
            got.append(value)
            return value, share
        monkeypatch.setattr(speed_store, "_one_thread_copy", fake)

    monkeypatch.setattr(speed_store.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    copy(9.0, 0.4)  # the thread ran on a core 0.4 of the time: busy
    first = speed_store.thread_bandwidth()
    assert first is not None and first.value == 9.0 and "while it was busy" in first.note
    assert speed_store.host_bandwidth().value == 43.9  # type: ignore[union-attr]
    copy(23.0, 1.0)
    assert speed_store.thread_bandwidth().value == 9.0 and got == [9.0]  # type: ignore[union-attr]
    data = json.loads((cfg / "speed.json").read_text())
    data["machines"][key]["ram_thread_measured_at"] = "2026-01-01 00:00"  # an hour has passed
    (cfg / "speed.json").write_text(json.dumps(data))
    again = speed_store.thread_bandwidth()
    assert again is not None and again.value == 23.0 and "busy" not in again.note and got == [9.0, 23.0]
    data = json.loads((cfg / "speed.json").read_text())
    data["machines"][key]["ram_thread_measured_at"] = "2026-01-01 00:00"
    (cfg / "speed.json").write_text(json.dumps(data))
    assert speed_store.thread_bandwidth().value == 23.0 and got == [9.0, 23.0]  # type: ignore[union-attr]


def test_one_thread_reads_its_measured_copy_at_the_probes_efficiency(small_models: dict[str, Path]) -> None:
    model = open_model(small_models["llama"])
    cpu = Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB)
    devices = DeviceSet(cpu, ())
    plan = plan_from_args(model, devices, parse_server_args(["-c", "1024", "-t", "1"]))
    ram = Figure(40.0, "GB/s", Source.MEASURED, "RAM probe pinned by the test")
    default = estimate(plan, hardware_for(devices, threads=1, probe=ram), eff=DEFAULT)
    hw = hardware_for(devices, threads=1, probe=ram, thread_bw={"CPU": ONE})
    measured = estimate(plan, hw, eff=DEFAULT)
    per_token = _token_bytes(model)
    assert default.tg_tps == pytest.approx(10.0e9 / per_token, rel=1e-9)  # the default 10 GB/s a thread
    assert measured.tg_tps == pytest.approx(24.0 * 0.9 * 1e9 / per_token, rel=1e-9)
    assert any(a.what == "CPU limited by -t 1" and a.figure.source is Source.MEASURED
               and "24 GB/s" in a.figure.note for a in measured.assumptions)
    # the threads together still read no more than the probe's figure allows
    two = estimate(plan_from_args(model, devices, parse_server_args(["-c", "1024", "-t", "2"])),
                   hardware_for(devices, threads=2, probe=ram, thread_bw={"CPU": ONE}), eff=DEFAULT)
    assert two.tg_tps == pytest.approx(40.0 * 0.9 * 1e9 / per_token, rel=1e-9)
    # a calibrated per-thread figure (launch --bench) wins over the probe's
    cal = calibrated({"cpu_thread_bandwidth": 5.0}, "test")
    assert estimate(plan, hw, eff=cal).tg_tps == pytest.approx(5.0e9 / per_token, rel=1e-9)
    # and a measurement calibrates from the figure the estimate used: 20 GB/s measured -> 20
    got = calibrate(measured, hw, DEFAULT, tg_tps=20.0e9 / per_token)
    assert got.values == {"cpu_thread_bandwidth": pytest.approx(20.0, rel=1e-3)}
    assert thread_bandwidth(hw["CPU"], DEFAULT).value == pytest.approx(21.6)


def test_the_figure_goes_to_this_machines_devices_only(small_models: dict[str, Path], cfg: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU and a loopback rpc-server (threads=1) get this machine's single-thread figure; an
    rpc-server on another host, and a CPU declared by its bandwidth (another machine), keep the default."""
    monkeypatch.setattr(speed_store, "host_bandwidth",
                        lambda *, measure=True: Figure(40.0, "GB/s", Source.MEASURED, "pinned"))
    monkeypatch.setattr(speed_store, "thread_bandwidth", lambda *, measure=True: ONE)
    one = (("threads", "1"), ("bw", "40"))
    gpus = (Device("RPC0", DeviceKind.RPC, 16 * GiB, endpoint="127.0.0.1:50052", hardware=one),
            Device("RPC1", DeviceKind.RPC, 16 * GiB, endpoint="10.0.0.5:50052", hardware=one))
    here = speed_store.devices_hardware(DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), gpus), 2,
                                        probe=False)
    assert here["CPU"].thread_bandwidth == ONE and here["RPC0"].thread_bandwidth == ONE
    assert here["RPC1"].thread_bandwidth is None
    assert thread_bandwidth(here["RPC0"], DEFAULT).value == pytest.approx(21.6)
    assert thread_bandwidth(here["RPC1"], DEFAULT) == DEFAULT.cpu_thread_bandwidth
    elsewhere = Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB, hardware=(("bw", "100"),))
    there = speed_store.devices_hardware(DeviceSet(elsewhere, ()), 2, probe=False)
    assert there["CPU"].thread_bandwidth is None


def test_the_single_thread_pass_marks_a_busy_probe(cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe's busy mark takes the single-thread pass's share of its core too: here its thread ran
    a fifth of the time (the multi-thread pass's threads had their cores)."""
    monkeypatch.setattr(speed_store.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(speed_store, "_one_thread_copy", lambda *a, **k: (5.0, 0.2))
    probe = speed_store.measure_ram(0.2, 16 * 1024 * 1024)
    assert probe.thread_gbs == 5.0 and probe.cpu_share == 0.2

