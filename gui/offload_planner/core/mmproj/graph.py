"""The projector's warmup graph in the planner's mini ggml (``tools/mtmd/clip.cpp`` + ``models/siglip.cpp``).

``clip_graph::build_inp`` (the patch convolution as ``im2col`` + ``mul_mat``), ``build_vit`` (learned
position embeddings, layer-normed blocks with separate biased q/k/v, ``build_attn`` with or without
flash attention, a GELU FFN, the post layer norm) and the Gemma 3 tail (a transpose, an average
``pool_2d`` of ``n_merge``, an RMS norm and the input projection through a contiguous copy of the
transposed weight), built node for node so the scheduler and graph allocator see what llama.cpp's
do when ``reserve_compute_meta`` reserves the warmup image (``image_size`` square, one image).
"""

from __future__ import annotations

from collections.abc import Callable

from offload_planner.core.compute.ggml import (
    F16,
    F32,
    I32,
    Graph,
    T,
    concat,
    cont,
    dup_op,
    flash_attn_ext,
    get_rows,
    input_tensor,
    mul_mat,
    new,
    permute,
    reshape,
    soft_max_ext,
    transpose,
    view,
)
from offload_planner.core.errors import PlannerError
from offload_planner.core.mmproj.projector import Projector

Weight = Callable[[str], T | None]


def _cast(a: T, type_: object) -> T:
    """``ggml_cast``: a CPY into a new tensor whose second source is itself."""
    t = T(type_, a.ne, op="CPY", src=(a,))  # type: ignore[arg-type]
    t.src.append(t)
    return t


def _named(t: T, name: str) -> T:
    t.name = name
    return t


