"""The graph allocator (``ggml-alloc.c``): ``ggml_dyn_tallocr`` and ``ggml_gallocr``."""

from __future__ import annotations

from offload_planner.core.compute.ggml import (
    F16,
    INPLACE_OPS,
    INPUT,
    OUTPUT,
    T,
    nbytes,
    nelements,
    row_size,
    same_layout,
)
from offload_planner.core.compute.scheduler import Backend

# --- the graph allocator (ggml-alloc.c) -----------------------------------------------------------


class DynAllocator:
    """``ggml_dyn_tallocr`` with one chunk (no backend here has a maximum buffer size)."""

    def __init__(self, alignment: int) -> None:
        self.alignment = alignment
        self.blocks: list[list[int]] = [[0, 1 << 62]]  # [offset, size], sorted by offset
        self.max_size = 0

    def align(self, size: int) -> int:
        return -(-size // self.alignment) * self.alignment

    def alloc(self, size: int) -> int:
        a = self.alignment
        size = -(-size // a) * a
        blocks = self.blocks
        last = len(blocks) - 1
        best, best_size = last, -1  # the last block always fits
        for i in range(last):  # best fit; of equal blocks the last
            bsize = blocks[i][1]
            if bsize >= size and (best_size < 0 or bsize <= best_size):
                best, best_size = i, bsize
        block = blocks[best]
        offset = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del blocks[best]
        if offset + size > self.max_size:
            self.max_size = offset + size
        return offset

    def apply(self, events: list[tuple[int, T, T, int, int, str]], own: dict[T, int], label: str) -> str:
        """Recorded events (``(0 alloc, t, t, size, 0, peak label) | (1 in place, t, parent, psize,
        nsize, "") | (2 free, t, t, size, 0, "")``) on this allocator, ``own`` holding the offsets;
        returns the peak label.  ``alloc`` and ``free`` inlined: the incremental replay's hot loop."""
        a, blocks, mx, pop = self.alignment, self.blocks, self.max_size, own.pop
        for kind, t, p, x, y, lab in events:
            if kind == 0:
                size = -(-x // a) * a
                last = len(blocks) - 1
                best, best_size = last, -1
                for i in range(last):
                    bsize = blocks[i][1]
                    if bsize >= size and (best_size < 0 or bsize <= best_size):
                        best, best_size = i, bsize
                block = blocks[best]
                off = own[t] = block[0]
                block[0] += size
                block[1] -= size
                if block[1] == 0:
                    del blocks[best]
                if off + size > mx:
                    mx, label = off + size, lab
                continue
            if kind == 2:
                off, size = pop(t), -(-x // a) * a
            else:
                off = own[t] = pop(p)
                if x <= y:
                    continue
                off, size = off + y, -(-(x - y) // a) * a
            end = off + size
            for i, block in enumerate(blocks):  # free(off, size); sorted, so none after one past end
                b0 = block[0]
                if b0 + block[1] == off:
                    block[1] += size
                    if i + 1 < len(blocks) and b0 + block[1] == blocks[i + 1][0]:
                        block[1] += blocks[i + 1][1]
                        del blocks[i + 1]
                    break
                if end == b0:
                    block[0] = off
                    block[1] += size
                    if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == off:
                        blocks[i - 1][1] += block[1]
                        del blocks[i]
                    break
                if b0 > end:
                    blocks.insert(i, [off, size])
                    break
            else:
                blocks.append([off, size])
        self.max_size = mx
        return label

    def free(self, offset: int, size: int) -> None:
        a = self.alignment
        size = -(-size // a) * a
        blocks = self.blocks
        end = offset + size
        for i, block in enumerate(blocks):
            b0 = block[0]
            if b0 + block[1] == offset:
                block[1] += size
                if i + 1 < len(blocks) and b0 + block[1] == blocks[i + 1][0]:
                    block[1] += blocks[i + 1][1]
                    del blocks[i + 1]
                return
            if end == b0:
                block[0] = offset
                block[1] += size
                if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == offset:
                    blocks[i - 1][1] += block[1]
                    del blocks[i]
                return
        pos = 0
        while pos < len(blocks) and blocks[pos][0] < offset:
            pos += 1
        blocks.insert(pos, [offset, size])


class GraphAllocator:
    """``ggml_gallocr_alloc_graph_impl`` over the scheduler's graph copy.

    ``inplace_ops``: the ops that may take over a dying parent's memory; ``frees_tail``: a parent
    larger than its in-place child gives the rest back (newer ggml-alloc)."""

    inplace_ops: frozenset[str] = INPLACE_OPS
    frees_tail = True

    def __init__(self, backends: list[Backend]) -> None:
        self.backends = backends
        # backends of one buffer type share its allocator (a device named twice: ``-dev RPC0,RPC0``):
        # ggml_gallocr_new_n "reuse the same allocator", ggml-alloc.c 515-521
        by_buft: dict[str, DynAllocator] = {}
        self.allocs = []
        for b in backends:
            if b.buft not in by_buft:
                by_buft[b.buft] = DynAllocator(b.alignment)
            self.allocs.append(by_buft[b.buft])
        self.own: set[int] = set()
        self.peaks = [""] * len(backends)
        self.where = ""  # the peak label before the walk (the leafs and inputs of the counting pass)
        self.cur: T | None = None  # the node being processed (its label: ``peak_label``)
        self.layer = ""  # " (layer N)" of the last node named for a layer

    def size(self, t: T, bid: int) -> int:
        size = nbytes(t)
        be = self.backends[bid]
        if be.cuda_like:
            if t.op == "FLASH_ATTN_EXT":
                size = cuda_fa_alloc_size(t)
            if t.type.quantized and t.ne[0] % 512:
                size += row_size(t.type, 512 - t.ne[0] % 512)
        return size

    def allocate(self, t: T, bid: int) -> None:
        # allocated (pre-allocated data or galloc-owned) or a view: nothing to do
        if t.view_src is not None or t.dev is not None or id(t) in self.own:
            return
        if t.op in self.inplace_ops:
            for p in t.src:
                if p is None or id(p) not in self.own or p.flags & OUTPUT:
                    continue
                if p.view_src is not None and p.view_src.flags & OUTPUT:
                    continue
                if not same_layout(t, p) or p.n_children != 1 or p.n_views != 0:
                    continue
                if p.view_src is not None:
                    continue  # a view parent is never galloc-owned (dead branch in ggml-alloc.c)
                assert p.alloc is not None
                t.alloc = p.alloc
                self.own.discard(id(p))
                self.own.add(id(t))
                if not self.frees_tail:
                    return
                pb, poff = p.alloc
                psize, nsize = self.size(p, pb), self.size(t, bid)
                al = self.allocs[pb]
                psize, nsize = al.align(psize), al.align(nsize)
                self.on_inplace(t, p, pb, psize, nsize)
                if psize > nsize:
                    al.free(poff + nsize, psize - nsize)
                return
        al = self.allocs[bid]
        before = al.max_size
        size = self.size(t, bid)
        self.on_alloc(t, bid, size)
        t.alloc = (bid, al.alloc(size))
        self.own.add(id(t))
        if al.max_size > before:
            self.peaks[bid] = self.where if self.cur is None else peak_label(self.cur, self.layer)

    def free(self, t: T) -> None:
        if t.flags & OUTPUT or t.alloc is None:
            return
        bid, off = t.alloc
        size = self.size(t, bid)
        self.on_free(t, bid, size)
        self.allocs[bid].free(off, size)
        self.own.discard(id(t))

    # what a recording subclass sees of the walk (the incremental replay's events); nothing here

    def on_alloc(self, t: T, bid: int, size: int) -> None:
        """``t`` gets a new block of ``size`` bytes on backend ``bid``."""

    def on_inplace(self, t: T, p: T, bid: int, psize: int, nsize: int) -> None:
        """``t`` takes over its dying parent ``p``'s block on ``bid`` (aligned sizes)."""

    def on_free(self, t: T, bid: int, size: int) -> None:
        """``t``'s block of ``size`` bytes on ``bid`` is given back."""

    def count(self, nodes: list[T], node_ids: list[int], leafs: list[T], leaf_ids: list[int]) -> int:
        """Reset the child/view counts, allocate the leafs, then the counting pass (which allocates
        graph inputs as it meets them); returns how many tensors the counting pass allocated."""
        for t in nodes + leafs:
            t.n_children = t.n_views = 0
        for leaf, bid in zip(leafs, leaf_ids, strict=True):
            self.allocate(leaf, bid)
        n_own = len(self.own)
        for n, bid in zip(nodes, node_ids, strict=True):
            if n.view_src is not None and n.op != "NONE":
                n.view_src.n_views += 1
            if n.flags & INPUT:
                self.allocate(n, bid)
            for s in n.src:
                if s is None:
                    continue
                s.n_children += 1
                if s.flags & INPUT:
                    self.allocate(s, bid)
        return len(self.own) - n_own

    def step(self, n: T, bid: int) -> None:
        """One node of the allocation walk: its sources and itself allocated, then every parent
        whose last child or view this was freed."""
        self.enter(n)
        own, allocate = self.own, self.allocate
        src = n.src
        for s in src:  # what ``allocate`` returns at once for (allocated, a view) is not called
            if s is not None and s.view_src is None and s.dev is None and id(s) not in own:
                allocate(s, bid)
        allocate(n, bid)
        for p in src:
            if p is None:
                continue
            p.n_children -= 1
            if p.n_children or p.n_views:
                continue
            vs = p.view_src
            if vs is not None:
                vs.n_views -= 1
                if vs.n_views == 0 and vs.n_children == 0 and id(vs) in own:
                    self.free(vs)
            elif id(p) in own:
                self.free(p)

    def enter(self, n: T) -> None:
        """The walk reaches node ``n``: the layer it names (if any) and the node the peaks are
        labelled with (``peak_label``, made only when a peak moves)."""
        il = layer_suffix(n.name)
        if il is not None:
            self.layer = f" (layer {il})"
        self.cur = n

    def run(self, nodes: list[T], node_ids: list[int], leafs: list[T], leaf_ids: list[int]) -> list[int]:
        self.count(nodes, node_ids, leafs, leaf_ids)
        for n, bid in zip(nodes, node_ids, strict=True):
            self.step(n, bid)
        return buffer_sizes(self.allocs)


def buffer_sizes(allocs: list[DynAllocator]) -> list[int]:
    """Each backend's buffer size: an allocator's size the first time it appears, 0 where a backend
    shares an earlier one's (``ggml_gallocr_get_buffer_size``, ggml-alloc.c 1102-1113: "only return
    the buffer size the first time it appears to avoid double counting")."""
    seen: set[int] = set()
    out = []
    for a in allocs:
        out.append(0 if id(a) in seen else a.max_size)
        seen.add(id(a))
    return out


def shares_allocators(backends: list[Backend]) -> bool:
    """Two backends of one buffer type (a device named twice), whose allocator they share: the
    incremental replay and the layer jumps keep one allocator a backend, so such a graph is walked
    plainly."""
    return len({b.buft for b in backends}) < len(backends)


def layer_suffix(name: str) -> str | None:
    """The layer number ``LAYER_SUFFIX`` finds at the end of a tensor name (``-N``), without the regex."""
    _, sep, tail = name.rpartition("-")
    if sep and tail.isdecimal():
        return tail
    return None


def peak_label(n: T, layer: str) -> str:
    """What a backend's peak is reported at: the op (or the copy) and its layer."""
    return f"{n.op if n.op != 'NONE' else 'copy of ' + (n.name or 'an input')}{layer}"


def cuda_fa_alloc_size(t: T) -> int:
    """``ggml_cuda_flash_attn_ext_get_alloc_size``: tile/MMA kernels (batches > 1) convert quantized
    K and V to f16 right after the output."""
    q, k, v = t.src[0], t.src[1], t.src[2]
    assert q is not None and k is not None and v is not None
    end = nbytes(t)
    if q.ne[1] <= 1:
        return end
    if k.type is not F16:
        end = -(-end // 128) * 128 + nelements(k) * 2
    v_is_k = v.view_src is not None and (v.view_src is k or (v.view_src is k.view_src
                                                            and v.view_offs == k.view_offs))
    if v.type is not F16 and not v_is_k:
        end = -(-end // 128) * 128 + nelements(v) * 2
    return end


