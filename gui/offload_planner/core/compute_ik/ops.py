"""ik_llama.cpp's own ggml ops on :class:`compute.T` shapes (fused ops, casts, KV-view copies)
and its KQ mask padding."""

from __future__ import annotations

from offload_planner.core.compute.ggml import F32, I32, T, view
from offload_planner.core.ggml_types import GGMLType

KQ_MASK_PAD = 16  # GGML_KQ_MASK_PAD in ik's ggml.h
KQ_MASK_PAD_2025 = 32  # ... before July 2025 (PR 574 made it 64, PR 825 of October 2025 16)


def new(type_: GGMLType, ne: list[int], op: str, *src: T | None) -> T:
    return T(type_, ne, op=op, src=src)


def dup(a: T, op: str, *src: T | None) -> T:
    return T(a.type, a.ne, op=op, src=src or (a,))


def cast(a: T, type_: GGMLType) -> T:
    """``ggml_cast``: a CPY node that is its own second source."""
    t = T(type_, a.ne, op="CPY", src=(a,))
    t.src.append(t)
    return t


def cpy(a: T, dst: T) -> T:
    """``ggml_cpy``: a view of the destination (a KV cache view: nothing to allocate)."""
    t = T(dst.type, dst.ne, op="CPY", src=(a, dst), view_src=dst)
    t.nb = list(dst.nb)
    return t


def repeat(a: T, ne: list[int]) -> T:
    return new(a.type, ne, "REPEAT", a)


def cont(a: T, *ne: int) -> T:
    return T(a.type, ne or a.ne, op="CONT", src=(a,))


def view2(a: T, ne0: int, ne1: int, nb1: int, offset: int) -> T:
    return view(a, [ne0, ne1], [nb1], offset)


def view3(a: T, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int, offset: int) -> T:
    return view(a, [ne0, ne1, ne2], [nb1, nb2], offset)


def flash_attn(q: T, k: T, v: T, mask: T | None, sinks: T | None = None) -> T:
    return new(F32, [v.ne[0], q.ne[2], q.ne[1], q.ne[3]], "FLASH_ATTN_EXT", q, k, v, mask, sinks)


def top_k(a: T, k: int) -> T:
    s = new(I32, list(a.ne), "ARGSORT", a)
    return view(s, [k, s.ne[1], s.ne[2], s.ne[3]], s.nb[1:4], 0)
