"""What loading a projector allocates, per device, as ``clip_ctx`` / ``clip_model_loader`` do.

* The device (``clip_ctx::clip_ctx``): ``-mmdev`` if given; else, with ``--device``, its first
  device (``common_params_parse``); else the first GPU in the backend registry
  (``ggml_backend_init_by_type(GPU)``), which lists local GPUs before the RPC servers ``--rpc``
  adds; ``--no-mmproj-offload`` (or no GPU): the CPU.
* Weights: one buffer of the device's default type, each tensor padded to its alignment
  (``ggml_backend_alloc_ctx_tensors_from_buft``); the log prints the unpadded sum as
  ``load_hparams: model size``.
* Compute: the warmup graph (one ``image_size`` image) reserved by a scheduler over the device and
  the CPU (``reserve_compute_meta: <buft> compute buffer size``); no compute without warmup
  (``--no-warmup``).  Flash attention ``auto`` tries it first and keeps it where the backend runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from offload_planner.core.compute.allocator import GraphAllocator
from offload_planner.core.compute.ggml import CPU, T
from offload_planner.core.compute.scheduler import (
    CUDA_LIKE,
    OP_OFFLOAD_MIN_BATCH,
    OP_OFFLOAD_ONLY,
    Backend,
    Scheduler,
)
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.memory import alloc_size
from offload_planner.core.mmproj.graph import build_graph
from offload_planner.core.mmproj.projector import Projector


@dataclass(frozen=True)
class MmprojOptions:
    """The server flags that decide where the projector goes and what it reserves."""

    offload: bool = True  # --mmproj-offload / --no-mmproj-offload
    device: str | None = None  # -mmdev (a device name, or "none")
    devices: tuple[str, ...] = ()  # --device list (its first entry is the default)
    flash_attn: bool | None = None  # -fa on/off; None = auto
    warmup: bool = True  # --no-warmup skips the reserve
    image_max_tokens: int = 0  # --image-max-tokens (0: the model's)


@dataclass(frozen=True)
class MmprojBuffers:
    """Bytes the projector takes: its weights on ``device`` and compute per device name."""

    projector: Projector
    device: str  # where the weights are (a GPU name or CPU)
    weights: int  # allocated (padded)
    compute: dict[str, int] = field(default_factory=dict)
    flash_attn: bool = True
    why: str = ""  # set when the compute is not the exact graph
    n_nodes: int = 0  # of the warmup graph (logged as ``graph splits = S, nodes = N``)
    n_splits: int = 0

    def total(self, device: str) -> int:
        return (self.weights if device == self.device else 0) + self.compute.get(device, 0)

    @property
    def devices(self) -> list[str]:
        names = [self.device] + [d for d in self.compute if d != self.device]
        return names


def mmproj_device(devices: DeviceSet, opts: MmprojOptions) -> Device | None:
    """The GPU the projector runs on, or None for the CPU."""
    if not opts.offload:
        return None
    name = opts.device if opts.device is not None else (opts.devices[0] if opts.devices else None)
    if name is not None:
        return None if name.lower() == "none" else devices.by_name(name)
    local = [g for g in devices.gpus if g.kind is not DeviceKind.RPC]
    rpc = [g for g in devices.gpus if g.kind is DeviceKind.RPC]
    gpus = local or rpc
    return gpus[0] if gpus else None


def _backend(dev: Device) -> Backend:
    return Backend(dev.name, dev.buffer_type, dev.alignment, dev.kind in CUDA_LIKE,
                   OP_OFFLOAD_MIN_BATCH.get(dev.kind), OP_OFFLOAD_ONLY.get(dev.kind))


def weight_bytes(proj: Projector, dev: Device) -> int:
    """One buffer of the device's type: each tensor's alloc size padded to the alignment."""
    a = dev.alignment
    return sum(-(-alloc_size(t, dev) // a) * a for t in proj.tensors)


@dataclass(frozen=True)
class Reserved:
    sizes: dict[str, int]  # compute buffer per device name
    n_nodes: int
    n_splits: int


def compute_bytes(proj: Projector, gpu: Device | None, cpu: Device, flash_attn: bool,
                  image_max_tokens: int = 0) -> Reserved:
    """The warmup graph reserved over the device and the CPU."""
    backends = ([_backend(gpu)] if gpu is not None else []) + [Backend(CPU, CPU, cpu.alignment)]
    home = gpu.name if gpu is not None else CPU
    cache: dict[str, T] = {}
    by_name = {t.name: t for t in proj.tensors}

    def weight(name: str) -> T | None:
        if name not in cache:
            pt = by_name.get(name)
            if pt is None:
                return None
            t = T(pt.type, pt.shape, name=name)
            t.dev, t.weights = home, True
            cache[name] = t
        return cache[name]

    g = build_graph(proj, weight, flash_attn=flash_attn, image_max_tokens=image_max_tokens)
    sched = Scheduler(backends, 1, op_offload=True)
    sched.split_graph(g)
    sizes = GraphAllocator(backends).run(sched.nodes, sched.node_ids, sched.leafs, sched.leaf_ids)
    return Reserved({b.name: s for b, s in zip(backends, sizes, strict=True)}, len(g.nodes),
                    len(sched.splits))


def project_mmproj(proj: Projector, devices: DeviceSet, opts: MmprojOptions) -> MmprojBuffers:
    """The projector's weights and compute buffers for the server flags ``opts``."""
    gpu = mmproj_device(devices, opts)
    home = gpu.name if gpu is not None else CPU
    fa = True if opts.flash_attn is None else opts.flash_attn
    res = Reserved({}, 0, 0)
    why = ""
    if opts.warmup and proj.has_graph:
        res = compute_bytes(proj, gpu, devices.cpu, fa, opts.image_max_tokens)
    elif opts.warmup:
        why = f"no compute graph for projector type {proj.proj_type!r}: compute not projected"
    if opts.warmup and proj.audio and proj.has_graph:
        why = "the audio encoder's compute buffers are not projected (weights are)"
    return MmprojBuffers(proj, home, weight_bytes(proj, gpu or devices.cpu), res.sizes, fa, why,
                         res.n_nodes, res.n_splits)
