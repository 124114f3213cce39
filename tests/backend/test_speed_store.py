"""The RAM probe measures once per machine and caches it in the config folder; measured
efficiencies are stored per backend and make later estimates calibrated."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from offload_planner.backend import speed_store
from offload_planner.core.speed.hardware import Source


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OFFLOAD_PLANNER_CONFIG_DIR", str(tmp_path / "cfg"))
    return tmp_path / "cfg"


def test_probe_measures_once_and_caches(cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert speed_store.host_bandwidth(measure=False) is None
    first = speed_store.host_bandwidth()
    assert first is not None and first.source is Source.MEASURED
    assert 0.1 < first.value < 10_000  # GB/s of a real copy on any machine
    stored = json.loads((cfg / "speed.json").read_text())
    assert stored["machines"][speed_store.machine_key()]["ram_gbs"] == first.value

    def no_measure(*a: object, **k: object) -> float:
        raise AssertionError("measured again")

    monkeypatch.setattr(speed_store, "measure_ram", no_measure)
    assert speed_store.host_bandwidth() == first


def test_recorded_efficiencies_are_calibrated_per_backend(cfg: Path) -> None:
    speed_store.record_efficiencies("llama.cpp", {"cpu_bandwidth": 0.42})
    eff = speed_store.efficiencies_for("llama.cpp")
    assert eff.cpu_bandwidth.value == 0.42 and eff.cpu_bandwidth.source is Source.CALIBRATED
    assert speed_store.efficiencies_for("ik_llama.cpp").cpu_bandwidth.source is Source.DEFAULT
    with pytest.raises(ValueError):
        speed_store.record_efficiencies("llama.cpp", {"nonsense": 1.0})


def test_a_store_larger_than_one_read_is_read_whole(cfg: Path) -> None:
    """The store is read as bytes, in pieces (no text stream): one larger than a piece (64 KiB of
    other machines' figures) is read to its end, and this machine's figure found after them."""
    cfg.mkdir(parents=True)
    others = {f"host{i}|x86_64|8": {"ram_gbs": 10.0 + i % 7} for i in range(3000)}
    mine = {"ram_gbs": 42.5, "ram_measured_at": time.strftime("%Y-%m-%d %H:%M"), "ram_busy": False}
    (cfg / "speed.json").write_text(json.dumps({"machines": {**others, speed_store.machine_key(): mine}},
                                               indent=1), encoding="utf-8")
    assert (cfg / "speed.json").stat().st_size > 1 << 17
    got = speed_store.host_bandwidth(measure=False)
    assert got is not None and got.value == 42.5


def test_the_machine_key_is_platforms_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """The key the RAM figure is stored under is made of ``platform.node()`` and ``platform.machine()``
    (read from ``os.uname`` without importing platform): a figure cached before stays found, also for
    a name ``uname`` reports as 'unknown' (platform reads it as '')."""
    import platform

    assert speed_store.node_and_machine() == (platform.node(), platform.machine())
    assert speed_store.machine_key() == f"{platform.node()}|{platform.machine()}|{os.cpu_count()}"
    if not hasattr(os, "uname"):
        return
    fake = os.uname_result(("Linux", "unknown", "6.1", "#1", "unknown"))
    monkeypatch.setattr(os, "uname", lambda: fake)
    monkeypatch.setattr(platform, "_uname_cache", None)
    assert speed_store.node_and_machine() == (platform.node(), platform.machine()) == ("", "")


def test_unreadable_store_falls_back_to_defaults(cfg: Path) -> None:
    cfg.mkdir(parents=True)
    (cfg / "speed.json").write_text("{not json")
    assert speed_store.efficiencies_for("llama.cpp").gpu_bandwidth.source is Source.DEFAULT
    assert speed_store.host_bandwidth(measure=False) is None


def test_a_plans_estimate_reads_the_store_once(cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The RAM figure and the efficiencies of one estimate come from one reading of the file, with what
    was calibrated in it; a look-up outside an estimate reads it again."""
    from offload_planner.core.cmdline import parse_server_args
    from offload_planner.core.devices import DeviceSet, parse_device_decl
    from offload_planner.core.gguf_reader import open_model
    from offload_planner.core.plan import plan_from_args

    speed_store.record_efficiencies("llama.cpp", {"probe_bandwidth": 0.42})
    data = json.loads((cfg / "speed.json").read_text())
    data["machines"][speed_store.machine_key()].update(  # a quiet figure of this hour: not measured again
        ram_gbs=50.0, ram_measured_at=time.strftime("%Y-%m-%d %H:%M"), ram_busy=False)
    (cfg / "speed.json").write_text(json.dumps(data))
    reads: list[Path] = []
    real = speed_store._read

    def counted() -> dict[str, object]:
        reads.append(speed_store._path())
        return real()

    monkeypatch.setattr(speed_store, "_read", counted)
    model = open_model(Path(__file__).resolve().parents[2] / "resources/Qwen3-30B-A3B-Q4_K_M.header.gguf")
    devices = DeviceSet(parse_device_decl("CPU=512GiB"), (parse_device_decl("CUDA0=24GiB"),))
    est = speed_store.plan_speed(plan_from_args(model, devices, parse_server_args(["-ngl", "20"])))
    assert reads == [cfg / "speed.json"]
    from offload_planner.core.speed.report import speed_json

    figures = {a["what"]: (a["value"], a["source"]) for a in speed_json(est)["assumptions"]}
    assert figures["CPU memory bandwidth"] == (50.0, "measured")
    assert figures["CPU bandwidth efficiency"] == (0.42, "calibrated")
    speed_store.efficiencies_for("llama.cpp")
    assert len(reads) == 2


def test_calibrated_cpu_compute_keeps_its_measured_rate(cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU compute efficiency is a fraction of the CPU's compute figure as it was when measured: one
    kept before the instruction set was read (of the AVX2 figure) reads 1/1.95 of it on an AVX-512
    VNNI machine now, so the calibrated rate is the measured one; one kept with the gain reads as kept."""
    from offload_planner.core.speed.cpu_isa import GAINS, CpuInfo, Isa

    monkeypatch.setattr(speed_store, "this_cpu", lambda: CpuInfo("AMD EPYC", Isa.AVX512_VNNI, None, "test"))
    gain = GAINS[Isa.AVX512_VNNI].value
    speed_store.record_efficiencies("llama.cpp", {"cpu_compute": 1.3})
    data = json.loads((cfg / "speed.json").read_text())
    del data["machines"][speed_store.machine_key()]["cpu_compute_gain"]  # as the store was written before
    (cfg / "speed.json").write_text(json.dumps(data))
    eff = speed_store.efficiencies_for("llama.cpp")
    assert eff.cpu_compute.value == pytest.approx(1.3 / gain) and eff.cpu_compute.source is Source.CALIBRATED
    speed_store.record_efficiencies("llama.cpp", {"cpu_compute": 0.9}, cpu_gain=gain)
    assert speed_store.efficiencies_for("llama.cpp").cpu_compute.value == pytest.approx(0.9)
    assert speed_store.efficiencies_for("llama.cpp").cpu_bandwidth.source is Source.DEFAULT


def test_host_work_per_rpc_split_follows_this_cpu(cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's work per RPC split (1000 µs on an AVX2 core) scales with this machine's cores: an
    AVX-512 VNNI core does it in 1/1.95 of the time, a 2.5 GHz AVX2 core in 3.125/2.5; a calibrated
    figure is kept as measured."""
    from offload_planner.core.speed.cpu_isa import GAINS, CpuInfo, Isa
    from offload_planner.core.speed.efficiency import RPC_HOST_US

    def cpu(isa: Isa | None, ghz: float | None = None) -> None:
        monkeypatch.setattr(speed_store, "this_cpu", lambda: CpuInfo("x", isa, ghz, "test"))

    cpu(Isa.AVX512_VNNI)
    got = speed_store.efficiencies_for("llama.cpp").rpc_latency_us
    assert got.value == pytest.approx(RPC_HOST_US / GAINS[Isa.AVX512_VNNI].value, abs=0.1)
    assert got.source is Source.DEFAULT and "avx512_vnni" in got.note and "AVX2 core" in got.note
    cpu(Isa.AVX2, 2.5)
    assert speed_store.efficiencies_for("llama.cpp").rpc_latency_us.value == pytest.approx(1250.0)
    cpu(None)
    assert speed_store.efficiencies_for("ik_llama.cpp").rpc_latency_us.value == RPC_HOST_US
    speed_store.record_efficiencies("llama.cpp", {"rpc_latency_us": 300.0})
    cpu(Isa.AVX512_VNNI)
    kept = speed_store.efficiencies_for("llama.cpp").rpc_latency_us
    assert (kept.value, kept.source) == (300.0, Source.CALIBRATED)


def test_a_probe_taken_while_busy_is_measured_again_an_hour_later(cfg: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A RAM probe under load reads low (7.4 GB/s on a 2-core machine that reads 32-45 quiet) and the
    cached figure stayed for good. Now it is marked busy, said in the figure's note, measured again
    once an hour has passed, and the larger figure is kept; a quiet probe's figure stays."""
    cfg.mkdir(parents=True)
    key = speed_store.machine_key()

    def store(entry: dict[str, object]) -> None:
        (cfg / "speed.json").write_text(json.dumps({"machines": {key: entry}}))

    monkeypatch.setattr(speed_store.os, "getloadavg", lambda: (99.0, 99.0, 99.0))
    first = speed_store.host_bandwidth()  # measured now, on a machine the load says is busy
    assert first is not None and "while it was busy" in first.note
    assert json.loads((cfg / "speed.json").read_text())["machines"][key]["ram_busy"] is True

    def no_measure(*a: object, **k: object) -> float:
        raise AssertionError("measured again")

    real = speed_store.measure_ram
    monkeypatch.setattr(speed_store, "measure_ram", no_measure)
    assert speed_store.host_bandwidth() == first  # within the hour: kept
    store({"ram_gbs": 0.05, "ram_measured_at": "2026-01-01 00:00", "ram_busy": False})  # quiet: kept
    assert speed_store.host_bandwidth() is not None
    assert speed_store.host_bandwidth().value == 0.05  # type: ignore[union-attr]

    # a quiet machine by both signals: the load average and the probe threads' share of the cores (the
    # real probe still runs; under a loaded CI its threads' share said busy and the test failed)
    monkeypatch.setattr(speed_store, "measure_ram", lambda *a, **k: replace(real(*a, **k), cpu_share=1.0))
    monkeypatch.setattr(speed_store.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    store({"ram_gbs": 0.05, "ram_measured_at": "2026-01-01 00:00", "ram_busy": True})
    again = speed_store.host_bandwidth()
    assert again is not None and again.value > 0.05 and "while it was busy" not in again.note
    stored = json.loads((cfg / "speed.json").read_text())["machines"][key]
    assert stored["ram_busy"] is False and stored["ram_gbs"] == again.value


def test_a_figure_kept_before_the_busy_mark_is_measured_again_once(cfg: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A figure cached before ``ram_busy`` was recorded may have been measured under load (this
    machine's 7.4 GB/s was), and was kept for good. Now it counts as maybe busy: kept within the hour
    of its measurement, measured again after it with the larger figure kept and the mark recorded,
    then kept as any quiet figure."""
    cfg.mkdir(parents=True)
    key = speed_store.machine_key()

    def store(entry: dict[str, object]) -> None:
        (cfg / "speed.json").write_text(json.dumps({"machines": {key: entry}}))

    measured: list[float] = []

    def fake_probe(value: float) -> None:
        def probe(*a: object, **k: object) -> speed_store.RamProbe:
            measured.append(value)
            return speed_store.RamProbe(value, 1.0)  # its threads had their cores
        monkeypatch.setattr(speed_store, "measure_ram", probe)

    monkeypatch.setattr(speed_store.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    fake_probe(40.0)
    store({"ram_gbs": 7.4, "ram_measured_at": time.strftime("%Y-%m-%d %H:%M")})  # within the hour
    assert speed_store.host_bandwidth().value == 7.4 and measured == []  # type: ignore[union-attr]
    store({"ram_gbs": 7.4, "ram_measured_at": "2026-01-01 00:00"})
    again = speed_store.host_bandwidth()
    assert again is not None and again.value == 40.0 and measured == [40.0]
    stored = json.loads((cfg / "speed.json").read_text())["machines"][key]
    assert stored["ram_busy"] is False and stored["ram_gbs"] == 40.0
    data = json.loads((cfg / "speed.json").read_text())
    data["machines"][key]["ram_measured_at"] = "2026-01-01 00:00"
    (cfg / "speed.json").write_text(json.dumps(data))
    assert speed_store.host_bandwidth().value == 40.0 and measured == [40.0]  # type: ignore[union-attr]

    # the larger is kept: an old figure above the new measurement stays, now marked
    fake_probe(30.0)
    store({"ram_gbs": 45.0, "ram_measured_at": "2026-01-01 00:00", "ram_busy": "?"})  # damaged mark
    assert speed_store.host_bandwidth().value == 45.0 and measured == [40.0, 30.0]  # type: ignore[union-attr]
    assert json.loads((cfg / "speed.json").read_text())["machines"][key]["ram_busy"] is False


def test_a_probe_whose_threads_lacked_their_cores_is_marked_busy(cfg: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The load average lags: this machine cached 13.5 GB/s (32-49 quiet) from a probe taken during a
    pip install at a 1-minute load of 0.5, marked quiet and kept for good. A probe now also counts as
    busy when its threads ran on a core for less than 0.8 of their wall time: here one process
    spinning on every core while the real probe runs, with the load average saying idle."""
    import subprocess
    import sys

    monkeypatch.setattr(speed_store.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.3)
        got = speed_store.host_bandwidth()
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert got is not None and "while it was busy" in got.note
    stored = json.loads((cfg / "speed.json").read_text())["machines"][speed_store.machine_key()]
    assert stored["ram_busy"] is True


def test_a_stored_time_is_read_as_strptime_reads_it() -> None:
    """stamp_seconds gives what mktime(strptime(...)) gives, and raises where it raises: the store's own
    times (leap days, month ends, out-of-range fields) and other texts (left to strptime)."""
    from offload_planner.backend.speed_store import stamp_seconds

    texts = ["2026-11-28 15:00", "2024-02-29 23:59", "2025-02-29 12:00", "2000-02-29 00:00",
             "1900-02-29 00:00", "2100-02-28 08:30", "2026-04-31 10:00", "2026-12-31 23:59",
             "2026-13-01 00:00", "2026-00-10 00:00", "2026-01-00 00:00", "2026-01-01 24:00",
             "2026-01-01 23:60", "0000-01-01 00:00", "0001-01-01 00:00", "1970-01-01 00:00",
             "2026-06-15 02:30", "2026-1-5 3:07", " 2026-01-01 00:00", "2026-01-01  00:00",
             "2026-01-01 00:00 ", "٢٠٢٦-01-01 00:00", "2026-01-01", "", "garbage", "9999-12-31 23:59"]

    def outcome(f: Callable[[], float]) -> object:
        try:
            return f()
        except (ValueError, OverflowError) as e:
            return type(e)

    for text in texts:
        want = outcome(lambda t=text: time.mktime(time.strptime(t, "%Y-%m-%d %H:%M")))
        assert outcome(lambda t=text: stamp_seconds(t)) == want, text
