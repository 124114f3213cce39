"""The machine's devices: NVIDIA GPUs through NVML (in CUDA order) and system RAM through psutil.

Without an NVIDIA driver the app works with declared devices; :func:`detect_gpus` says why none
were found instead of failing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import psutil

from offload_planner.core.devices import Device, DeviceKind


@dataclass
class Detection:
    gpus: list[Device] = field(default_factory=list)
    message: str = ""  # why no GPU was detected, for the user


def cpu_device() -> Device:
    """System RAM with its total as capacity: what is available changes from one second to the
    next (page cache, other programs), so a plan checked against it would too."""
    vm = psutil.virtual_memory()
    return Device("CPU", DeviceKind.CPU, vm.total, None, description="system RAM", source="psutil")


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
                                      description=name, source="nvml")))
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
