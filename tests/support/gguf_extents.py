"""Tensors' places in a GGUF file as gguf-py reads them (independent of the planner's reader), and the
spans llama.cpp maps from them."""

from __future__ import annotations

import shutil
from pathlib import Path

from gguf import GGUFReader

Extents = dict[str, tuple[int, int]]


def gguf_py_extents(path: Path, scratch: Path, size: int) -> Extents:
    """Each tensor's first byte and end in the file. A header-only file (gguf-py maps every tensor's
    data) is read from a sparse copy of it ``size`` bytes long, made in the folder ``scratch``."""
    try:
        reader = GGUFReader(path)
    except ValueError:
        full = scratch / (path.stem + "-sparse.gguf")
        shutil.copyfile(path, full)
        with open(full, "r+b") as f:
            f.truncate(size)
        reader = GGUFReader(full)
    return {t.name: (int(t.data_offset), int(t.data_offset) + int(t.n_bytes)) for t in reader.tensors}


def span(ext: Extents, names: list[str]) -> int:
    """``get_mapping_range``: from the first byte of these tensors to the last."""
    assert names
    return max(ext[n][1] for n in names) - min(ext[n][0] for n in names)


def padded(ext: Extents, names: list[str], align: int = 32) -> int:
    """The tensors' sizes, each padded to ``align``: what a buffer of their own holds."""
    return sum(-(-(ext[n][1] - ext[n][0]) // align) * align for n in names)
