"""general.alignment of a type other than uint32: gguf.cpp (pinned build, gguf_init_from_file_impl)
refuses the file ("general.alignment has type ..., expected uint32" ... "failed to read key-value
pairs"), so llama-server cannot load it; the reader took any integer that was a power of two."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from tests.core.test_reader_bad_input import BOOL, I32, U16, U64, Raw, _expect, _with_kv, kv, u64


@pytest.mark.parametrize(("vtype", "payload", "name"), [
    (U16, struct.pack("<H", 32), "uint16"),
    (U64, u64(32), "uint64"),
    (I32, struct.pack("<i", 32), "int32"),
    (BOOL, b"\1", "bool"),
])
def test_an_alignment_that_is_no_uint32_is_refused(tmp_path: Path, vtype: int, payload: bytes,
                                                   name: str) -> None:
    raw = _with_kv(Raw(), kv("general.alignment", vtype, payload))
    _expect(raw.write(tmp_path / "a.gguf"), f"general.alignment is a {name}; llama.cpp reads only a uint32",
            raw.kv_pos(2))
