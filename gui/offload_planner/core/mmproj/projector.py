"""A multimodal projector (mmproj) as ``clip_model_loader`` reads it from its GGUF header.

Only the header is read (a header-only or remote file works): the projector type, the vision
hyper-parameters the compute graph needs and every tensor's shape and type.  The keys are those of
``tools/mtmd/clip-impl.h``; a value llama.cpp requires and the file lacks is one clear
:class:`GGUFError` naming the file and the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from offload_planner.core.errors import GGUFError
from offload_planner.core.ggml_types import GGMLType, resolve_type
from offload_planner.core.gguf_reader import read_file_header

#: ``clip.projector_type`` values whose compute graph the planner builds exactly (``models/siglip.cpp``).
GRAPH_TYPES = frozenset({"gemma3", "qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger"})
#: Default merge of each projector type: Gemma 3's pooling kernel (``clip.vision.projector.scale_
#: factor``), Qwen's spatial merge (``clip.vision.spatial_merge_size``).
_QWEN = ("qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger")
_DEFAULT_MERGE = {"gemma3": 4, **dict.fromkeys(_QWEN, 2)}
_MERGE_KEY = dict.fromkeys(_QWEN, "clip.vision.spatial_merge_size")
#: Projector types whose warmup image is set by a token count (``set_warmup_n_tokens``).
WARMUP_TOKENS = dict.fromkeys(_QWEN, 46 * 46)


@dataclass(frozen=True)
class ProjectorTensor:
    name: str
    shape: tuple[int, ...]  # ggml order
    type: GGMLType

    @property
    def nbytes(self) -> int:
        return self.type.nbytes(self.shape)


@dataclass(frozen=True)
class Projector:
    """One vision projector file: its hyper-parameters and tensors."""

    path: str
    proj_type: str
    n_embd: int
    n_head: int
    n_ff: int
    n_layer: int
    eps: float
    image_size: int
    patch_size: int
    n_merge: int
    ffn_op: str  # gelu | silu | gelu_quick (clip.use_gelu / clip.use_silu)
    tensors: tuple[ProjectorTensor, ...]
    projection_dim: int = 0
    n_wa_pattern: int = 0  # window attention: every n-th block attends fully (Qwen2.5-VL)
    audio: bool = False  # has an audio encoder (its compute is not projected)

    def warmup_size(self, image_max_tokens: int = 0) -> int:
        """``hparams.warmup_image_size``: the side of the warmup image (``--image-max-tokens`` caps
        the token count of types that warm up with a token count)."""
        n = WARMUP_TOKENS.get(self.proj_type)
        if n is None:
            return self.image_size
        side = int(n**0.5)
        if 0 < image_max_tokens < n:
            side = max(1, int(image_max_tokens**0.5))
        return side * self.patch_size * self.n_merge

    @property
    def name(self) -> str:
        return Path(self.path).name

    @property
    def weight_bytes(self) -> int:
        """Sum of ``ggml_nbytes``: what ``load_hparams`` logs as ``model size``."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def has_graph(self) -> bool:
        return self.proj_type in GRAPH_TYPES

    def tensor(self, name: str) -> ProjectorTensor | None:
        return next((t for t in self.tensors if t.name == name), None)

    @property
    def n_embd_out(self) -> int:
        """``clip_n_mmproj_embd``: the text model width the projector feeds (0: not known here)."""
        t = self.tensor("mm.input_projection.weight")  # gemma3: ne[0]
        if t is not None:
            return t.shape[0]
        t = self.tensor("mm.2.bias")  # qwen mergers: mm_1_b->ne[0], times 1 + deepstack mergers
        return t.shape[0] * (1 + len(self.deepstack)) if t is not None else 0

    @property
    def deepstack(self) -> list[int]:
        """Blocks with a deepstack merger (Qwen3-VL), in order."""
        return sorted(int(t.name.split(".")[2]) for t in self.tensors
                      if t.name.startswith("v.deepstack.") and t.name.endswith(".fc1.weight"))


def _int(md: dict[str, object], key: str, path: str, default: int | None = None) -> int:
    v = md.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise GGUFError(path, f"mmproj: missing or non-integer key {key!r}")
    return v


#: The pinned clip.cpp's sanity check of a vision projector's hyper-parameters (clip_model_loader,
#: ``tools/mtmd/clip.cpp`` 2041-2065: it throws and llama-server exits), each read as an int32:
#: key -> (lowest, highest, its words below the lowest, its words above the highest)
_SANE: dict[str, tuple[int, int, str, str]] = {
    "clip.vision.image_size": (0, 8192, "image_size ({v}) cannot be negative",
                               "image_size ({v}) is too large (max 8192)"),
    "clip.vision.patch_size": (1, 65535, "patch_size ({v}) must be positive and less than 65536",
                               "patch_size ({v}) must be positive and less than 65536"),
    "clip.vision.embedding_length": (1, 2**31 - 1, "n_embd ({v}) must be greater than 0",
                                     "n_embd ({v}) must be greater than 0"),
}
_SANE_MERGE = (1, 65535, "n_merge ({v}) must be greater than 0 and less than 65536",
               "n_merge ({v}) must be greater than 0 and less than 65536")


