"""The machine's devices: NVIDIA GPUs through NVML (in CUDA order) and system RAM (psutil's figure).

NVML also gives each GPU's memory bus width and maximum memory clock and its PCIe link's maximum
generation and width, kept as the device's ``nvml_bus``/``nvml_pcie`` figures for the speed estimate
(``core.speed.hardware``).  Without an NVIDIA driver the app works with declared devices and the
speed catalogue; :func:`detect_gpus` says why none were found instead of failing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from offload_planner.core.devices import Device, DeviceKind
from offload_planner.core.speed.hardware import PCIE_LANE_GBS


@dataclass
class Detection:
    gpus: list[Device] = field(default_factory=list)
    message: str = ""  # why no GPU was detected, for the user


def cpu_device(declared: Sequence[Device] = ()) -> Device:
    """System RAM with its total as capacity: what is available changes from one second to the
    next (page cache, other programs), so a plan checked against it would too.  Where ``declared``
    (``--device`` values) gives the CPU a size, the total is not read: that size replaces it
    (:func:`~offload_planner.core.devices.build_device_set`), and a one-shot ``plan`` pays the read."""
    total = next((d.total for d in declared if d.kind is DeviceKind.CPU and d.total is not None), None)
    total = ram_total() if total is None else total
    return Device("CPU", DeviceKind.CPU, total, None, description="system RAM", source="psutil")


def ram_total() -> int:
    """This machine's RAM in bytes: ``MemTotal`` on Linux, psutil's total elsewhere."""
    total = _mem_total()
    if total is None:
        import psutil

        total = int(psutil.virtual_memory().total)
    return total


def _mem_total(meminfo: str = "/proc/meminfo") -> int | None:
    """Linux: ``MemTotal`` of ``/proc/meminfo`` in bytes, the figure psutil's ``virtual_memory().total``
    is (read without parsing the other ~50 lines and psutil's import); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open(meminfo, "rb") as f:
            for line in f:
                if line.startswith(b"MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def nvml_figures(nvml: Any, handle: Any) -> tuple[tuple[str, str], ...]:
    """``nvml_bus`` (bus bits x maximum memory clock MHz) and ``nvml_pcie`` (maximum generation x
    width) of one GPU, each left out where the driver does not report it (NVMLError_NotSupported)."""
    out: list[tuple[str, str]] = []
    try:
        bits = int(nvml.nvmlDeviceGetMemoryBusWidth(handle))
        mhz = int(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM))
        if bits > 0 and mhz > 0:
            out.append(("nvml_bus", f"{bits}x{mhz}"))
    except Exception:  # NVMLError_NotSupported, an older driver without the call
        pass
    try:  # the maximum of GPU and slot: the current link drops to gen 1 when idle
        gen = int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle))
        width = int(nvml.nvmlDeviceGetMaxPcieLinkWidth(handle))
        if gen in PCIE_LANE_GBS and width in (1, 2, 4, 8, 16):
            out.append(("nvml_pcie", f"{gen}x{width}"))
    except Exception:
        pass
    return tuple(out)


def detect_gpus() -> Detection:
    """NVIDIA GPUs via nvidia-ml-py, ordered by PCI bus id as CUDA orders them by default
    (``CUDA_DEVICE_ORDER=PCI_BUS_ID`` is what nvidia-smi shows; CUDA's default FASTEST_FIRST
    usually agrees), honouring CUDA_VISIBLE_DEVICES when it lists indices."""
    try:
        import pynvml
    except ImportError:
        return Detection(message="nvidia-ml-py is not installed: no GPU detection")
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return Detection(message=f"no NVIDIA driver found ({e}); declare GPUs with --device CUDA0=24GiB")
    try:
        found: list[tuple[str, Device]] = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else str(name)
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            bus = bus.decode() if isinstance(bus, bytes) else str(bus)
            found.append((bus, Device("", DeviceKind.CUDA, int(mem.total), int(mem.free),
                                      description=name, source="nvml", hardware=nvml_figures(pynvml, h))))
    finally:
        pynvml.nvmlShutdown()
    found.sort(key=lambda bd: bd[0])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devs = [d for _, d in found]
    if visible is not None:
        idx = [int(x) for x in visible.split(",") if x.strip().isdigit()]
        devs = [devs[i] for i in idx if 0 <= i < len(devs)]
    from dataclasses import replace

    out = [replace(d, name=f"CUDA{i}") for i, d in enumerate(devs)]
    return Detection(out, "" if out else "NVIDIA driver found but no GPU is visible")
