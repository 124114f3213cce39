"""What llama-server logs while loading a multimodal projector (``tools/mtmd/clip.cpp``).

``clip_ctx: CLIP using RPC0[127.0.0.1:50052] backend`` (or ``CPU backend``), ``load_hparams: model
size: 1.74 MiB`` (the unpadded sum of its tensors), per buffer type ``reserve_compute_meta: <buft>
compute buffer size = X MiB`` (only buffers above 1 byte), ``graph splits = S, nodes = N`` and
``warmup: flash attention is enabled|disabled``.  The last reserve wins (flash attention auto may
reserve twice).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_BACKEND = re.compile(r"clip_ctx: CLIP using (?:(?P<name>\S+) backend|CPU backend)")
_MODEL = re.compile(r"load_hparams: model size:\s+(?P<mib>[\d.]+) MiB")
_COMPUTE = re.compile(r"reserve_compute_meta:\s+(?P<buft>\S+) compute buffer size =\s+(?P<mib>[\d.]+) MiB")
_GRAPH = re.compile(r"reserve_compute_meta: graph splits = (?P<splits>\d+), nodes = (?P<nodes>\d+)")
_FA = re.compile(r"warmup: flash attention is (?P<state>enabled|disabled)")


@dataclass
class ClipLoad:
    backend: str | None = None  # the buffer type name of the projector's device; "CPU"
    model_mib: float | None = None
    compute_mib: dict[str, float] = field(default_factory=dict)
    n_splits: int | None = None
    n_nodes: int | None = None
    flash_attn: bool | None = None


def parse_clip_log(lines: Iterable[str]) -> ClipLoad:
    out = ClipLoad()
    pending: dict[str, float] = {}
    for line in lines:
        if m := _BACKEND.search(line):
            out.backend = m["name"] or "CPU"
        elif m := _MODEL.search(line):
            out.model_mib = float(m["mib"])
        elif m := _COMPUTE.search(line):
            pending[m["buft"]] = float(m["mib"])
        elif m := _GRAPH.search(line):
            out.compute_mib, pending = pending, {}
            out.n_splits, out.n_nodes = int(m["splits"]), int(m["nodes"])
        elif m := _FA.search(line):
            out.flash_attn = m["state"] == "enabled"
    return out
