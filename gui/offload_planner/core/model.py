"""The model as the planner sees it: tensors with layer, role, type, bytes and shard, plus metadata."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from offload_planner.core.ggml_types import Flavor, GGMLType
from offload_planner.core.roles import Role

if TYPE_CHECKING:
    from offload_planner.core.metadata import Meta
    from offload_planner.core.summary import ModelSummary


@dataclass(frozen=True, slots=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # ggml order: ne0 (row length) first
    type: GGMLType
    nbytes: int
    shard: int  # index into Model.shards
    offset: int  # absolute byte offset of the data in its shard file
    layer: int | None
    role: Role

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class Shard:
    path: str  # file path or URL
    file_size: int  # bytes available (for a URL: the Content-Length / Range total)
    data_offset: int  # start of the tensor data section
    data_bytes: int  # span of tensor data the header describes (end of last tensor - data_offset)
    header_only: bool  # the file holds less than the header describes
    version: int
    alignment: int
    n_tensors: int


@dataclass(eq=False)
class Model:
    """One model, possibly made of several shards; tensors keep their shard and offset."""

    path: str  # the file or URL the user opened
    shards: list[Shard]
    metadata: Mapping[str, object]
    tensors: list[Tensor]
    flavor: Flavor | None  # None: type ids valid in both mainline and ik
    key_offsets: Mapping[str, int] = field(default_factory=dict)  # metadata key -> byte offset
    _by_name: dict[str, Tensor] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._by_name = {t.name: t for t in self.tensors}

    @property
    def arch(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    @property
    def header_only(self) -> bool:
        return any(s.header_only for s in self.shards)

    @property
    def total_bytes(self) -> int:
        """Sum of tensor bytes (what llama.cpp calls the file size, ``ml.n_bytes``)."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def file_bytes(self) -> int:
        return sum(s.file_size for s in self.shards)

    @cached_property
    def meta(self) -> Meta:
        """Checked reads of the metadata (errors name the file, the key and its offset)."""
        from offload_planner.core.metadata import Meta

        return Meta(self.path, self.metadata, self.key_offsets)

    def arch_int(self, key: str, default: int) -> int:
        """``<arch>.<key>`` as llama.cpp's uint32; ``default`` when absent (GGUFError when not a count)."""
        return self.meta.count(f"{self.arch}.{key}", default)

    def arch_float(self, key: str, default: float) -> float:
        """``<arch>.<key>`` as a finite float; ``default`` when absent (GGUFError when not a number)."""
        return self.meta.real(f"{self.arch}.{key}", default)

    def tensor(self, name: str) -> Tensor:
        return self._by_name[name]

    def get(self, name: str) -> Tensor | None:
        return self._by_name.get(name)

    def type_histogram(self) -> Counter[str]:
        return Counter(t.type.name for t in self.tensors)

    def role_bytes(self) -> dict[Role, int]:
        out: dict[Role, int] = {}
        for t in self.tensors:
            out[t.role] = out.get(t.role, 0) + t.nbytes
        return out

    @cached_property
    def summary(self) -> ModelSummary:
        from offload_planner.core.summary import summarize

        return summarize(self)
