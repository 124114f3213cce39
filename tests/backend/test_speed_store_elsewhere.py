"""A bench on this machine calibrates this machine's figures (its CPU, cores and links): a plan whose CPU
is declared as another machine (its RAM's speed given: ``ram=``/``bw=``) takes none of them, as its
hardware figures take neither this machine's RAM probe nor its instruction set.  A newcomer found the
opposite: after ``launch --bench`` here, ``fit ... --device CPU=512GiB,ram=...`` priced the other
machine's CPU with this one's calibrated compute."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from offload_planner.backend import speed_store
from offload_planner.cli import main
from offload_planner.core.speed.hardware import Source


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OFFLOAD_PLANNER_CONFIG_DIR", str(tmp_path / "cfg"))
    return tmp_path / "cfg"


def _speed(capsys: pytest.CaptureFixture[str], model: Path, cpu: str) -> dict[str, object]:
    assert main(["plan", str(model), "--no-detect", "--device", cpu, "--json", "--", "-c", "1024"]) == 0
    speed: dict[str, object] = json.loads(capsys.readouterr().out)["speed"]
    return speed


def test_this_machines_calibration_stays_off_another_machines_cpu(
        cfg: Path, small_models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    model = small_models["llama"]
    speed_store.record_efficiencies("ik_llama.cpp", {"cpu_compute": 0.5})  # makes the store: not llama.cpp's
    data = json.loads((cfg / "speed.json").read_text())
    data["machines"][speed_store.machine_key()].update(  # a quiet probe of this hour: not measured again
        ram_gbs=50.0, ram_thread_gbs=10.0, ram_measured_at=time.strftime("%Y-%m-%d %H:%M"), ram_busy=False)
    (cfg / "speed.json").write_text(json.dumps(data))
    here = _speed(capsys, model, "CPU=64GiB")
    there = _speed(capsys, model, "CPU=64GiB,ram=2xDDR5-4800")
    assert here["calibrated"] is False and there["calibrated"] is False
    speed_store.record_efficiencies("llama.cpp", {"cpu_compute": 0.05, "probe_bandwidth": 0.3,
                                                 "cpu_bandwidth": 0.3})
    assert speed_store.efficiencies_for("llama.cpp").cpu_compute.source is Source.CALIBRATED
    here_cal = _speed(capsys, model, "CPU=64GiB")
    there_cal = _speed(capsys, model, "CPU=64GiB,ram=2xDDR5-4800")
    assert here_cal["calibrated"] is True and here_cal["tg_tps"] != here["tg_tps"]  # this machine's: applied
    assert there_cal == there  # another machine's: untouched
