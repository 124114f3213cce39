"""Multimodal projectors (``--mmproj``): read from their GGUF header, placed and sized as mtmd does."""

from offload_planner.core.mmproj.buffers import (
    MmprojBuffers,
    MmprojOptions,
    compute_bytes,
    mmproj_device,
    project_mmproj,
)
from offload_planner.core.mmproj.projector import Projector, ProjectorTensor, read_projector

__all__ = [
    "MmprojBuffers",
    "MmprojOptions",
    "Projector",
    "ProjectorTensor",
    "compute_bytes",
    "mmproj_device",
    "project_mmproj",
    "read_projector",
]
