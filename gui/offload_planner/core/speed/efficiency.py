"""Effective = peak x efficiency: the fractions of spec-sheet figures llama.cpp reaches.

Defaults are round figures, not fitted ("default, uncalibrated"), until measurements replace them:
``calibrated(...)`` takes the efficiencies measured on a machine (``launch --bench``) and marks them
calibrated.  ``tests/core/test_speed_public.py`` prints how these defaults fare against public
measurements.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from offload_planner.core.speed.hardware import Figure, Source

UNCALIBRATED = "default, uncalibrated"


def _d(value: float, unit: str = "x peak") -> Figure:
    return Figure(value, unit, Source.DEFAULT, UNCALIBRATED)


@dataclass(frozen=True)
class Efficiencies:
    gpu_bandwidth: Figure = _d(0.75)  # weights and KV streamed from VRAM during token generation
    cpu_bandwidth: Figure = _d(0.65)  # of the declared / default RAM bandwidth
    probe_bandwidth: Figure = _d(0.9)  # of the probe's measured copy bandwidth (already effective)
    gpu_compute: Figure = _d(0.35)  # quantized matrix multiplication against dense FP16 peak
    cpu_compute: Figure = _d(0.5)
    link: Figure = _d(0.8)  # PCIe / network payload against the line rate
    cpu_thread_bandwidth: Figure = _d(10.0, "GB/s per thread")  # one thread's share when -t limits it
    split_latency_us: Figure = _d(20.0, "µs per graph split")  # synchronise + launch across devices
    rpc_latency_us: Figure = _d(150.0, "µs per RPC graph split")  # a network round trip per split

    def names(self) -> list[str]:
        return [f.name for f in fields(self)]


DEFAULT = Efficiencies()


def calibrated(values: Mapping[str, float], note: str, base: Efficiencies = DEFAULT) -> Efficiencies:
    """``base`` with the named efficiencies replaced by measured ones (``note`` says where from:
    machine and backend).  Unknown names raise ValueError."""
    known = set(base.names())
    bad = sorted(set(values) - known)
    if bad:
        raise ValueError(f"unknown efficiencies {bad} (known: {sorted(known)})")
    changes = {k: Figure(float(v), getattr(base, k).unit, Source.CALIBRATED, note) for k, v in values.items()}
    return replace(base, **changes)
