"""The backend scheduler (``ggml_backend_sched_split_graph``): backend assignment, splits, copies
of split inputs, op offload."""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter

from offload_planner.core.compute.ggml import INPUT, OUTPUT, VIEW_OPS, Graph, T
from offload_planner.core.devices import DeviceKind

#: Minimum batch at which a backend takes an op whose weight is in host memory (``offload_op``,
#: ``GGML_OP_OFFLOAD_MIN_BATCH`` default 32); absent: the backend never offloads (RPC has no
#: ``offload_op``).  Batch is ``get_op_batch_size``: rows of the output, n_tokens for MUL_MAT_ID/ROPE.
OP_OFFLOAD_MIN_BATCH: dict[DeviceKind, int] = {
    DeviceKind.CUDA: 32, DeviceKind.ROCM: 32, DeviceKind.SYCL: 32, DeviceKind.VULKAN: 32,
    DeviceKind.METAL: 32,
}
#: Backends that offload only some ops (Metal: matrix multiplications).
OP_OFFLOAD_ONLY: dict[DeviceKind, frozenset[str]] = {
    DeviceKind.METAL: frozenset({"MUL_MAT", "MUL_MAT_ID"}),
}
#: Devices whose graph allocator pads quantized rows to 512 elements (MATRIX_ROW_PADDING) and
#: whose flash attention allocates f16 copies of quantized K/V.
CUDA_LIKE = frozenset({DeviceKind.CUDA, DeviceKind.ROCM})
#: Devices that support async compute and events (needed for pipeline parallelism).
ASYNC_EVENTS = frozenset({DeviceKind.CUDA, DeviceKind.ROCM, DeviceKind.RPC, DeviceKind.SYCL,
                          DeviceKind.VULKAN, DeviceKind.METAL})
N_COPIES_PIPELINE = 4  # GGML_SCHED_MAX_COPIES
_bid = attrgetter("bid")


# --- the scheduler (ggml_backend_sched_split_graph) -------------------------------------------------


@dataclass(frozen=True)
class Backend:
    name: str  # device name (CPU last)
    buft: str  # buffer type name as logged (CPU backend: the first GPU's host buffer, or CPU)
    alignment: int
    cuda_like: bool = False
    offload_min_batch: int | None = None
    offload_only: frozenset[str] | None = None

    def __hash__(self) -> int:
        """The dataclass's hash of every field, kept (each projection looks its references up by keys
        holding the backends, twice per reserve)."""
        h: int | None = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.name, self.buft, self.alignment, self.cuda_like, self.offload_min_batch,
                      self.offload_only))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict[str, object]:
        """Pickled without the kept hash (another process hashes strings with another seed)."""
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def offloads(self, op: T) -> bool:
        """``ggml_backend_offload_op``: take an op whose weight sits in host memory."""
        if self.offload_min_batch is None:
            return False
        if self.offload_only is not None and op.op not in self.offload_only:
            return False
        return _batch_size(op) >= self.offload_min_batch


@dataclass
class Split:
    backend: int
    i_start: int
    i_end: int = 0
    inputs: list[T] = field(default_factory=list)


def _bare(like: T, op: str, name: str, flags: int, view_src: T | None, view_offs: int, src: list[T | None]
          ) -> T:
    """A new tensor of ``like``'s type, shape and strides, as ``T(...)`` makes it, without its checks."""
    t = T.__new__(T)
    t.type, t.ne, t.nb, t.op, t.name, t.flags = like.type, list(like.ne), list(like.nb), op, name, flags
    t.src, t.view_src, t.view_offs = src, view_src, view_offs
    t.dev, t.weights, t.bid, t.n_children, t.n_views, t.alloc = None, False, -1, 0, 0, None
    return t


def _batch_size(t: T) -> int:
    """``get_op_batch_size`` of the CUDA backend."""
    if t.op == "GET_ROWS":
        return 0
    if t.op == "MUL_MAT":
        return t.ne[1]
    if t.op in ("MUL_MAT_ID", "ROPE"):
        return t.ne[2]
    return t.ne[1] * t.ne[2] * t.ne[3]


