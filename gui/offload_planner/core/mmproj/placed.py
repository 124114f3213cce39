"""The projector's tensors as placed tensors, for views that list a plan's tensors (the tensor map).

clip.cpp loads every projector tensor into one buffer on one device: the user moves the projector
as a whole with ``--no-mmproj-offload`` (CPU), ``-mmdev`` or ``--device``, never tensor by tensor,
so these items carry :data:`MMPROJ_RULE` and are not movable.
"""

from __future__ import annotations

import re

from offload_planner.core.devices import DeviceSet
from offload_planner.core.mmproj.attach import MmprojSetup, already_read, load_projector
from offload_planner.core.mmproj.buffers import mmproj_device
from offload_planner.core.model import Tensor
from offload_planner.core.placement import CPU, Placed
from offload_planner.core.roles import Role

MMPROJ_RULE = "--mmproj"
NOT_MOVABLE = ("the projector is one buffer on one device: --no-mmproj-offload puts it on the CPU, "
               "-mmdev (or the first --device) picks the GPU")
_BLOCK = re.compile(r"^v\.blk\.(\d+)\.([^.]+)")
_ROLES = {
    "attn_q": Role.ATTENTION, "attn_k": Role.ATTENTION, "attn_v": Role.ATTENTION,
    "attn_out": Role.ATTENTION, "attn_qkv": Role.ATTENTION,
    "ffn_up": Role.FFN_DENSE, "ffn_down": Role.FFN_DENSE, "ffn_gate": Role.FFN_DENSE,
    "ln1": Role.ATTN_NORM, "ln2": Role.FFN_NORM,
}


def projector_block(name: str) -> int | None:
    """``v.blk.7.attn_q.weight`` -> 7; tensors outside the blocks -> None."""
    m = _BLOCK.match(name)
    return int(m.group(1)) if m else None


def projector_role(name: str) -> Role:
    m = _BLOCK.match(name)
    if m:
        return _ROLES.get(m.group(2), Role.OTHER)
    return Role.OUTPUT_NORM if "norm" in name or "_ln" in name else Role.OTHER


def projector_placed(setup: MmprojSetup, devices: DeviceSet, *, read: bool = True) -> list[Placed]:
    """Every projector tensor on the projector's device (its buffer type as llama.cpp names it);
    ``read=False``: only a projector some projection has read already (none otherwise)."""
    proj = load_projector(setup.location) if read else already_read(setup.location)
    if proj is None:
        return []
    gpu = mmproj_device(devices, setup.options(None))
    dev, buft = (gpu.name, gpu.buffer_type) if gpu is not None else (CPU, CPU)
    rule = f"{MMPROJ_RULE} {proj.name}: clip loads it on {dev}"
    return [Placed(Tensor(t.name, t.shape, t.type, t.nbytes, 0, 0, None, projector_role(t.name)),
                   dev, buft, rule) for t in proj.tensors]
