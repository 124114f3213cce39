"""Multimodal projector (mmproj) GGUF files as ``convert_hf_to_gguf.py --mmproj`` writes them.

A Gemma 3 projector is a SigLIP vision tower (``v.*``: a 2-D patch convolution, learned position
embeddings, pre-norm ViT blocks with biased q/k/v/out and a GELU FFN, a final layer norm) and the
``mm.*`` projection (an RMS norm and a ``[n_embd_text, n_embd]`` input projection).  Keys and tensor
names are those of ``tools/mtmd/clip-impl.h`` of the pinned llama.cpp; the writer shares the text
models' sparse-file approach (the data section is a run of zeros, loadable by llama-server).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from offload_planner.core.synth.quant import tensor_nbytes

Q = GGMLQuantizationType
_PLACEHOLDER = np.dtype(np.float32)


@dataclass(frozen=True)
class MmprojSpec:
    """A Gemma 3 style (SigLIP) vision projector; ``n_embd_text`` is the text model's width."""

    name: str
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    image_size: int
    patch_size: int
    n_embd_text: int
    proj_type: str = "gemma3"
    weight_type: Q = Q.F16
    eps: float = 1e-6
    n_merge: int | None = None  # clip.vision.projector.scale_factor (Gemma 3 default: 4)
    deepstack: tuple[int, ...] = ()  # Qwen3-VL: blocks whose output feeds a deepstack merger
    n_pos_embd: int = 0  # Qwen3-VL: learned position embeddings (a square grid)


QWEN2VL = "qwen2vl_merger"
QWEN25VL = "qwen2.5vl_merger"
QWEN3VL = "qwen3vl_merger"


def _qwen3vl_tensors(spec: MmprojSpec) -> list[tuple[str, tuple[int, ...], Q]]:
    """Qwen3-VL's tower: biased temporal patch kernels, learned position embeddings, layer-normed
    GELU blocks with fused qkv, deepstack mergers and the patch merger ``mm.0``/``mm.2``."""
    e, ff, p, w = spec.n_embd, spec.n_ff, spec.patch_size, spec.weight_type
    m = e * 4
    out: list[tuple[str, tuple[int, ...], Q]] = [
        ("mm.0.bias", (m,), Q.F32), ("mm.0.weight", (m, m), w),
        ("mm.2.bias", (spec.n_embd_text,), Q.F32), ("mm.2.weight", (m, spec.n_embd_text), w),
        ("v.patch_embd.bias", (e,), Q.F32),
        ("v.patch_embd.weight", (p, p, 3, e), Q.F16), ("v.patch_embd.weight.1", (p, p, 3, e), Q.F16),
        ("v.position_embd.weight", (e, spec.n_pos_embd), Q.F32),  # interpolated: ggml needs f32
    ]
    for i in range(spec.n_layer):
        b = f"v.blk.{i}"
        out += [
            (f"{b}.attn_out.bias", (e,), Q.F32), (f"{b}.attn_out.weight", (e, e), w),
            (f"{b}.attn_qkv.bias", (3 * e,), Q.F32), (f"{b}.attn_qkv.weight", (e, 3 * e), w),
            (f"{b}.ffn_down.bias", (e,), Q.F32), (f"{b}.ffn_down.weight", (ff, e), w),
            (f"{b}.ffn_up.bias", (ff,), Q.F32), (f"{b}.ffn_up.weight", (e, ff), w),
            (f"{b}.ln1.bias", (e,), Q.F32), (f"{b}.ln1.weight", (e,), Q.F32),
            (f"{b}.ln2.bias", (e,), Q.F32), (f"{b}.ln2.weight", (e,), Q.F32),
        ]
    for i in spec.deepstack:
        d = f"v.deepstack.{i}"
        out += [
            (f"{d}.fc1.bias", (m,), Q.F32), (f"{d}.fc1.weight", (m, m), w),
            (f"{d}.fc2.bias", (spec.n_embd_text,), Q.F32), (f"{d}.fc2.weight", (m, spec.n_embd_text), w),
            (f"{d}.norm.bias", (m,), Q.F32), (f"{d}.norm.weight", (m,), Q.F32),
        ]
    return [*out, ("v.post_ln.bias", (e,), Q.F32), ("v.post_ln.weight", (e,), Q.F32)]


