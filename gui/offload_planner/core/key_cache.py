"""A K-only cache of one tensor a layer, as llama.cpp allocates a ``llama_kv_cache`` without V (the
DSA indexer's keys, :mod:`offload_planner.core.dsa`; the hybrid indexer's, :mod:`.hybrid_indexer`): each
layer's tensor on its device (the CPU with -nkvo) padded to the device's alignment, one buffer a
buffer type (``ggml_backend_alloc_ctx_tensors_from_buft``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING

from offload_planner.core.units import pad

if TYPE_CHECKING:
    from offload_planner.core.devices import DeviceSet
    from offload_planner.core.placement import Placement

#: the host device's name (``placement.CPU``; not imported: the GGUF reader imports the callers)
CPU = "CPU"


def per_device(placement: Placement, offload_kqv: bool, devices: DeviceSet, layers: Iterable[int],
               nbytes: int) -> tuple[dict[str, int], dict[str, int]]:
    """Bytes and layers per device of a tensor of ``nbytes`` for each of ``layers``."""
    size: dict[str, int] = defaultdict(int)
    count: dict[str, int] = defaultdict(int)
    for il in layers:
        name = placement.layer_device(il) if offload_kqv else CPU
        dev = devices.by_name(name) or devices.cpu
        size[name] += pad(nbytes, dev.alignment)
        count[name] += 1
    return size, count
