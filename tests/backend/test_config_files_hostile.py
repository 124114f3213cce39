"""Hostile files in the config folder (``speed.json``, ``calibration.json``): another program's or a
hand edit's bytes never stop a plan or a launch; they count as no figure and, when a measurement is
kept, are set aside and named."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from offload_planner.backend import speed_store

#: deeper than Python's json parser holds (RecursionError, not ValueError)
DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OFFLOAD_PLANNER_CONFIG_DIR", str(tmp_path))
    return tmp_path


def test_a_deeply_nested_speed_store_counts_as_none_and_is_set_aside(cfg: Path) -> None:
    (cfg / "speed.json").write_bytes(DEEP)
    assert speed_store.host_bandwidth(measure=False) is None
    assert speed_store.efficiencies_for("llama.cpp").cpu_bandwidth.source.value != "calibrated"
    note = speed_store.record_efficiencies("llama.cpp", {"cpu_bandwidth": 0.42})
    assert "could not be read (not JSON: nested too deeply)" in note and "speed.json.damaged" in note
    assert (cfg / "speed.json.damaged").read_bytes() == DEEP
    assert json.loads((cfg / "speed.json").read_text())["machines"]


def _calibration_file(entry: dict[str, object]) -> bytes:
    good = {"fingerprint": "f", "options": "o", "measured": {"CUDA0": 1 << 30},
            "projected": {"CUDA0": 1 << 29}, "when": 1.7e9, "runs": 2}
    return json.dumps({"version": 1, "entries": {"f/o": {**good, **entry}}}).encode()


@pytest.mark.parametrize("raw", [
    DEEP,
    _calibration_file({"measured": {"CUDA0": float("inf")}}),  # json writes and reads it as Infinity
    _calibration_file({"measured": {"CUDA0": 1e308}}),
    _calibration_file({"measured": {"CUDA0": 10**400}}),
    _calibration_file({"projected": {"CUDA0": -5}}),
    _calibration_file({"measured": {"CUDA0": "1"}}),
    _calibration_file({"when": float("nan")}),
    _calibration_file({"runs": 1e300}),
], ids=["deep", "inf", "1e308", "10**400", "negative", "string", "nan_time", "1e300_runs"])
def test_a_hostile_calibration_is_none_and_a_launch_still_records(tmp_path: Path, raw: bytes) -> None:
    from offload_planner.backend.calibration import CalibrationStore

    store = CalibrationStore(tmp_path / "calibration.json")
    store.path.write_bytes(raw)
    assert store.lookup("f", "o") is None
    cal = store.record("f", "o", {"CUDA0": 1 << 30}, {"CUDA0": 1 << 29})
    assert store.lookup("f", "o") == cal


def test_a_calibration_as_written_reads_back(tmp_path: Path) -> None:
    from offload_planner.backend.calibration import CalibrationStore

    store = CalibrationStore(tmp_path / "calibration.json")
    store.path.write_bytes(_calibration_file({}))
    cal = store.lookup("f", "o")
    assert cal is not None and cal.measured == {"CUDA0": 1 << 30} and cal.runs == 2


def test_stored_times_are_printed_without_escape_sequences_and_cut(cfg: Path) -> None:
    evil = "\x1b[2J\x1b]0;owned\x07" + "9" * 100_000
    entry = {"ram_gbs": 30.0, "ram_busy": False, "ram_measured_at": evil,
             "ram_thread_gbs": 20.0, "ram_thread_busy": False, "ram_thread_measured_at": evil,
             "efficiencies": {"llama.cpp": {"gpu_bandwidth": 0.5}}, "efficiencies_at": {"llama.cpp": evil},
             "rpc_links": {"127.0.0.1:50052": {"gbs": 1.0, "rtt_us": 50.0, "at": evil}}}
    (cfg / "speed.json").write_text(json.dumps({"machines": {speed_store.machine_key(): entry}}))
    ram, one = speed_store.host_bandwidth(measure=False), speed_store.thread_bandwidth(measure=False)
    link = speed_store.rpc_link("127.0.0.1:50052", measure=False)
    notes = [ram.note if ram else "", one.note if one else "",
             speed_store.efficiencies_for("llama.cpp").gpu_bandwidth.note,
             link.note if link is not None and not isinstance(link, str) else ""]
    for note in notes:
        assert "[2J" in note and "9" * 20 in note, note[:200]  # the stored text is shown, printable
        assert "\x1b" not in note and "\x07" not in note and len(note) < 400, note[:200]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs and /dev/zero")
@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "too_large"])
def test_a_store_that_is_no_small_file_is_not_read_and_is_set_aside(cfg: Path, kind: str) -> None:
    """A FIFO named speed.json blocked every plan for ever (open waits for a writer); a link to
    /dev/zero was read until the memory ran out; a 17 MiB file was read whole. Now each counts as no
    figure, and a measurement kept sets it aside as damaged, saying why."""
    from offload_planner.backend.calibration import CalibrationStore

    for name in ("speed.json", "calibration.json"):
        path = cfg / name
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "dev_zero":
            path.symlink_to("/dev/zero")
        else:
            path.write_bytes(b" " * (17 << 20))
    t0 = time.perf_counter()
    assert speed_store.host_bandwidth(measure=False) is None
    assert CalibrationStore(cfg / "calibration.json").lookup("f", "o") is None
    assert time.perf_counter() - t0 < 1
    why = "larger than 16 MiB" if kind == "too_large" else "not a regular file"
    note = speed_store.record_efficiencies("llama.cpp", {"cpu_bandwidth": 0.42})
    assert f"could not be read ({why})" in note
    store = CalibrationStore(cfg / "calibration.json")
    store.record("f", "o", {"CUDA0": 1}, {"CUDA0": 1})
    assert f"could not be read ({why})" in store.note
    for name in ("speed.json", "calibration.json"):
        assert (cfg / name).is_file() and os.path.lexists(cfg / f"{name}.damaged")
