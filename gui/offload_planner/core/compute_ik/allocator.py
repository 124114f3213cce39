"""ik's graph allocator: the older ``ggml-alloc.c`` in-place rules."""

from __future__ import annotations

from offload_planner.core.compute.allocator import GraphAllocator
from offload_planner.core.compute.ggml import T, nbytes, row_size

#: ``ggml_op_can_inplace`` of ik's ggml-alloc.c.
IK_INPLACE_OPS = frozenset({
    "SCALE", "DIAG_MASK_ZERO", "DIAG_MASK_INF", "ADD", "ADD1", "SUB", "MUL", "DIV", "SQR", "SQRT", "LOG",
    "UNARY", "ROPE", "RMS_NORM", "SOFT_MAX",
})


class IkGraphAllocator(GraphAllocator):
    """ik's ``ggml_gallocr``: the mainline walk with ik's (older) list of ops that may run in place,
    and an in-place child keeps its whole parent (no tail given back)."""

    inplace_ops = IK_INPLACE_OPS
    frees_tail = False

    def size(self, t: T, bid: int) -> int:
        size = nbytes(t)
        if self.backends[bid].cuda_like and t.type.quantized and t.ne[0] % 512:
            size += row_size(t.type, 512 - t.ne[0] % 512)
        return size
