"""The header reader's string-array walk lands exactly where a plain one-string-at-a-time walk does.

The reader walks ``tokenizer.ggml.tokens``/``merges`` in unchecked chunks straight over a local
file's memory map (or over a growing buffer for other sources) and falls back to a careful walk
only when a chunk fails. These tests compare it with :func:`_reference_walk`, the careful walk
written out plainly, on real synth headers and on crafted arrays (empty strings, long strings,
counts that do not fill a chunk, truncation inside a length prefix, a lying length), through
both kinds of source, with the buffer growing in the middle of an array.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from offload_planner.core import gguf_reader
from offload_planner.core.byte_source import FileSource
from offload_planner.core.errors import GGUFError
from offload_planner.core.gguf_reader import LazyArray, _Cursor, open_model, read_header
from offload_planner.core.synth.catalog import BIG_MODELS, SMALL_MODELS
from offload_planner.core.synth.writer import write_model

RESOURCES = Path(__file__).resolve().parents[2] / "resources"
STR, ARR = 8, 9


class BytesSource:
    """A non-file source (as the URL source is): the cursor reads it into a growing buffer."""

    def __init__(self, data: bytes, name: str) -> None:
        self.data, self._name = data, name

    @property
    def name(self) -> str:
        return self._name

    @property
    def size(self) -> int:
        return len(self.data)

    def read(self, offset: int, n: int) -> bytes:
        return self.data[offset : offset + n]

    def close(self) -> None:
        pass


def _reference_walk(data: bytes, pos: int, count: int) -> int | tuple[str, int]:
    """Offset after ``count`` strings from ``pos``, or (what failed, its offset)."""
    for i in range(count):
        if pos + 8 > len(data):
            return ("file ends inside the header", len(data))
        (n,) = struct.unpack_from("<Q", data, pos)
        if n > len(data) - pos - 8:
            return (f"string {i} of an array: length {n} runs past the end of the file", pos)
        pos += 8 + n
    return pos


def _string_arrays(path: Path) -> list[tuple[str, int, int]]:
    header = open_model(path)
    return [
        (k, v.offset, v.count)
        for k, v in header.metadata.items()
        if isinstance(v, LazyArray) and v.elem_type == STR
    ]


def _skip(src: FileSource | BytesSource, pos: int, count: int) -> int:
    cur = _Cursor(src)
    cur.grow(pos)
    cur.pos = pos
    cur.skip_strings(count)
    return cur.pos


@pytest.fixture(scope="module")
def real_headers(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("real")
    written = [write_model(SMALL_MODELS[n], out / f"{n}.gguf")[0] for n in ("llama", "gpt-oss")]
    written.append(write_model(BIG_MODELS["gpt-oss-120b-MXFP4"], out / "g.gguf", header_only=True)[0])
    return [*written, RESOURCES / "DeepSeek-V3-Q4_K_M.header.gguf"]


@pytest.mark.parametrize("first_read", [gguf_reader._FIRST_READ, 4096, 100_003])
def test_real_string_arrays_end_where_the_reference_walk_ends(
    real_headers: list[Path], first_read: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gguf_reader, "_FIRST_READ", first_read)  # growth inside the arrays
    walked = 0
    for path in real_headers:
        data = path.read_bytes()
        for key, pos, count in _string_arrays(path):
            want = _reference_walk(data, pos, count)
            assert isinstance(want, int) and want > pos, key
            with FileSource(path) as fs:
                assert _skip(fs, pos, count) == want, (path.name, key)
            assert _skip(BytesSource(data, str(path)), pos, count) == want, (path.name, key)
            walked += count
    assert walked > 900_000  # the big vocabularies and merges were walked


def _file(tmp_path: Path, strings: bytes, count: int, tail: bytes = b"") -> tuple[Path, int]:
    """A GGUF with one string array ``strings`` claiming ``count`` elements, then ``tail``;
    returns the file and the offset of the array's first string."""
    key = b"tokenizer.ggml.tokens"
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
    kv = struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", ARR, STR, count)
    path = tmp_path / "crafted.gguf"
    path.write_bytes(head + kv + strings + tail)
    return path, len(head) + len(kv)


def _s(payload: bytes, length: int | None = None) -> bytes:
    return struct.pack("<Q", len(payload) if length is None else length) + payload


CRAFTED = {
    "empty strings": (_s(b"") * 30_001, 30_001),
    "mixed lengths": (b"".join(_s(b"x" * (i * 37 % 300)) for i in range(20_003)), 20_003),
    "longer than 64 KiB": (_s(b"a") + _s(b"b" * 70_000) + _s(b"") * 9_000, 9_002),
    "fewer than four": (_s(b"ab") * 3, 3),
}


@pytest.mark.parametrize("first_read", [gguf_reader._FIRST_READ, 4096])
@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_arrays_end_where_the_reference_walk_ends(
    tmp_path: Path, case: str, first_read: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gguf_reader, "_FIRST_READ", first_read)
    strings, count = CRAFTED[case]
    path, pos = _file(tmp_path, strings, count)
    data = path.read_bytes()
    assert _reference_walk(data, pos, count) == len(data)
    with FileSource(path) as fs:
        assert _skip(fs, pos, count) == len(data)
    assert _skip(BytesSource(data, str(path)), pos, count) == len(data)
    header = open_model(path).metadata["tokenizer.ggml.tokens"]
    values = header if isinstance(header, list) else header.values()
    assert len(values) == count


def _errors(path: Path) -> list[tuple[str, int | None]]:
    """The error of reading ``path`` as a local file and as a growing-buffer source."""
    out = []
    for src in (FileSource(path), BytesSource(path.read_bytes(), str(path))):
        with pytest.raises(GGUFError) as ei:
            read_header(src)
        src.close()
        assert ei.value.path == str(path)
        out.append((ei.value.detail, ei.value.offset))
    return out


BROKEN = {
    # (strings, claimed count, tail): each fails in the array
    "a lie in the second chunk": (_s(b"ab") * 10_000 + _s(b"c", 1 << 40) + _s(b"d") * 9, 10_010, b""),
    "a length near 2**64": (_s(b"ab") * 5 + _s(b"c", 2**64 - 9) + _s(b"d") * 99, 105, b""),
    "ends inside a length prefix": (_s(b"ab") * 12_345, 12_346, b"\x05\x00\x00"),
    "ends inside a string": (_s(b"ab") * 12_345 + _s(b"xyz")[:10], 12_346, b""),
    "more strings claimed than there are": (_s(b"ab") * 9_000, 9_001, b""),
}


@pytest.mark.parametrize("first_read", [gguf_reader._FIRST_READ, 4096])
@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_arrays_fail_like_the_reference_walk(
    tmp_path: Path, case: str, first_read: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gguf_reader, "_FIRST_READ", first_read)
    strings, count, tail = BROKEN[case]
    path, pos = _file(tmp_path, strings, count, tail)
    want = _reference_walk(path.read_bytes(), pos, count)
    assert isinstance(want, tuple), want  # the case really is broken
    message, offset = want
    if message.startswith("file ends"):
        message = f"file ends inside the header (file is {path.stat().st_size} bytes)"
    assert _errors(path) == [(message, offset)] * 2
