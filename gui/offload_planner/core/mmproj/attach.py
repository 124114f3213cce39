"""The projector a llama-server command loads, as buffers of the plan's projection and as the
fit's extra targets.

* :func:`mmproj_setup` reads ``-mm/--mmproj`` (or ``-mmu/--mmproj-url``, read over HTTP ranges),
  ``--mmproj-offload``/``--no-mmproj-offload``, ``-mmdev``, ``--device`` and ``--no-warmup`` from a
  parsed command (every spelling and environment variable the pinned build accepts).
* :func:`mmproj_buffers` turns it into :class:`Buffer` rows of kind ``mmproj`` (weights and
  compute) that :func:`add_to_projection` files under their devices, so totals, bars and the
  capacity check count them.
* :func:`fit_targets` reproduces ``server_context::load_model``: before the fit, the projector's
  ``mtmd_get_memory_usage`` (unpadded weights + compute per device) is added to
  ``fit_params_target[i]`` where ``i`` is the device's index in the ggml backend *registry*
  (local GPUs, then the CPU, then the RPC servers ``--rpc`` registers), while the fit reads
  ``fit_params_target`` by the model's device index (RPC servers first).  On an RPC-only machine
  the projector's RPC0 share lands on RPC1's target and its CPU compute on RPC0's, as the server
  logs (``target of 1026`` for a 2.8 MiB projector on RPC0).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

from offload_planner.core.buffer import Buffer
from offload_planner.core.devices import DeviceKind, DeviceSet
from offload_planner.core.memory import Projection
from offload_planner.core.mmproj.buffers import MmprojBuffers, MmprojOptions, project_mmproj
from offload_planner.core.mmproj.projector import Projector, read_projector

KIND = "mmproj"
FIT_TARGET = 1024 * 1024 * 1024  # common_params::fit_params_target's default per device


@dataclass(frozen=True)
class MmprojSetup:
    location: str
    offload: bool = True
    device: str | None = None
    devices: tuple[str, ...] = ()
    warmup: bool = True
    image_max_tokens: int = 0

    def options(self, flash_attn: bool | None) -> MmprojOptions:
        return MmprojOptions(self.offload, self.device, self.devices, flash_attn, self.warmup,
                             self.image_max_tokens)


def mmproj_setup(parsed: Any) -> MmprojSetup | None:
    """The projector of a ParsedArgs (None: no ``--mmproj``/``--mmproj-url``)."""
    location: str | None = None
    offload, warmup = True, True
    device: str | None = None
    devices: tuple[str, ...] = ()
    max_tokens = 0
    for f in getattr(parsed, "flags", None) or ():
        value = f.values[0] if f.values else None
        if f.key in ("--mmproj", "--mmproj-url") and value:
            location = value
        elif f.key == "--mmproj-offload":
            offload = f.positive
        elif f.key == "--mmproj-device" and value:
            device = value
        elif f.key == "--warmup":
            warmup = f.positive
        elif f.key == "--device" and value:
            devices = tuple(d.strip() for d in value.split(",") if d.strip())
        elif f.key == "--image-max-tokens" and value and value.strip().lstrip("-").isdigit():
            max_tokens = max(0, int(value))
    if location is None:
        return None
    return MmprojSetup(location, offload, device, devices, warmup, max_tokens)


@functools.lru_cache(maxsize=64)
def argv_mmproj_setup(argv: tuple[str, ...], env: tuple[tuple[str, str], ...] = ()) -> MmprojSetup | None:
    """The projector of a plan's kept flags (``Plan.extra_args``) and ``LLAMA_ARG_*`` variables
    (``Plan.env``), parsed as the pinned server does."""
    if not any(a.startswith(("-mm", "--mmproj")) for a in argv) and not any(
            k.startswith("LLAMA_ARG_MMPROJ") for k, _ in env):
        return None
    from offload_planner.core.cmdline import parse_server_args

    return mmproj_setup(parse_server_args(list(argv), env=dict(env)))


def _stamp(location: str) -> float:
    try:
        return os.stat(location).st_mtime
    except OSError:
        return 0.0


_LAST: dict[str, Projector] = {}  # the last projector read from each location


@functools.lru_cache(maxsize=8)
def _read(location: str, stamp: float) -> Projector:
    del stamp  # part of the cache key: a rewritten file is read again
    proj = _LAST[location] = read_projector(location)
    return proj


def already_read(location: str) -> Projector | None:
    """The projector if some projection read it already (no I/O: for the GUI thread)."""
    return _LAST.get(location)


def load_projector(location: str) -> Projector:
    return _read(location, _stamp(location))


def project_setup(setup: MmprojSetup, devices: DeviceSet, flash_attn: bool | None) -> MmprojBuffers:
    return _project(setup, devices, flash_attn, _stamp(setup.location))


@functools.lru_cache(maxsize=32)
def _project(setup: MmprojSetup, devices: DeviceSet, flash_attn: bool | None, stamp: float) -> MmprojBuffers:
    return project_mmproj(_read(setup.location, stamp), devices, setup.options(flash_attn))


def fa_setting(value: object) -> bool | None:
    """``-fa`` as clip takes it: on, off, or auto (None: tried, kept where supported)."""
    return True if value == "on" else False if value == "off" else None


def _buft(devices: DeviceSet, name: str) -> str:
    dev = devices.by_name(name)
    return dev.buffer_type if dev is not None else name


def mmproj_buffers(mb: MmprojBuffers, devices: DeviceSet) -> list[Buffer]:
    """The projector's buffers: weights on its device, then compute per device."""
    p = mb.projector
    out = [Buffer(mb.device, _buft(devices, mb.device), KIND, mb.weights,
                  f"projector weights: {p.name} ({p.proj_type}, {len(p.tensors)} tensors, "
                  f"{p.weight_bytes / 2**20:.2f} MiB logged as model size)")]
    fa = "on" if mb.flash_attn else "off"
    for dev, size in mb.compute.items():
        out.append(Buffer(dev, _buft(devices, dev), KIND, size,
                          f"projector compute: warmup image {p.image_size}x{p.image_size}, "
                          f"flash attention {fa} (reserve_compute_meta)"))
    return out


