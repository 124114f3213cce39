"""ggml tensor types of mainline llama.cpp and ik_llama.cpp: block size, bytes per block, row metadata.

Sizes follow ``ggml/src/ggml-common.h`` (mainline) and ik_llama.cpp's ``type_traits`` (which adds a
per-row metadata size).  The ``gguf`` Python package's table is not used as the source of truth: it
has ``Q8_1`` at 40 bytes (ggml has 36) and lacks ``Q2_0`` and every ik type.

Type ids collide between the two trees (31-36, 40, 42); :func:`resolve_type` takes the file's
flavor into account and :func:`detect_flavor` decides it from the set of ids a file uses.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class Flavor(StrEnum):
    """Which ggml type-id tree a file's tensor types belong to, named after the project whose ggml
    defines it (what ``inspect`` prints).  A property of the file, not a server dialect: every
    dialect's server reads the ids its ggml defines, and the planner never branches on the flavor,
    it only picks the table (:func:`resolve_type`)."""

    MAINLINE = "llama.cpp"
    IK = "ik_llama.cpp"


@dataclass(frozen=True, slots=True)
class GGMLType:
    id: int
    name: str
    block_size: int
    type_size: int
    row_meta: int = 0
    quantized: bool = True

    def row_bytes(self, ne0: int) -> int:
        """Bytes of one row of ``ne0`` elements (ik adds ``row_meta`` per row)."""
        return self.row_meta + (ne0 // self.block_size) * self.type_size

    def nbytes(self, shape: tuple[int, ...]) -> int:
        """``ggml_nbytes`` of a contiguous tensor of this type."""
        if self.name == "i2_s":  # ik BitNet: 2 bits per weight plus a 32-byte scale block
            n = 1
            for d in shape:
                n *= d
            return n // 4 + 32
        rows = 1
        for d in shape[1:]:
            rows *= d
        return rows * self.row_bytes(shape[0] if shape else 1)

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.type_size / self.block_size


def _t(id_: int, name: str, blck: int, size: int, meta: int = 0) -> GGMLType:
    quantized = name not in {"f32", "f16", "bf16", "f64", "i8", "i16", "i32", "i64"}
    return GGMLType(id_, name, blck, size, meta, quantized)


_SHARED: tuple[GGMLType, ...] = (
    _t(0, "f32", 1, 4),
    _t(1, "f16", 1, 2),
    _t(2, "q4_0", 32, 18),
    _t(3, "q4_1", 32, 20),
    _t(6, "q5_0", 32, 22),
    _t(7, "q5_1", 32, 24),
    _t(8, "q8_0", 32, 34),
    _t(9, "q8_1", 32, 36),
    _t(10, "q2_K", 256, 84),
    _t(11, "q3_K", 256, 110),
    _t(12, "q4_K", 256, 144),
    _t(13, "q5_K", 256, 176),
    _t(14, "q6_K", 256, 210),
    _t(15, "q8_K", 256, 292),
    _t(16, "iq2_xxs", 256, 66),
    _t(17, "iq2_xs", 256, 74),
    _t(18, "iq3_xxs", 256, 98),
    _t(19, "iq1_s", 256, 50),
    _t(20, "iq4_nl", 32, 18),
    _t(21, "iq3_s", 256, 110),
    _t(22, "iq2_s", 256, 82),
    _t(23, "iq4_xs", 256, 136),
    _t(24, "i8", 1, 1),
    _t(25, "i16", 1, 2),
    _t(26, "i32", 1, 4),
    _t(27, "i64", 1, 8),
    _t(28, "f64", 1, 8),
    _t(29, "iq1_m", 256, 56),
    _t(30, "bf16", 1, 2),
    _t(39, "mxfp4", 32, 17),
    _t(41, "q1_0", 128, 18),
)

_MAINLINE_ONLY: tuple[GGMLType, ...] = (
    _t(34, "tq1_0", 256, 54),
    _t(35, "tq2_0", 256, 66),
    _t(40, "nvfp4", 64, 36),
    _t(42, "q2_0", 64, 18),
)

_IK_ONLY: tuple[GGMLType, ...] = (
    _t(31, "q4_0_4x4", 32, 18),
    _t(32, "q4_0_4x8", 32, 18),
    _t(33, "q4_0_8x8", 32, 18),
    _t(36, "i2_s", 1, 1),
    _t(97, "q8_0_x4", 32, 34),
    _t(98, "q8_1_x4", 32, 36),
    _t(99, "q8_2_x4", 32, 36),
    _t(133, "q6_0", 32, 26),
    _t(134, "iq1_bn", 64, 13, 2),
    _t(135, "iq2_bn", 64, 16, 4),
    _t(136, "q8_K64", 64, 68),
    _t(137, "iq2_k", 256, 76),
    _t(138, "iq3_k", 256, 110),
    _t(139, "iq4_k", 256, 144),
    _t(140, "iq5_k", 256, 176),
    _t(141, "iq6_k", 256, 212),
    _t(144, "iq4_ks", 256, 136, 4),
    _t(145, "iq2_ks", 256, 70, 2),
    _t(146, "iq4_kss", 256, 128, 4),
    _t(147, "q8_K16", 64, 64, 20),
    _t(148, "q8_K32", 256, 296),
    _t(149, "q8_KR8", 256, 296),
    _t(150, "q8_K128", 128, 140),
    _t(151, "q8_KV", 32, 32, 8),
    _t(152, "iq5_ks", 256, 168, 4),
    _t(153, "iq2_kt", 256, 68, 4),
    _t(154, "iq3_kt", 256, 100, 4),
    _t(155, "iq4_kt", 256, 128, 4),
    _t(156, "iq3_ks", 256, 102, 2),
    _t(157, "iq2_kl", 256, 86, 2),
    _t(158, "iq1_kt", 256, 56, 4),
    _t(202, "q4_0_r8", 32, 18),
    _t(206, "q5_0_r4", 32, 22),
    _t(208, "q8_0_r8", 32, 34),
    _t(210, "q2_k_r4", 256, 84),
    _t(211, "q3_k_r4", 256, 110),
    _t(212, "q4_k_r4", 256, 144),
    _t(213, "q5_k_r4", 256, 176),
    _t(214, "q6_k_r4", 256, 210),
    _t(216, "iq2_xxs_r4", 256, 66),
    _t(217, "iq2_xs_r4", 256, 74),
    _t(218, "iq3_xxs_r4", 256, 98),
    _t(219, "iq1_s_r4", 32, 6, 2),
    _t(220, "iq4_nl_r4", 32, 18),
    _t(221, "iq3_s_r4", 256, 110),
    _t(222, "iq2_s_r4", 256, 82),
    _t(223, "iq4_xs_r8", 256, 136),
    _t(229, "iq1_m_r4", 32, 7, 2),
    _t(230, "bf16_r16", 1, 2),
    _t(233, "q6_0_r4", 32, 26),
    _t(335, "iq2_bn_r4", 64, 16, 4),
    _t(337, "iq2_k_r4", 256, 76),
    _t(338, "iq3_k_r4", 256, 110),
    _t(339, "iq4_k_r4", 256, 144),
    _t(340, "iq5_k_r4", 256, 176),
    _t(344, "iq4_ks_r4", 256, 136, 4),
    _t(352, "iq5_ks_r4", 256, 168, 4),
    _t(353, "mxfp4_r8", 32, 17),
    _t(397, "q8_k_r16", 256, 258),
    _t(398, "q8_KV_r8", 32, 32, 4),
    _t(399, "q8_k_r8", 256, 258),
)

MAINLINE_TYPES: dict[int, GGMLType] = {t.id: t for t in (*_SHARED, *_MAINLINE_ONLY)}
IK_TYPES: dict[int, GGMLType] = {t.id: t for t in (*_SHARED, *_IK_ONLY)}
_BY_NAME: dict[str, GGMLType] = {
    t.name.lower(): t for t in (*_SHARED, *_MAINLINE_ONLY, *_IK_ONLY)
}

#: each tree's types by id
TYPES_OF: dict[Flavor, dict[int, GGMLType]] = {Flavor.MAINLINE: MAINLINE_TYPES, Flavor.IK: IK_TYPES}

MAINLINE_ONLY_IDS = frozenset(t.id for t in _MAINLINE_ONLY)
IK_ONLY_IDS = frozenset(t.id for t in _IK_ONLY)

#: KV cache types llama.cpp accepts for -ctk/-ctv.
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def detect_flavor(type_ids: Iterable[int]) -> Flavor | None:
    """Mainline or ik from the type ids a file uses; None when the file is valid in both."""
    ids = set(type_ids)
    if ids & IK_ONLY_IDS:
        return Flavor.IK
    if ids & MAINLINE_ONLY_IDS:
        return Flavor.MAINLINE
    return None


def resolve_type(type_id: int, flavor: Flavor | None) -> GGMLType | None:
    """The type for an id in the given tree (``None`` flavor: either tree, mainline first)."""
    if flavor is not None:
        return TYPES_OF[flavor].get(type_id)
    return MAINLINE_TYPES.get(type_id) or IK_TYPES.get(type_id)


def type_by_name(name: str) -> GGMLType:
    """Look a type up by its ggml name, case-insensitively (``q4_K``, ``Q4_K``, ``iq4_ks``)."""
    try:
        return _BY_NAME[name.lower()]
    except KeyError:
        raise KeyError(f"unknown ggml type {name!r}") from None
