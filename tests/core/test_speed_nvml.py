"""GPU speed figures from the driver (NVML): memory bus width x maximum memory clock -> bandwidth,
PCIe generation x width -> link; they rank below a declaration and above the catalogue.  Without a
driver (this machine) the declared and catalogue figures are used, and the output says so.

Public figures (copied with their pages):
- https://github.com/NVIDIA/nvbench/pull/207 (nvbench's device summary, from CUDA's bus width and
  memory clock): "NVIDIA GeForce RTX 4090" ... "Global Memory Bus Peak: 1008 GB/sec (384-bit DDR
  @10501MHz)".
- https://github.com/nicehash/NiceHashQuickMiner/issues/206: RTX 3090 "card default of 1219MHz
  (9751MHz)"; the 936 GB/s of its 384-bit GDDR6X at 19.5 Gbps: NVIDIA Ampere GA102 GPU architecture
  whitepaper (the speed catalogue's rtx3090 entry).
- https://en.wikipedia.org/wiki/PCI_Express (throughput table, per direction): 3.0 x16 15.754 GB/s,
  4.0 x16 31.508 GB/s, 5.0 x16 63.015 GB/s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from offload_planner.backend.system import detect_gpus
from offload_planner.core.devices import Device, DeviceKind, DeviceSet, build_device_set, parse_device_decl
from offload_planner.core.speed.hardware import Source, gpu_speed, nvml_bandwidth_gbs, pcie_gbs

RES = Path(__file__).resolve().parents[2] / "resources"
GiB = 1024**3


@pytest.mark.parametrize(("bits", "mhz", "public_gbs"), [(384, 10501, 1008), (384, 9751, 936)])
def test_bus_width_and_clock_give_the_published_bandwidth(bits: int, mhz: int, public_gbs: float) -> None:
    assert nvml_bandwidth_gbs(bits, mhz) == pytest.approx(public_gbs, abs=0.6)


@pytest.mark.parametrize(("gen", "public_gbs"), [(3, 15.754), (4, 31.508), (5, 63.015)])
def test_pcie_generation_and_width_give_the_published_link(gen: int, public_gbs: float) -> None:
    assert pcie_gbs(gen, 16) == pytest.approx(public_gbs, abs=0.01)
    assert pcie_gbs(gen, 8) == pytest.approx(public_gbs / 2, abs=0.01)


def _detected(**hw: str) -> Device:
    return Device("CUDA0", DeviceKind.CUDA, 24 * GiB, 23 * GiB, description="NVIDIA GeForce RTX 3090",
                  source="nvml", hardware=tuple(hw.items()))


def test_driver_figures_rank_below_a_declaration_and_above_the_catalogue() -> None:
    # a memory overclock the driver reports (10251 MHz) beats the catalogue's stock 936 GB/s
    s = gpu_speed(_detected(nvml_bus="384x10251", nvml_pcie="3x8"))
    assert s.bandwidth.source is Source.DRIVER and s.bandwidth.value == pytest.approx(984.1, abs=0.1)
    assert s.link.source is Source.DRIVER and s.link.value == pytest.approx(15.754 / 2, abs=0.01)
    assert s.tflops.source is Source.CATALOGUE  # NVML reports no throughput: the card's figure
    assert "NVML" in s.bandwidth.note and "3.0 x8" in s.link.note.replace("PCIe ", "")
    # the catalogue alone without driver figures
    plain = gpu_speed(_detected())
    assert (plain.bandwidth.source, plain.bandwidth.value) == (Source.CATALOGUE, 936)
    # a declaration over the detected GPU keeps the driver's figures it does not replace
    ds = build_device_set(cpu=parse_device_decl("CPU=64GiB"), detected=[_detected(nvml_bus="384x9751",
                                                                                    nvml_pcie="4x16")],
                          rpc_endpoints=[], declared=[parse_device_decl("CUDA0=24GiB,bw=900GB/s")])
    g = gpu_speed(ds.gpus[0])
    assert (g.bandwidth.source, g.bandwidth.value) == (Source.DECLARED, 900)
    assert g.link.source is Source.DRIVER and g.link.value == pytest.approx(31.508, abs=0.01)
    assert isinstance(ds, DeviceSet)


def test_users_cannot_declare_driver_figures() -> None:
    from offload_planner.core.errors import PlannerError

    with pytest.raises(PlannerError, match="unknown field 'nvml_bus'"):
        parse_device_decl("CUDA0=24GiB,nvml_bus=384x9751")


def test_without_a_driver_the_catalogue_is_used_and_the_output_says_so() -> None:
    det = detect_gpus()
    if det.gpus:  # a machine with a driver: every GPU carries the driver's figures instead
        assert all(dict(g.hardware).get("nvml_bus") for g in det.gpus)
        return
    assert "driver" in det.message or "nvidia-ml-py" in det.message
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "gui")}
    r = subprocess.run([sys.executable, "-m", "offload_planner.cli", "fit",
                        str(RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf"), "--device", "CUDA0=rtx3090",
                        "--device", "CPU=64GiB", "--goal", "tg", "--json", "--", "-c", "8192"],
                       capture_output=True, text=True, timeout=300, env=env, check=False)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    # the driver's words, then the declared GPU planned for (not "declare GPUs with --device": it is)
    said = det.message.split(";")[0]
    assert any(said in n and "planning for the declared CUDA0" in n and "catalogue" in n for n in d["notes"])
    bw = next(a for a in d["speed"]["assumptions"] if a["what"] == "CUDA0 memory bandwidth")
    assert (bw["source"], bw["value"]) == ("catalogue", 936)