def _qwen25vl_tensors(spec: MmprojSpec) -> list[tuple[str, tuple[int, ...], Q]]:
    """Qwen2.5-VL's vision tower: two temporal patch kernels, RMS-normed SwiGLU blocks with biased
    q/k/v/out, and the patch merger ``mm.0``/``mm.2`` over 2x2 merged patches.  Qwen2-VL's: the
    same with layer norms (biased) and a QuickGELU FFN without gate."""
    e, ff, p, w = spec.n_embd, spec.n_ff, spec.patch_size, spec.weight_type
    v2 = spec.proj_type == QWEN2VL
    merged = e * 4
    out: list[tuple[str, tuple[int, ...], Q]] = [
        ("mm.0.bias", (merged,), Q.F32), ("mm.0.weight", (merged, merged), w),
        ("mm.2.bias", (spec.n_embd_text,), Q.F32), ("mm.2.weight", (merged, spec.n_embd_text), w),
        ("v.patch_embd.weight", (p, p, 3, e), Q.F16), ("v.patch_embd.weight.1", (p, p, 3, e), Q.F16),
    ]
    for i in range(spec.n_layer):
        b = f"v.blk.{i}"
        for name in ("attn_k", "attn_out", "attn_q", "attn_v"):
            out += [(f"{b}.{name}.bias", (e,), Q.F32), (f"{b}.{name}.weight", (e, e), w)]
        out += [(f"{b}.ffn_down.bias", (e,), Q.F32), (f"{b}.ffn_down.weight", (ff, e), w)]
        if not v2:
            out += [(f"{b}.ffn_gate.bias", (ff,), Q.F32), (f"{b}.ffn_gate.weight", (e, ff), w)]
        out += [(f"{b}.ffn_up.bias", (ff,), Q.F32), (f"{b}.ffn_up.weight", (e, ff), w)]
        for ln in ("ln1", "ln2"):
            out += [(f"{b}.{ln}.bias", (e,), Q.F32)] if v2 else []
            out += [(f"{b}.{ln}.weight", (e,), Q.F32)]
    return [*out, *([("v.post_ln.bias", (e,), Q.F32)] if v2 else []), ("v.post_ln.weight", (e,), Q.F32)]


