"""Live memory of the machine while llama-server runs: per-GPU used memory and utilisation through
NVML, the server's resident memory (the process and its children) and system RAM through psutil.

:class:`TelemetrySampler` samples on a QTimer at 2-4 Hz and emits :class:`Sample` objects.  Without
NVML (no nvidia-ml-py, no driver, no GPU) it samples RAM only and :attr:`TelemetrySampler.message`
says why.  GPUs are named ``CUDA0``, ``CUDA1``, ... in CUDA's order (PCI bus id), honouring the
``CUDA_VISIBLE_DEVICES`` the server was launched with, so they match the projection's devices.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import psutil
from PySide6.QtCore import QObject, QTimer, Signal

from offload_planner.backend.runner import guard_pyside_emit_refcount

guard_pyside_emit_refcount()

MIN_INTERVAL_MS = 250  # 4 Hz
MAX_INTERVAL_MS = 500  # 2 Hz


@dataclass(frozen=True)
class GpuSample:
    name: str  # CUDA0, CUDA1, ...
    used: int  # bytes
    total: int
    util: int | None  # percent, None when NVML does not say
    description: str = ""


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the sampler started
    gpus: tuple[GpuSample, ...] = ()
    rss: int | None = None  # the server process and its children, bytes
    ram_used: int = 0  # system RAM in use (total - available), bytes
    ram_total: int = 0

    def used_by_device(self) -> dict[str, int]:
        """Bytes per device name: GPUs' used memory, and CPU = the server's resident memory (or the
        system's used RAM when no process is followed)."""
        out = {g.name: g.used for g in self.gpus}
        out["CPU"] = self.rss if self.rss is not None else self.ram_used
        return out


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass
class NvmlSource:
    """NVML handles in CUDA order.  ``available`` False: ``reason`` says why (shown to the user)."""

    visible: str | None = None  # CUDA_VISIBLE_DEVICES of the server
    available: bool = False
    reason: str = ""
    _nvml: ModuleType | None = field(default=None, repr=False)
    _handles: list[tuple[str, Any, str]] = field(default_factory=list, repr=False)

    def open(self) -> NvmlSource:
        try:
            import pynvml
        except ImportError:
            self.reason = "nvidia-ml-py is not installed"
            return self
        try:
            pynvml.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.reason = f"no NVIDIA driver ({e})"
            return self
        self._nvml = pynvml
        try:
            found = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                bus = _text(pynvml.nvmlDeviceGetPciInfo(h).busId)
                found.append((bus, h, _text(pynvml.nvmlDeviceGetName(h))))
        except Exception as e:
            self.reason = f"NVML could not list GPUs ({e})"
            self.close()
            return self
        found.sort(key=lambda f: f[0])
        if self.visible is not None:
            idx = [int(x) for x in self.visible.split(",") if x.strip().isdigit()]
            found = [found[i] for i in idx if 0 <= i < len(found)]
        self._handles = [(f"CUDA{i}", h, desc) for i, (_, h, desc) in enumerate(found)]
        if not self._handles:
            self.reason = "NVIDIA driver found but no GPU is visible"
            self.close()
            return self
        self.available = True
        return self

    def read(self) -> list[GpuSample]:
        nv = self._nvml
        if nv is None:
            return []
        out = []
        for name, h, desc in self._handles:
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(h)
            except Exception:
                continue
            util: int | None
            try:
                util = int(nv.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception:
                util = None
            out.append(GpuSample(name, int(mem.used), int(mem.total), util, desc))
        return out

    def close(self) -> None:
        nv, self._nvml = self._nvml, None
        self._handles = []
        self.available = False
        if nv is not None:
            with contextlib.suppress(Exception):
                nv.nvmlShutdown()


def process_rss(pid: int) -> int | None:
    """Resident memory of ``pid`` and all its children (a wrapper such as numactl may fork)."""
    try:
        p = psutil.Process(pid)
        total = p.memory_info().rss
        for c in p.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += c.memory_info().rss
        return int(total)
    except psutil.Error:
        return None


def system_ram() -> tuple[int, int]:
    vm = psutil.virtual_memory()
    return int(vm.total - vm.available), int(vm.total)


class TelemetrySampler(QObject):
    """Samples every ``interval_ms`` (clamped to 250-500 ms) and emits :attr:`sampled`."""

    sampled = Signal(object)  # Sample
    messageChanged = Signal(str)

    def __init__(self, interval_ms: int = 500, parent: QObject | None = None, *,
                 keep: int = 2400, nvml: NvmlSource | None = None) -> None:
        super().__init__(parent)
        self._timer = QTimer(self)
        self._timer.setInterval(max(MIN_INTERVAL_MS, min(MAX_INTERVAL_MS, interval_ms)))
        self._timer.timeout.connect(self.sample_now)
        self._nvml = nvml
        self._pid: int | None = None
        self._t0 = time.monotonic()
        self.samples: deque[Sample] = deque(maxlen=keep)
        self.message = ""

    @property
    def interval_ms(self) -> int:
        return int(self._timer.interval())

    @property
    def running(self) -> bool:
        return bool(self._timer.isActive())

    @property
    def gpu_available(self) -> bool:
        return self._nvml is not None and self._nvml.available

    def start(self, pid: int | None = None, visible_devices: str | None = None) -> None:
        """Follow ``pid`` (the server) from now; ``visible_devices`` is its CUDA_VISIBLE_DEVICES."""
        self._pid = pid
        self._t0 = time.monotonic()
        self.samples.clear()
        if self._nvml is None or self._nvml.visible != visible_devices:
            if self._nvml is not None:
                self._nvml.close()
            self._nvml = NvmlSource(visible_devices).open()
        elif not self._nvml.available:
            self._nvml.open()
        msg = "" if self._nvml.available else f"RAM only: {self._nvml.reason}"
        if msg != self.message:
            self.message = msg
            self.messageChanged.emit(msg)
        self.sample_now()
        self._timer.start()

    def set_pid(self, pid: int | None) -> None:
        self._pid = pid

    def stop(self) -> None:
        self._timer.stop()
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None

    def sample_now(self) -> Sample:
        gpus = tuple(self._nvml.read()) if self._nvml is not None else ()
        rss = process_rss(self._pid) if self._pid is not None else None
        used, total = system_ram()
        s = Sample(time.monotonic() - self._t0, gpus, rss, used, total)
        self.samples.append(s)
        self.sampled.emit(s)
        return s