#: The longest ``clip.projector_type`` taken (clip.cpp's names have at most 20 characters)
_MAX_TYPE_CHARS = 128


def _int32(v: int) -> int:
    """A uint32 key as clip.cpp's ``int`` fields hold it."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def _check_vision(md: dict[str, object], proj: Projector, merge_key: str) -> None:
    """Refuse what clip.cpp refuses (:data:`_SANE`), naming the key, and a graph the planner would
    build with no attention heads (it divides the width by their count)."""
    checks: list[tuple[str, object, tuple[int, int, str, str]]] = [(k, md.get(k), r)
                                                                   for k, r in _SANE.items()]
    if proj.proj_type in GRAPH_TYPES:  # the merge key read is the one clip.cpp reads for these types
        checks.append((merge_key, proj.n_merge, _SANE_MERGE))
    for key, raw, (low, high, below, above) in checks:
        if not isinstance(raw, int) or isinstance(raw, bool) or low <= _int32(raw) <= high:
            continue
        said = (below if _int32(raw) < low else above).format(v=_int32(raw))
        raise GGUFError(proj.path, f"mmproj: {key} = {raw}: llama.cpp's clip loader refuses it ({said}) "
                                   "and llama-server exits")
    if proj.proj_type in GRAPH_TYPES and proj.n_head <= 0:
        raise GGUFError(proj.path, f"mmproj: clip.vision.attention.head_count = {proj.n_head}: a vision "
                                   "encoder without attention heads (its head size would be its width / 0)")


def read_projector(location: str | Path) -> Projector:
    """Read a projector's header (vision, audio or both); a file that is neither is a
    :class:`GGUFError`.  Audio encoders are counted by their weights only (``audio`` set)."""
    header = read_file_header(location)
    path, md = header.path, header.metadata
    vision, audio = bool(md.get("clip.has_vision_encoder")), bool(md.get("clip.has_audio_encoder"))
    prefix = "vision" if vision else "audio"
    proj_type = md.get("clip.projector_type") or md.get(f"clip.{prefix}.projector_type")
    if not isinstance(proj_type, str) or not (vision or audio):
        raise GGUFError(path, "not a multimodal projector (no clip.projector_type / clip.has_vision_encoder"
                              " / clip.has_audio_encoder)")
    if len(proj_type) > _MAX_TYPE_CHARS:  # went whole into the note that names an unknown type
        raise GGUFError(path, f"mmproj: clip.projector_type is {len(proj_type):,} characters "
                              f"({proj_type[:40]!r}...): no projector type of llama.cpp's is named so")
    if proj_type == "qwen2.5o" and vision:  # clip.cpp: the vision half of Qwen2.5-Omni
        proj_type = "qwen2.5vl_merger"
    tensors = []
    for r in header.tensors:
        t = resolve_type(r.type_id, None)
        if t is None:
            raise GGUFError(path, f"tensor {r.name!r} has unknown type id {r.type_id}", r.info_offset)
        tensors.append(ProjectorTensor(r.name, r.shape, t))
    eps = md.get(f"clip.{prefix}.attention.layer_norm_epsilon", 1e-6)
    ffn_op = "gelu" if md.get("clip.use_gelu") else "silu" if md.get("clip.use_silu") else "gelu_quick"
    merge_key = _MERGE_KEY.get(proj_type, "clip.vision.projector.scale_factor")
    proj = Projector(
        path=path,
        proj_type=proj_type if vision else f"audio:{proj_type}",
        n_embd=_int(md, f"clip.{prefix}.embedding_length", path),
        n_head=_int(md, f"clip.{prefix}.attention.head_count", path),
        n_ff=_int(md, f"clip.{prefix}.feed_forward_length", path),
        n_layer=_int(md, f"clip.{prefix}.block_count", path),
        eps=float(eps) if isinstance(eps, (int, float)) else 1e-6,
        image_size=_int(md, "clip.vision.image_size", path) if vision else 0,
        patch_size=_int(md, "clip.vision.patch_size", path) if vision else 1,
        n_merge=_int(md, merge_key, path, _DEFAULT_MERGE.get(proj_type, 1)),
        ffn_op=ffn_op,
        tensors=tuple(tensors),
        projection_dim=_int(md, f"clip.{prefix}.projection_dim", path, 0),
        n_wa_pattern=_int(md, "clip.vision.n_wa_pattern", path, 0),
        audio=audio,
    )
    if vision:
        _check_vision(md, proj, merge_key)
    return proj