def mmproj_tensors(spec: MmprojSpec) -> list[tuple[str, tuple[int, ...], Q]]:
    """(name, ggml shape, type) of every tensor, in the converter's order."""
    if spec.proj_type in (QWEN2VL, QWEN25VL):
        return _qwen25vl_tensors(spec)
    if spec.proj_type == QWEN3VL:
        return _qwen3vl_tensors(spec)
    e, ff, p = spec.n_embd, spec.n_ff, spec.patch_size
    n_pos = (spec.image_size // p) ** 2
    w = spec.weight_type
    out: list[tuple[str, tuple[int, ...], Q]] = [
        ("mm.input_projection.weight", (spec.n_embd_text, e), w),
        ("mm.soft_emb_norm.weight", (e,), Q.F32),
        ("v.patch_embd.bias", (e,), Q.F32),
        ("v.patch_embd.weight", (p, p, 3, e), Q.F16),
        ("v.position_embd.weight", (e, n_pos), Q.F16),
    ]
    for i in range(spec.n_layer):
        b = f"v.blk.{i}"
        for name in ("attn_k", "attn_out", "attn_q", "attn_v"):
            out += [(f"{b}.{name}.bias", (e,), Q.F32), (f"{b}.{name}.weight", (e, e), w)]
        out += [
            (f"{b}.ffn_down.bias", (e,), Q.F32), (f"{b}.ffn_down.weight", (ff, e), w),
            (f"{b}.ffn_up.bias", (ff,), Q.F32), (f"{b}.ffn_up.weight", (e, ff), w),
            (f"{b}.ln1.bias", (e,), Q.F32), (f"{b}.ln1.weight", (e,), Q.F32),
            (f"{b}.ln2.bias", (e,), Q.F32), (f"{b}.ln2.weight", (e,), Q.F32),
        ]
    out += [("v.post_ln.bias", (e,), Q.F32), ("v.post_ln.weight", (e,), Q.F32)]
    return out


def _metadata(writer: GGUFWriter, spec: MmprojSpec) -> None:
    writer.add_string("general.name", spec.name)
    writer.add_uint32("general.file_type", 1)
    writer.add_string("clip.projector_type", spec.proj_type)
    writer.add_bool("clip.has_vision_encoder", True)
    if spec.proj_type != QWEN2VL:  # Qwen2-VL: QuickGELU, clip.cpp's default
        writer.add_bool("clip.use_silu" if spec.proj_type == QWEN25VL else "clip.use_gelu", True)
    if spec.proj_type == QWEN25VL:  # windowed attention, full attention every 8th block
        writer.add_uint32("clip.vision.n_wa_pattern", 8)
    if spec.proj_type in (QWEN2VL, QWEN25VL, QWEN3VL):
        writer.add_uint32("clip.vision.spatial_merge_size", 2)
    if spec.deepstack:
        flags = [i in spec.deepstack for i in range(spec.n_layer)]
        writer.add_array("clip.vision.is_deepstack_layers", flags)
    writer.add_uint32("clip.vision.projection_dim", spec.n_embd_text)
    writer.add_uint32("clip.vision.image_size", spec.image_size)
    writer.add_uint32("clip.vision.patch_size", spec.patch_size)
    writer.add_uint32("clip.vision.embedding_length", spec.n_embd)
    writer.add_uint32("clip.vision.feed_forward_length", spec.n_ff)
    writer.add_uint32("clip.vision.block_count", spec.n_layer)
    writer.add_uint32("clip.vision.attention.head_count", spec.n_head)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", spec.eps)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    if spec.n_merge is not None:
        writer.add_uint32("clip.vision.projector.scale_factor", spec.n_merge)


def write_mmproj(spec: MmprojSpec, path: str | Path, *, header_only: bool = False) -> Path:
    """Write ``spec`` to ``path`` (complete with a sparse zero data section, or header only)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(path, "clip")
    _metadata(writer, spec)
    data = 0
    for name, shape, qtype in mmproj_tensors(spec):
        nbytes = tensor_nbytes(qtype, shape)
        writer.add_tensor_info(name, tuple(reversed(shape)), _PLACEHOLDER, nbytes, raw_dtype=qtype)
        data += -(-nbytes // writer.data_alignment) * writer.data_alignment
    try:
        writer.write_header_to_file(path)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None
        fout = writer.fout[0]
        writer.write_padding(fout, fout.tell())
        fout.flush()
        if not header_only:
            fout.truncate(fout.tell() + data)
    finally:
        writer.close()
    return path


#: Loadable projectors for the small text models (``n_embd_text`` = the text model's width).
SMALL_MMPROJ: dict[str, MmprojSpec] = {
    # image 224 / patch 14 = 16x16 patches, pooled 4x4 -> 16 image tokens
    "gemma3": MmprojSpec(name="synth-gemma3-mmproj", n_embd=192, n_ff=512, n_layer=2, n_head=3,
                         image_size=224, patch_size=14, n_embd_text=256),
    # 32x32 patches pooled 2x2 -> 256 tokens; q8_0 weights: attention scores of 1024 positions dominate
    "gemma3-448": MmprojSpec(name="synth-gemma3-448-mmproj", n_embd=128, n_ff=256, n_layer=3, n_head=2,
                             image_size=448, patch_size=14, n_embd_text=256, n_merge=2,
                             weight_type=Q.Q8_0),
}

#: Real shapes, header only: Gemma 3 4B/12B/27B share one SigLIP-so400m tower (896 px, 14 px
#: patches, 27 blocks, 1152 wide, 16 heads, FFN 4304); only the projection width differs.
BIG_MMPROJ: dict[str, MmprojSpec] = {
    f"gemma-3-{size}-mmproj-f16": MmprojSpec(
        name=f"gemma-3-{size}-it mmproj", n_embd=1152, n_ff=4304, n_layer=27, n_head=16,
        image_size=896, patch_size=14, n_embd_text=width)
    for size, width in (("4b", 2560), ("12b", 3840), ("27b", 5376))
} | {
    # Qwen2.5-VL-7B-Instruct: 32 blocks of 1280, 16 heads, SwiGLU 3420, merger to 3584 (weights
    # only in the planner: its windowed, dynamic-resolution graph is not modelled)
    "qwen2.5-vl-7b-mmproj-f16": MmprojSpec(
        name="Qwen2.5-VL-7B-Instruct mmproj", n_embd=1280, n_ff=3420, n_layer=32, n_head=16,
        image_size=560, patch_size=14, n_embd_text=3584, proj_type=QWEN25VL, eps=1e-6),
    # Qwen2-VL-7B-Instruct: 32 blocks of 1280, 16 heads, QuickGELU FFN 5120, merger to 3584
    "qwen2-vl-7b-mmproj-f16": MmprojSpec(
        name="Qwen2-VL-7B-Instruct mmproj", n_embd=1280, n_ff=5120, n_layer=32, n_head=16,
        image_size=560, patch_size=14, n_embd_text=3584, proj_type=QWEN2VL, eps=1e-6),
    # Qwen3-VL-8B-Instruct: 27 blocks of 1152, 16 heads, FFN 4304, 16 px patches, 48 x 48 learned
    # positions, deepstack after blocks 8, 16 and 24; the text model takes 4 x 4096 inputs
    "qwen3-vl-8b-mmproj-f16": MmprojSpec(
        name="Qwen3-VL-8B-Instruct mmproj", n_embd=1152, n_ff=4304, n_layer=27, n_head=16,
        image_size=768, patch_size=16, n_embd_text=4096, proj_type=QWEN3VL, eps=1e-6,
        deepstack=(8, 16, 24), n_pos_embd=2304),
}