def add_to_projection(projection: Projection, buffers: list[Buffer]) -> Projection:
    """File ``buffers`` under their devices (in place; returns the projection)."""
    for b in buffers:
        dm = next((d for d in projection.devices if d.device.name == b.device), projection.devices[-1])
        dm.buffers.append(b)
    return projection


def registry_order(devices: DeviceSet) -> list[str]:
    """ggml's backend registry: local GPUs, the CPU, then the RPC servers added by ``--rpc``."""
    local = [g.name for g in devices.gpus if g.kind is not DeviceKind.RPC]
    rpc = [g.name for g in devices.gpus if g.kind is DeviceKind.RPC]
    return [*local, devices.cpu.name, *rpc]


def fit_targets(mb: MmprojBuffers, devices: DeviceSet, margins: list[int]) -> list[int]:
    """``margins`` (the fit's per-device targets, model device order) with the projector's memory
    added where the pinned server adds it (see the module docstring)."""
    usage = dict(mb.compute)
    usage[mb.device] = usage.get(mb.device, 0) + mb.projector.weight_bytes
    out = list(margins)
    order = registry_order(devices)
    for dev, size in usage.items():
        if dev in order and order.index(dev) < len(out):
            out[order.index(dev)] += size
    return out


def fit_margins(setup: MmprojSetup | None, devices: DeviceSet, flash_attn: bool | None,
                margins: list[int] | int) -> list[int] | int:
    """The fit's targets (``-fitt``: one value or one per GPU) with the projector's memory added
    as the server adds it; unchanged without a projector."""
    if setup is None:
        return margins
    n = max(len(devices.gpus), 1)
    base = [margins] * n if isinstance(margins, int) else [*margins, *[FIT_TARGET] * (n - len(margins))]
    return fit_targets(project_setup(setup, devices, flash_attn), devices, base)
