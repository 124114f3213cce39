"""Metadata gguf.cpp (pinned build, gguf_init_from_reader) refuses, so llama-server cannot load the file
(confirmed with it): an empty key ("key 2 is empty") and an array of arrays ("key 'x.nested' has invalid
GGUF type 9"). The reader took both (arrays of arrays up to three levels)."""

from __future__ import annotations

from pathlib import Path

from tests.core.test_reader_bad_input import ARR, U32, Raw, _expect, _with_kv, kv_array, kv_u32, u32, u64


def test_an_empty_key_is_refused(tmp_path: Path) -> None:
    raw = _with_kv(Raw(), kv_u32("", 5))
    _expect(raw.write(tmp_path / "k.gguf"), "a metadata key is empty, which llama.cpp refuses", raw.kv_pos(2))


def test_an_array_of_arrays_is_refused(tmp_path: Path) -> None:
    raw = _with_kv(Raw(), kv_array("x.nested", ARR, 1, u32(U32) + u64(2) + u32(1) + u32(2)))
    _expect(raw.write(tmp_path / "n.gguf"), "key 'x.nested': a nested array (an array of arrays), which "
            "llama.cpp refuses", lambda off: off > raw.kv_pos(2))
