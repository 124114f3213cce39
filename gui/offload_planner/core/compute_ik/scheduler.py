"""ik's backends: its CUDA op offload of host weights (``ggml_backend_cuda_offload_op``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from offload_planner.core.compute.ggml import CPU, T
from offload_planner.core.compute.scheduler import Backend
from offload_planner.core.compute.simulate import backends_for
from offload_planner.core.ik_repack import interleaved_off_gpu, repacked_off_gpu

if TYPE_CHECKING:
    from offload_planner.core.devices import DeviceSet
    from offload_planner.core.placement import Placement


@dataclass(frozen=True)
class IkBackend(Backend):
    """ik's ``ggml_backend_cuda_offload_op``: an op with a weight in host memory runs on the GPU
    (the weight copied through its compute buffer) when ``ne[1]`` reaches the offload batch (32);
    for the MoE ops when the batch reaches it and ``batch * active experts >= 32 * experts``
    (DeepSeek-V3, 8 of 256: from 1024 tokens, so not at the default -ub 512).  Never for a weight
    ``-rtr`` repacked into a type the GPU cannot run (``refused``, :mod:`core.ik_repack`)."""

    refused: frozenset[str] = frozenset()

    def offloads(self, op: T) -> bool:
        if self.offload_min_batch is None:
            return False
        w0 = op.src[0] if op.src else None
        if w0 is not None and w0.name in self.refused:
            return False
        if self.offload_only is not None and op.op not in self.offload_only:
            return False
        n = self.offload_min_batch
        if op.op in ("MUL_MAT_ID", "MOE_FUSED_UP_GATE"):
            ids = op.src[2] if op.op == "MUL_MAT_ID" else op.src[3]
            w = op.src[0]
            if ids is None or w is None or op.ne[2] < n:
                return False
            return op.ne[2] * ids.ne[0] >= n * w.ne[2]
        return op.ne[1] >= n and op.op != "GET_ROWS"


def ik_backends(devices: DeviceSet, placement: Placement, repack: bool,
                 cuda_r4: bool = True) -> list[Backend]:
    """The backends, the GPUs refusing ops on host weights they cannot multiply (-rtr repacked, or a file's
    row-interleaved type the build's CUDA backend lacks)."""
    host = [(it.tensor.name, it.tensor.shape, it.tensor.type.name) for it in placement.items
            if it.device == CPU and not it.copy]
    refused = interleaved_off_gpu(host, cuda_r4) | (repacked_off_gpu(host) if repack else frozenset())
    return [IkBackend(b.name, b.buft, b.alignment, b.cuda_like, b.offload_min_batch, b.offload_only,
                      refused if b.cuda_like else frozenset())
            for b in backends_for(devices, placement)]
