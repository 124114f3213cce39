"""A speed.json that cannot be read (a hand edit's trailing comma, other bytes) was taken for an empty
store and written over at the next measurement: the calibrations in it were lost without a word. Now
it is set aside as ``speed.json.damaged`` and the figure that replaced it says where it went."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import offload_planner
from offload_planner.backend import speed_store

PACKAGE_ROOT = str(Path(offload_planner.__file__).resolve().parents[1])

#: a calibration with one comma too many, as a hand edit leaves it
DAMAGED = (b'{"machines": {"host|x86_64|8": {"ram_gbs": 24.2, "efficiencies": '
           b'{"llama.cpp": {"gpu_bandwidth": 0.7}},}}}')


@pytest.mark.parametrize("raw", [DAMAGED, b"\xff\xfe speed", b"[1, 2]", b'{"machines": 3}'])
def test_plan_sets_a_damaged_store_aside_and_says_so(tmp_path: Path, raw: bytes,
                                                     small_models: dict[str, Path]) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "speed.json").write_bytes(raw)
    r = subprocess.run([sys.executable, "-m", "offload_planner", "plan", str(small_models["llama"]),
                        "--no-detect", "--", "-c", "512"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": PACKAGE_ROOT, "OFFLOAD_PLANNER_CONFIG_DIR": str(cfg)})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert (cfg / "speed.json.damaged").read_bytes() == raw
    assert speed_store.machine_key() in json.loads((cfg / "speed.json").read_text())["machines"]
    line = next(x for x in r.stdout.splitlines() if "CPU memory bandwidth" in x and "measured" in x)
    assert f"{cfg / 'speed.json'} could not be read (" in line
    assert f"kept as {cfg / 'speed.json.damaged'}" in line


def test_a_calibration_kept_over_a_damaged_store_says_where_it_went(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFLOAD_PLANNER_CONFIG_DIR", str(tmp_path))
    (tmp_path / "speed.json").write_bytes(DAMAGED)
    note = speed_store.record_efficiencies("llama.cpp", {"cpu_bandwidth": 0.42})
    assert "could not be read (not JSON:" in note and "speed.json.damaged" in note
    assert (tmp_path / "speed.json.damaged").read_bytes() == DAMAGED
    assert speed_store.efficiencies_for("llama.cpp").cpu_bandwidth.value == 0.42
    assert speed_store.record_efficiencies("llama.cpp", {"cpu_bandwidth": 0.5}) == ""  # readable now


def test_an_empty_or_readable_store_is_written_over_quietly(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFLOAD_PLANNER_CONFIG_DIR", str(tmp_path))
    (tmp_path / "speed.json").write_bytes(b"  \n")
    assert speed_store.record_efficiencies("llama.cpp", {"cpu_bandwidth": 0.42}) == ""
    assert not (tmp_path / "speed.json.damaged").exists()
