"""Without an NVIDIA driver, plan and fit said "note: no NVIDIA driver found (NVML Shared Library Not
Found); declare GPUs with --device CUDA0=24GiB" to a user whose command line declared
--device CUDA0=rtx3060: a hint to do what was done.  With declared GPUs the note names them, as the
window's Devices pane does; without any, it keeps the hint."""

from __future__ import annotations

from pathlib import Path

import pytest

from offload_planner.backend import system
from offload_planner.backend.system import Detection
from offload_planner.cli import main

QWEN = str(Path(__file__).resolve().parents[1] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
NO_DRIVER = "no NVIDIA driver found (NVML Shared Library Not Found); declare GPUs with --device CUDA0=24GiB"


@pytest.fixture
def no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system, "detect_gpus", lambda: Detection(message=NO_DRIVER))


def _notes(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    main(list(argv))
    return [ln for ln in capsys.readouterr().out.splitlines() if "NVIDIA driver" in ln]


@pytest.mark.usefixtures("no_driver")
def test_plan_and_fit_name_the_declared_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    said = "note: no NVIDIA driver found (NVML Shared Library Not Found): planning for the declared CUDA0"
    assert _notes(capsys, "plan", QWEN, "--device", "CUDA0=rtx3060", "--", "-c", "4096") == [said]
    assert _notes(capsys, "fit", QWEN, "--device", "CUDA0=rtx3060", "--", "-c", "4096") == [
        said + " (GPU speed figures: declared or from the catalogue)"]


@pytest.mark.usefixtures("no_driver")
def test_without_a_declared_gpu_the_hint_stays(capsys: pytest.CaptureFixture[str]) -> None:
    assert _notes(capsys, "plan", QWEN, "--", "-c", "4096") == [f"note: {NO_DRIVER}"]
