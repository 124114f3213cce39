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


@pytest.mark.usefixtures("no_driver")
def test_fit_says_a_gpu_declared_by_its_size_has_default_speed_figures(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`fit --device CUDA0=24GiB` said "(GPU speed figures: declared or from the catalogue)" of a GPU
    whose figures were neither: a default 500 GB/s and 50 TFLOPS, which its tg and pp rest on."""
    said = ("note: no NVIDIA driver found (NVML Shared Library Not Found): planning for the declared "
            "CUDA0, CUDA1")
    assert _notes(capsys, "fit", QWEN, "--device", "CUDA0=24GiB", "--device", "CUDA1=rtx3060",
                  "--device", "CPU=512GiB,bw=200GB/s", "--", "-c", "4096") == [
        said + " (CUDA0: default speed figures, no card given: name it, e.g. CUDA0=rtx3090, or give "
        "bw= and tflops=)"]


def test_fit_prints_what_its_speed_figures_rest_on(capsys: pytest.CaptureFixture[str]) -> None:
    """fit printed its plan's tg and pp without the figures they came from (plan lists them): a
    newcomer with `--device CUDA0=24GiB --device CPU=512GiB` read tg 1.61 t/s with no word that the RAM
    was this machine's probe and the GPU a default one. Its assumptions follow the estimate, as plan's."""
    assert main(["fit", QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--device", "CPU=512GiB,bw=200GB/s",
                 "--", "-c", "4096"]) == 0
    out = capsys.readouterr().out
    block = out[out.index("\nspeed estimate ("):out.index("\nllama-server ")]
    assert "\n  assumptions:\n" in block
    assert "    CUDA0 memory bandwidth: 500 GB/s (default: CUDA0: no card or bw= given)\n" in block
    assert "    CPU memory bandwidth: 200 GB/s (declared: CPU bw=)\n" in block
