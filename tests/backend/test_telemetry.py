"""Telemetry: NVML per-GPU memory and utilisation in CUDA order (a fake pynvml stands in for a driver),
RAM only with the reason when NVML is missing, process RSS over the process tree, and the sampler's
rate."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from pytestqt.qtbot import QtBot

from offload_planner.backend.telemetry import (
    MAX_INTERVAL_MS,
    MIN_INTERVAL_MS,
    NvmlSource,
    Sample,
    TelemetrySampler,
    process_rss,
    system_ram,
)
from offload_planner.core.units import GiB


def _fake_nvml(util_fails: bool = False) -> ModuleType:
    """Three GPUs that NVML lists out of PCI order (index 0 is bus 03, index 1 bus 01, index 2 bus 02)."""
    gpus = [("0000:03:00.0", "RTX 3090", 3), ("0000:01:00.0", "RTX 4090", 1),
            ("0000:02:00.0", "RTX A6000", 2)]
    m = ModuleType("pynvml")
    state = {"init": 0, "shutdown": 0}

    def init() -> None:
        state["init"] += 1

    def shutdown() -> None:
        state["shutdown"] += 1

    def util(h: int) -> Any:
        if util_fails:
            raise RuntimeError("not supported")
        return SimpleNamespace(gpu=10 * gpus[h][2], memory=5)

    m.nvmlInit = init  # type: ignore[attr-defined]
    m.nvmlShutdown = shutdown  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = lambda: len(gpus)  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    m.nvmlDeviceGetPciInfo = lambda h: SimpleNamespace(busId=gpus[h][0].encode())  # type: ignore[attr-defined]
    m.nvmlDeviceGetName = lambda h: gpus[h][1]  # type: ignore[attr-defined]
    m.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(  # type: ignore[attr-defined]
        total=24 * GiB, used=gpus[h][2] * GiB, free=(24 - gpus[h][2]) * GiB)
    m.nvmlDeviceGetUtilizationRates = util  # type: ignore[attr-defined]
    m.state = state  # type: ignore[attr-defined]
    return m


def test_gpus_in_cuda_order_and_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    src = NvmlSource().open()
    assert src.available and src.reason == ""
    got = src.read()
    assert [(g.name, g.description, g.used // GiB, g.util) for g in got] == [
        ("CUDA0", "RTX 4090", 1, 10), ("CUDA1", "RTX A6000", 2, 20), ("CUDA2", "RTX 3090", 3, 30)]
    src.close()
    assert fake.state["shutdown"] == 1 and not src.available and src.read() == []
    only = NvmlSource(visible="2,0").open()
    assert [(g.name, g.description) for g in only.read()] == [("CUDA0", "RTX 3090"), ("CUDA1", "RTX 4090")]
    only.close()
    none = NvmlSource(visible="").open()
    assert not none.available and "no GPU is visible" in none.reason


def test_utilisation_may_be_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(util_fails=True))
    src = NvmlSource().open()
    assert [g.util for g in src.read()] == [None, None, None]
    src.close()


def test_without_nvml_it_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    src = NvmlSource().open()
    assert not src.available and "nvidia-ml-py is not installed" in src.reason
    broken = _fake_nvml()

    def no_driver() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    broken.nvmlInit = no_driver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    src = NvmlSource().open()
    assert not src.available and "no NVIDIA driver" in src.reason and "Library Not Found" in src.reason


def test_rss_counts_the_process_tree() -> None:
    me = process_rss(os.getpid())
    assert me is not None and me > 10 * 1024 * 1024
    code = "import time; x = bytearray(64 * 1024 * 1024); print('ready', flush=True); time.sleep(30)"
    wrapper = [sys.executable, "-c",
               f"import subprocess, sys; subprocess.run([sys.executable, '-c', {code!r}])"]
    p = subprocess.Popen(wrapper, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        tree = process_rss(p.pid)
        assert tree is not None and tree > 64 * 1024 * 1024  # the grandchild's buffer is counted
    finally:
        import psutil

        for c in psutil.Process(p.pid).children(recursive=True):
            c.kill()
        p.kill()
        p.wait(10)
    assert process_rss(p.pid) is None
    used, total = system_ram()
    assert 0 < used < total


def test_sampler_rate_and_ram_only_message(qtbot: QtBot, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert TelemetrySampler(10).interval_ms == MIN_INTERVAL_MS
    assert TelemetrySampler(5000).interval_ms == MAX_INTERVAL_MS
    sampler = TelemetrySampler(250, keep=5)
    samples: list[Sample] = []
    messages: list[str] = []
    sampler.sampled.connect(samples.append)
    sampler.messageChanged.connect(messages.append)
    t0 = time.monotonic()
    sampler.start(os.getpid())
    qtbot.waitUntil(lambda: len(samples) >= 5, timeout=5000)
    elapsed = time.monotonic() - t0
    sampler.stop()
    assert 0.8 < elapsed < 3.0  # one at start, then every 250 ms
    assert messages == ["RAM only: nvidia-ml-py is not installed"] and sampler.message == messages[0]
    s = samples[-1]
    assert s.gpus == () and s.rss is not None and s.ram_total > s.ram_used > 0
    assert s.used_by_device() == {"CPU": s.rss}
    assert len(sampler.samples) == 5 and not sampler.running
    n = len(samples)
    qtbot.wait(600)
    assert len(samples) == n


def test_sampler_with_gpus(qtbot: QtBot, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    sampler = TelemetrySampler(250)
    sampler.start(None, visible_devices="1")
    s = sampler.sample_now()
    sampler.stop()
    assert sampler.message == "" and [g.name for g in s.gpus] == ["CUDA0"]
    assert s.used_by_device() == {"CUDA0": 2 * GiB, "CPU": s.ram_used}  # CUDA 1 = the second by bus id