class _Vit:
    def __init__(self, proj: Projector, weight: Weight, flash_attn: bool, size: int) -> None:
        self.p = proj
        self.w = weight
        self.fa = flash_attn
        self.size = size  # the warmup image's side
        self.g = Graph()

    def req(self, name: str) -> T:
        t = self.w(name)
        if t is None:
            raise PlannerError(f"{self.p.name}: projector tensor {name!r} is missing")
        return t

    def add_opt(self, cur: T, name: str) -> T:
        b = self.w(name)
        return cur if b is None else dup_op(cur, "ADD", cur, b)

    def norm(self, cur: T, prefix: str, il: int, op: str = "NORM") -> T:
        cur = dup_op(cur, op, cur)
        w = self.w(f"{prefix}.weight")
        if w is not None:
            cur = dup_op(cur, "MUL", cur, w)
        cur = self.add_opt(cur, f"{prefix}.bias")
        return _named(cur, f"norm-{il}") if il >= 0 else cur

    def raw(self) -> T:
        return input_tensor(F32, [self.size, self.size, 3, 1], "inp_raw")

    def conv2d(self, a: T, raw: T) -> T:
        """``ggml_conv_2d`` with stride = kernel = patch size: im2col, mul_mat, permute."""
        n_side = self.size // self.p.patch_size
        col_t = F32 if a.type.name == "bf16" else F16
        kk = a.ne[0] * a.ne[1] * a.ne[2]
        im2col = new(col_t, [kk, n_side, n_side, 1], "IM2COL", a, raw)
        res = mul_mat(reshape(im2col, kk, n_side * n_side), reshape(a, kk, a.ne[3]))
        res = reshape(res, n_side, n_side, 1, a.ne[3])
        return cont(permute(res, 0, 1, 3, 2))

    def dual_patch_embd(self) -> T:
        """Qwen2/3-VL: the image through the two patch-embedding kernels (the two frames of a
        temporal patch), added."""
        raw = self.raw()
        c0 = self.conv2d(self.req("v.patch_embd.weight"), raw)
        return dup_op(c0, "ADD", c0, self.conv2d(self.req("v.patch_embd.weight.1"), raw))

    def inp(self) -> T:
        p = self.p
        n_side = self.size // p.patch_size
        res = self.conv2d(self.req("v.patch_embd.weight"), self.raw())
        cur = reshape(res, n_side * n_side, p.n_embd, 1)
        cur = cont(transpose(cur))
        return self.add_opt(cur, "v.patch_embd.bias")

    def attn(self, q_cur: T, k_cur: T, v_cur: T, il: int, mask: T | None = None) -> T:
        for t in (q_cur, k_cur, v_cur):
            self.g.expand(t)  # ggml_build_forward_order
        q = permute(q_cur, 0, 2, 1, 3)
        k = permute(k_cur, 0, 2, 1, 3)
        if self.fa:
            v = permute(v_cur, 0, 2, 1, 3)
            k, v = _cast(k, F16), _cast(v, F16)
            cur = flash_attn_ext(q, k, v, _cast(mask, F16) if mask is not None else None, None)
            cur = reshape(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        else:
            v = cont(permute(v_cur, 1, 2, 0, 3))
            kq = soft_max_ext(mul_mat(k, q), mask, None)
            kqv = mul_mat(v, kq)
            cur = permute(kqv, 0, 2, 1, 3)
            cur = cont(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        cur = _named(mul_mat(self.req(f"v.blk.{il}.attn_out.weight"), cur), f"attn_out-{il}")
        return self.add_opt(cur, f"v.blk.{il}.attn_out.bias")

    def qkv(self, cur: T, which: str, il: int) -> T:
        p = self.p
        t = mul_mat(self.req(f"v.blk.{il}.attn_{which}.weight"), cur)
        t = self.add_opt(t, f"v.blk.{il}.attn_{which}.bias")
        return reshape(t, p.n_embd // p.n_head, p.n_head, t.ne[1], 1)

    def ffn(self, cur: T, il: int, up: str = "", down: str = "") -> T:
        """``build_ffn``: up (+bias), gate (+bias) and a GLU, or the activation alone; down (+bias)."""
        b = f"v.blk.{il}"
        up, down = up or f"{b}.ffn_up", down or f"{b}.ffn_down"
        tmp = self.add_opt(mul_mat(self.req(f"{up}.weight"), cur), f"{up}.bias")
        gate = self.w(f"{b}.ffn_gate.weight") if il >= 0 else None
        if gate is not None:
            g = self.add_opt(mul_mat(gate, cur), f"{b}.ffn_gate.bias")
            cur = new(g.type, g.ne, "GLU", g, tmp)
        else:
            cur = _named(dup_op(tmp, "UNARY", tmp), f"ffn_{self.p.ffn_op}-{il}")
        cur = mul_mat(self.req(f"{down}.weight"), cur)
        return self.add_opt(cur, f"{down}.bias")

    def vit(self, inp: T) -> T:
        p = self.p
        pos = self.w("v.position_embd.weight")
        if pos is not None:
            inp = dup_op(inp, "ADD", inp, pos)
        inp_l = reshape(inp, p.n_embd, inp.ne[1])
        if self.w("v.pre_ln.weight") is not None:
            inp_l = self.norm(inp_l, "v.pre_ln", -1)
        for il in range(p.n_layer):
            b = f"v.blk.{il}"
            cur = self.norm(inp_l, f"{b}.ln1", il)
            q, k, v = (self.qkv(cur, x, il) for x in ("q", "k", "v"))
            cur = self.attn(q, k, v, il)
            cur = dup_op(cur, "ADD", cur, inp_l)
            inp_l = cur
            cur = self.norm(cur, f"{b}.ln2", il)
            cur = self.ffn(cur, il)
            inp_l = _named(dup_op(inp_l, "ADD", inp_l, cur), f"layer_out-{il}")
        if self.w("v.post_ln.weight") is not None:
            inp_l = self.norm(inp_l, "v.post_ln", -1)
        return reshape(inp_l, p.n_embd, inp_l.ne[1], 1)

    def gemma3_tail(self, cur: T) -> T:
        p = self.p
        side = self.size // p.patch_size
        cur = cont(transpose(cur), side, side, p.n_embd, 1)
        out = (side - p.n_merge) // p.n_merge + 1
        cur = new(F32, [out, out, cur.ne[2], cur.ne[3]], "POOL_2D", cur)
        cur = reshape(cur, out * out, p.n_embd, 1)
        cur = cont(transpose(cur))
        cur = dup_op(cur, "RMS_NORM", cur)
        cur = dup_op(cur, "MUL", cur, self.req("mm.soft_emb_norm.weight"))
        proj_w = cont(transpose(self.req("mm.input_projection.weight")))
        return mul_mat(proj_w, cur)


class _Qwen2VL(_Vit):
    """``models/qwen2vl.cpp`` (Qwen2.5-VL: RMS norms, windowed attention, M-RoPE, SwiGLU)."""

    def build(self) -> T:
        p = self.p
        npx = self.size // p.patch_size
        n_pos = npx * npx
        inp = self.dual_patch_embd()
        inp = permute(inp, 1, 2, 0, 3)
        inp = cont(inp, p.n_embd * 2, npx // 2, npx, 1)
        inp = reshape(inp, p.n_embd * 2, npx // 2, 2, npx // 2)
        inp = permute(inp, 0, 2, 1, 3)
        inp_l = cont(inp, p.n_embd, n_pos, 1)
        positions = input_tensor(I32, [n_pos * 4], "positions")
        mask: T | None = None
        if p.n_wa_pattern > 0:
            inv_idx = input_tensor(I32, [n_pos // 4], "inv_window_idx")
            mask = input_tensor(F32, [n_pos, n_pos], "window_mask")
            if self.fa:
                mask = _cast(mask, F16)
            inp_l = reshape(inp_l, p.n_embd * 4, n_pos // 4)
            inp_l = get_rows(inp_l, inv_idx)
            inp_l = reshape(inp_l, p.n_embd, n_pos, 1)
        d_head = p.n_embd // p.n_head
        norm = "RMS_NORM" if p.proj_type == "qwen2.5vl_merger" else "NORM"
        for il in range(p.n_layer):
            full = p.n_wa_pattern <= 0 or (il + 1) % p.n_wa_pattern == 0
            b = f"v.blk.{il}"
            cur = self.norm(inp_l, f"{b}.ln1", il, norm)
            q, k, v = (reshape(dup_op(t := mul_mat(self.req(f"{b}.attn_{x}.weight"), cur), "ADD", t,
                                      self.req(f"{b}.attn_{x}.bias")), d_head, p.n_head, n_pos)
                       for x in ("q", "k", "v"))
            q = dup_op(q, "ROPE", q, positions, None)
            k = dup_op(k, "ROPE", k, positions, None)
            cur = self.attn(q, k, v, il, None if full else mask)
            cur = dup_op(cur, "ADD", cur, inp_l)
            inp_l = cur
            cur = self.norm(cur, f"{b}.ln2", il, norm)
            cur = self.ffn(cur, il)
            inp_l = _named(dup_op(inp_l, "ADD", inp_l, cur), f"layer_out-{il}")
        if self.w("v.post_ln.weight") is not None:
            inp_l = self.norm(inp_l, "v.post_ln", p.n_layer, norm)
        emb = reshape(inp_l, p.n_embd * 4, n_pos // 4, 1)
        emb = self.ffn(emb, -1, "mm.0", "mm.2")
        if p.n_wa_pattern > 0:
            idx = input_tensor(I32, [n_pos // 4], "window_idx")
            emb = reshape(emb, p.projection_dim, n_pos // 4)
            emb = get_rows(emb, idx)
            emb = reshape(emb, p.projection_dim, n_pos // 4, 1)
        return emb


class _Qwen3VL(_Qwen2VL):
    """``models/qwen3vl.cpp``: biased patches, interpolated learned positions, fused qkv, deepstack."""

    def merge_order(self, t: T, npx: int) -> T:
        """The spatial-merge reordering of ``[n_embd, npx, npx]`` (cont, reshape, permute, cont)."""
        p = self.p
        t = cont(t, p.n_embd * 2, npx // 2, npx, 1)
        t = reshape(t, p.n_embd * 2, npx // 2, 2, npx // 2)
        t = permute(t, 0, 2, 1, 3)
        return cont(t, p.n_embd, npx * npx, 1)

    def positions_embd(self, npx: int) -> T:
        """``resize_position_embeddings``: bilinear interpolation of the learned grid to npx x npx."""
        p = self.p
        pos = self.req("v.position_embd.weight")
        side = int(pos.ne[1] ** 0.5)
        if side == npx:
            return pos
        t = reshape(pos, p.n_embd, side, side)
        t = permute(t, 2, 0, 1, 3)
        t = new(t.type, [npx, npx, p.n_embd, 1], "UPSCALE", t)
        t = permute(t, 1, 2, 0, 3)
        return cont(t, p.n_embd, npx * npx)

    def build(self) -> T:
        p = self.p
        npx = self.size // p.patch_size
        n_pos = npx * npx
        inp = self.dual_patch_embd()
        inp = self.merge_order(permute(inp, 1, 2, 0, 3), npx)
        inp = dup_op(inp, "ADD", inp, self.req("v.patch_embd.bias"))
        inp_l = dup_op(inp, "ADD", inp, self.merge_order(self.positions_embd(npx), npx))
        positions = input_tensor(I32, [n_pos * 4], "positions")
        if self.w("v.pre_ln.weight") is not None:
            inp_l = self.norm(inp_l, "v.pre_ln", -1)
        d_head = p.n_embd // p.n_head
        stack: T | None = None
        for il in range(p.n_layer):
            b = f"v.blk.{il}"
            cur = self.norm(inp_l, f"{b}.ln1", il)
            qkv = mul_mat(self.req(f"{b}.attn_qkv.weight"), cur)
            qkv = dup_op(qkv, "ADD", qkv, self.req(f"{b}.attn_qkv.bias"))
            row, width = qkv.type.type_size * d_head, qkv.type.type_size * p.n_embd
            q, k, v = (view(qkv, [d_head, p.n_head, n_pos], [row, qkv.nb[1]], i * width) for i in range(3))
            q = dup_op(q, "ROPE", q, positions, None)
            k = dup_op(k, "ROPE", k, positions, None)
            cur = self.attn(q, k, v, il)
            cur = dup_op(cur, "ADD", cur, inp_l)
            inp_l = cur
            cur = self.norm(cur, f"{b}.ln2", il)
            cur = self.ffn(cur, il)
            cur = _named(dup_op(inp_l, "ADD", inp_l, cur), f"layer_out-{il}")
            if self.w(f"v.deepstack.{il}.fc1.weight") is not None:
                feat = reshape(cur, p.n_embd * 4, n_pos // 4, 1)
                feat = self.norm(feat, f"v.deepstack.{il}.norm", il)
                feat = self.ffn(feat, -1, f"v.deepstack.{il}.fc1", f"v.deepstack.{il}.fc2")
                stack = feat if stack is None else concat(stack, feat, 0)
            inp_l = cur
        if self.w("v.post_ln.weight") is not None:
            inp_l = self.norm(inp_l, "v.post_ln", p.n_layer)
        emb = reshape(inp_l, p.n_embd * 4, n_pos // 4, 1)
        emb = self.ffn(emb, -1, "mm.0", "mm.2")
        return concat(emb, stack, 0) if stack is not None else emb


def build_graph(proj: Projector, weight: Weight, *, flash_attn: bool, image_max_tokens: int = 0) -> Graph:
    """The warmup graph of ``proj`` (one square image of ``warmup_size``)."""
    if not proj.has_graph:
        raise PlannerError(f"{proj.name}: no compute graph for projector type {proj.proj_type!r}")
    size = proj.warmup_size(image_max_tokens)
    if proj.proj_type in ("qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger"):
        cls = _Qwen3VL if proj.proj_type == "qwen3vl_merger" else _Qwen2VL
        q = cls(proj, weight, flash_attn, size)
        q.g.expand(q.build())
        return q.g
    b = _Vit(proj, weight, flash_attn, size)
    out = b.gemma3_tail(b.vit(b.inp()))
    b.g.expand(out)
    return b.g