class Scheduler:
    def __init__(self, backends: list[Backend], n_copies: int, op_offload: bool = True) -> None:
        self.backends = backends
        self.ids: dict[str, int] = {}
        for i, b in enumerate(backends):  # a device named twice: its first backend (the highest
            self.ids.setdefault(b.name, i)  # priority, ggml_backend_sched_backend_from_buffer)
        #: the backend a forced tensor (``ggml_backend_sched_set_tensor_backend``) lands on: a device
        #: named twice, its last (llama-context.cpp graph_get_cb loops over every backend of the
        #: layer's device without a break)
        self.forced_ids = {b.name: i for i, b in enumerate(backends)}
        self.cpu = len(backends) - 1
        self.shared = len(self.ids) < len(backends)
        if self.shared:
            self.supports = self._supports_shared  # type: ignore[method-assign]
        self.n_copies = n_copies
        self.op_offload = op_offload
        self.splits: list[Split] = []
        self.copies: dict[tuple[int, int], list[T]] = {}  # (id(tensor), backend) -> copies
        self.nodes: list[T] = []
        self.node_ids: list[int] = []
        self.leafs: list[T] = []
        self.leaf_ids: list[int] = []

    # buffer helpers

    def from_buffer(self, t: T) -> int:
        vs = t.view_src
        loc = t.dev if vs is None else vs.dev  # t.location
        return -1 if loc is None else self.ids.get(loc, self.cpu)

    def supports(self, t: T, b: int) -> bool:
        """``ggml_backend_sched_buffer_supported``: the tensor's data is in backend b's memory."""
        vs = t.view_src
        loc = t.dev if vs is None else vs.dev  # t.location
        if loc is not None:
            return self.ids.get(loc, self.cpu) == b
        bid = t.bid if t.bid != -1 or t.view_src is None else t.view_src.bid
        return bid == b

    def _supports_shared(self, t: T, b: int) -> bool:
        """:meth:`supports` where two backends have one buffer type (a device named twice): a tensor in
        (or bound to) either is in both's memory (``ggml_backend_sched_buffer_supported`` asks the
        backend whether it supports the buffer's type, ggml-backend.cpp)."""
        vs = t.view_src
        loc = t.dev if vs is None else vs.dev
        if loc is not None:
            at = self.ids.get(loc, self.cpu)
        else:
            at = t.bid if t.bid != -1 or vs is None else vs.bid
            if at == -1:
                return False
        return self.backends[at].buft == self.backends[b].buft

    def backend_of(self, t: T) -> int:
        bid = self.from_buffer(t)
        if bid != -1:
            return bid
        if t.flags & INPUT:
            return self.cpu
        if t.op in ("ROPE", "FLASH_ATTN_EXT"):
            return -1
        for s in t.src:
            if s is not None and s.weights:
                sb = self.from_buffer(s)
                if self.op_offload and sb == self.cpu:
                    for b in range(self.cpu):
                        if self.backends[b].offloads(t):
                            return b
                return sb
        return -1

    # passes

    def split_graph(self, g: Graph, *, keep_forced: bool = True) -> None:
        """``keep_forced=False``: ``ggml_backend_sched_reserve_size`` (the no-alloc dry run of
        llama-fit-params and --fit) resets the scheduler first, dropping set_tensor_backend calls."""
        forced = g.forced if keep_forced else {}
        for t in g.leafs + g.nodes:
            t.bid = self.forced_ids[forced[id(t)]] if id(t) in forced else -1
        for t in g.leafs + g.nodes:
            if t.bid == -1:
                t.bid = self.backend_of(t)
        self.expand(g.nodes)
        self.pass3(g.nodes)
        self.pass4(g.nodes)
        self._pass5(g.nodes)
        self.build_copy(g)

    def expand(self, nodes: list[T]) -> None:
        real = [n for n in nodes if n.op not in VIEW_OPS]
        for order, skip_cpu in ((real, True), (real[::-1], True), (real, False), (real[::-1], False)):
            cur = -1
            for n in order:
                if n.bid != -1:
                    cur = -1 if (skip_cpu and n.bid == self.cpu) else n.bid
                elif cur != -1:
                    n.bid = cur

    def pass3(self, nodes: list[T]) -> None:
        shared = self.shared
        for n in nodes:
            if n.op in VIEW_OPS:
                continue
            if n.bid != -1:
                if shared:
                    self._upgrade(n)
                continue
            best = -1
            for b in range(len(self.backends)):
                cnt = sum(1 for s in n.src if s is not None
                          and (s.bid != -1 or (s.view_src is not None and s.view_src.bid != -1))
                          and self.supports(s, b))
                if cnt > best:
                    best, n.bid = cnt, b

    def _upgrade(self, n: T) -> None:
        """Pass 3's upgrade of an assigned node to a higher-priority backend of the same buffer type
        whose memory holds every source (ggml-backend.cpp 1382-1400): only two backends of one device
        (a device named twice) share a buffer type here."""
        cur = self.backends[n.bid].buft
        for b in range(n.bid):
            if self.backends[b].buft == cur and all(s is None or self.supports(s, b) for s in n.src):
                n.bid = b
                return

    def pass4(self, nodes: list[T]) -> None:
        for n in nodes:
            if n.view_src is not None and n.bid == -1:
                n.bid = n.view_src.bid
            for s in n.src:
                if s is not None and s.bid == -1:
                    s.bid = s.view_src.bid if s.view_src is not None else n.bid
            if n.bid == -1:
                n.bid = 0

    def _pass5(self, nodes: list[T]) -> None:
        first = next((k for k, n in enumerate(nodes) if n.op not in VIEW_OPS), len(nodes))
        split = Split(nodes[first].bid if first < len(nodes) else self.cpu, 0)
        self.splits = [split]
        cur = split.backend
        for i in range(first, len(nodes)):
            n = nodes[i]
            if n.op in VIEW_OPS:
                continue
            need_new = n.bid == cur and bool(split.inputs) and any(
                s is not None and s.weights and s.bid != cur and not self.supports(s, cur) for s in n.src)
            if n.bid != cur or need_new:
                split.i_end = i
                split = Split(n.bid, i)
                self.splits.append(split)
                cur = n.bid
            for j, s in enumerate(n.src):
                if s is None or s.bid == cur or self.supports(s, cur):
                    continue
                key = (id(s), cur)
                if key not in self.copies:
                    self.copies[key] = [self.input_copy(s, c) for c in range(self.n_copies)]
                    split.inputs.append(s)
                n.src[j] = self.copies[key][0]
        split.i_end = len(nodes)

    def input_copy(self, s: T, c: int) -> T:
        """A split input's copy: ``T(s.type, s.ne, name=...)`` with ``s``'s strides, made field by field
        (a kept graph's dry run with the experts on the host makes hundreds)."""
        return _bare(s, "NONE", f"{s.name}#{c}", INPUT | OUTPUT if self.n_copies > 1 else 0, None, 0, [])

    def build_copy(self, g: Graph) -> None:
        graph_inputs: list[T] = []
        if self.n_copies > 1:
            for leaf in g.leafs:
                if leaf.flags & INPUT:
                    leaf.flags |= OUTPUT
                    copies = [leaf] + [self.input_copy(leaf, c) for c in range(1, self.n_copies)]
                    self.copies[(id(leaf), leaf.bid)] = copies
                    graph_inputs.append(leaf)
        for sp in self.splits:
            for inp in sp.inputs:
                # view_tensor(inp, "NONE", inp), field by field
                vs, offs = (inp, 0) if inp.view_src is None else (inp.view_src, inp.view_offs)
                dep = _bare(inp, "NONE", "", 0, vs, offs, [inp])
                self.nodes.append(dep)
                self.node_ids.append(inp.bid)
                self.nodes.append(self.copies[(id(inp), sp.backend)][0])
                self.node_ids.append(sp.backend)
            seg = g.nodes[sp.i_start:sp.i_end]
            self.nodes.extend(seg)
            self.node_ids.extend(map(_bid, seg))
        if self.n_copies > 1:
            for inp in graph_inputs:
                for c in self.copies[(id(inp), inp.bid)]:
                    self.leafs.append(c)
                    self.leaf_ids.append(inp.bid)
            for sp in self.splits:
                for inp in sp.inputs:
                    for c in self.copies[(id(inp), sp.backend)]:
                        self.leafs.append(c)
                        self.leaf_ids.append(sp.backend)
        for leaf in g.leafs:
            self.leafs.append(leaf)
            self.leaf_ids.append(leaf.bid)


