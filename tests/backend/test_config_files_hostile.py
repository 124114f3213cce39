"""Hostile files in the config folder (``speed.json``, ``calibration.json``): another program's or a
hand edit's bytes never stop a plan or a launch; they count as no figure and, when a measurement is
kept, are set aside and named."""

from __future__ import annotations

import json
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
