"""Write a :class:`ModelSpec` as a GGUF file, a set of gguf-split shards, or header-only files.

Tensor data is never built in memory: tensor infos are added by shape and type, the header is
written with ``gguf.GGUFWriter``, and the data section is created by extending the file with
``truncate`` (a sparse run of zeros on Linux), so a complete file costs no more than its header.
A header-only file stops after the tensor infos, padded to the data alignment.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, cast

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from offload_planner.core.synth.metadata import write_metadata
from offload_planner.core.synth.quant import pick_type, tensor_nbytes
from offload_planner.core.synth.spec import ModelSpec
from offload_planner.core.synth.tensors import tensor_defs
from offload_planner.core.synth.vocab import make_vocab

_PLACEHOLDER_DTYPE = np.dtype(np.float32)  # ignored by GGUFWriter when raw_dtype is given


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def count_tensors(spec: ModelSpec) -> int:
    return len(tensor_defs(spec))


def total_tensor_bytes(spec: ModelSpec) -> int:
    """Sum of tensor bytes: what llama.cpp prints as ``file size`` (``ml.n_bytes``)."""
    return sum(tensor_nbytes(pick_type(spec, td), td.shape) for td in tensor_defs(spec))


class _Writer(GGUFWriter):
    """GGUFWriter whose shard keys come in llama-gguf-split's order, so shards are byte-identical
    to what ``llama-gguf-split --split-max-tensors N`` makes of the unsplit file."""

    def add_shard_kv_data(self) -> None:
        super().add_shard_kv_data()
        for kv in self.kv_data:
            if "split.count" in kv:
                kv["split.count"] = kv.pop("split.count")  # after split.tensors.count

    def _pack_val(
        self, val: Any, vtype: GGUFValueType, add_vtype: bool, sub_type: GGUFValueType | None = None
    ) -> bytes:
        """Same bytes as GGUFWriter's, several times faster for the vocabulary's long arrays."""
        if vtype != GGUFValueType.ARRAY or not isinstance(val, list) or len(val) < 1024:
            return bytes(super()._pack_val(val, vtype, add_vtype, sub_type))
        head = struct.pack("<I", vtype) if add_vtype else b""
        first = val[0]
        if isinstance(first, str) and sub_type in (None, GGUFValueType.STRING):
            encoded = [v.encode("utf-8") for v in val]
            body = b"".join([struct.pack("<Q", len(e)) + e for e in encoded])
            ltype = GGUFValueType.STRING
        elif isinstance(first, float) and sub_type in (None, GGUFValueType.FLOAT32):
            body = np.asarray(val, dtype="<f4").tobytes()
            ltype = GGUFValueType.FLOAT32
        elif type(first) is int and sub_type in (None, GGUFValueType.INT32):
            body = np.asarray(val, dtype="<i4").tobytes()
            ltype = GGUFValueType.INT32
        else:
            return bytes(super()._pack_val(val, vtype, add_vtype, sub_type))
        return head + struct.pack("<IQ", ltype, len(val)) + body


def _new_writer(spec: ModelSpec, path: Path, split_max_tensors: int | None) -> _Writer:
    writer = _Writer(path, spec.arch, split_max_tensors=split_max_tensors or 0)
    write_metadata(writer, spec, make_vocab(spec.tokenizer))
    for td in tensor_defs(spec):
        qtype = pick_type(spec, td)
        writer.add_tensor_info(
            td.name,
            tuple(reversed(td.shape)),  # GGUFWriter takes numpy order and reverses it
            _PLACEHOLDER_DTYPE,
            tensor_nbytes(qtype, td.shape),
            raw_dtype=cast(GGMLQuantizationType, qtype),  # an ik type (IkQ): its id, as gguf packs any
        )
    return writer


def write_model(
    spec: ModelSpec,
    path: str | Path,
    *,
    header_only: bool = False,
    split_max_tensors: int | None = None,
) -> list[Path]:
    """Write ``spec`` to ``path`` and return the files written.

    With ``split_max_tensors`` the model is cut into shards of at most that many tensors named
    ``<stem>-00001-of-0000N.gguf`` next to ``path`` (as ``llama-gguf-split`` names them), each
    with ``split.no`` (u16), ``split.count`` (u16) and ``split.tensors.count`` (i32); the first
    shard holds all other keys.  A model that fits one shard is written unsplit to ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = _new_writer(spec, path, split_max_tensors)
    paths = writer.format_shard_names(path)
    shard_data = [
        sum(_pad(ti.nbytes, writer.data_alignment) for ti in shard.values())
        for shard in writer.tensors
    ]
    try:
        writer.write_header_to_file(path)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None
        for fout, data_bytes in zip(writer.fout, shard_data, strict=True):
            writer.write_padding(fout, fout.tell())
            fout.flush()
            if not header_only:
                fout.truncate(fout.tell() + data_bytes)
    finally:
        writer.close()
    return list(paths)
