"""Broken and hostile GGUF files: each gives exactly one GGUFError naming the file and the offset.

Files are either written by GGUFWriter and patched, or written byte by byte with a tiny builder
(:class:`Raw`) whose output is first checked against GGUFWriter's.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import gguf
import numpy as np
import pytest

from offload_planner.core.errors import GGUFError
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
F32_T, Q4_0_T = 0, 2
HEADER_START = 24  # magic, version, n_tensors, n_kv


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def gstr(s: str | bytes, length: int | None = None) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return u64(len(b) if length is None else length) + b


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + u32(vtype) + payload


def kv_str(key: str, value: str | bytes) -> bytes:
    return kv(key, STR, gstr(value))


def kv_u32(key: str, value: int) -> bytes:
    return kv(key, U32, u32(value))


def kv_u16(key: str, value: int) -> bytes:
    return kv(key, U16, struct.pack("<H", value))


def kv_array(key: str, etype: int, count: int, payload: bytes = b"") -> bytes:
    return kv(key, ARR, u32(etype) + u64(count) + payload)


def tinfo(name: str | bytes, shape: list[int], type_id: int, offset: int) -> bytes:
    return gstr(name) + u32(len(shape)) + b"".join(map(u64, shape)) + u32(type_id) + u64(offset)


@dataclass
class Raw:
    """A GGUF file spelled out: key/values and tensor infos as bytes, then zero tensor data."""

    kvs: list[bytes] = field(
        default_factory=lambda: [
            kv_str("general.architecture", "llama"),
            kv_u32("llama.block_count", 1),
        ]
    )
    infos: list[bytes] = field(
        default_factory=lambda: [
            tinfo("token_embd.weight", [32, 2], F32_T, 0),  # 256 bytes
            tinfo("blk.0.attn_q.weight", [32, 4], Q4_0_T, 256),  # 4 rows of 18 bytes
            tinfo("output_norm.weight", [32], F32_T, 352),  # 128 bytes
        ]
    )
    magic: bytes = b"GGUF"
    version: int = 3
    n_tensors: int | None = None
    n_kv: int | None = None
    alignment: int = 32
    data_bytes: int = 480

    def kv_pos(self, i: int) -> int:
        return HEADER_START + sum(map(len, self.kvs[:i]))

    def info_pos(self, j: int) -> int:
        return HEADER_START + sum(map(len, self.kvs)) + sum(map(len, self.infos[:j]))

    def header(self) -> bytes:
        n_t = len(self.infos) if self.n_tensors is None else self.n_tensors
        n_kv = len(self.kvs) if self.n_kv is None else self.n_kv
        head = self.magic + u32(self.version) + u64(n_t) + u64(n_kv)
        return head + b"".join(self.kvs) + b"".join(self.infos)

    def build(self) -> bytes:
        head = self.header()
        pad = -len(head) % self.alignment
        return head + b"\0" * (pad + self.data_bytes)

    def write(self, path: Path) -> Path:
        path.write_bytes(self.build())
        return path


def _with_kv(raw: Raw, *extra: bytes) -> Raw:
    return replace(raw, kvs=[*raw.kvs, *extra])


def _expect(
    path: Path,
    match: str,
    offset: int | Callable[[int], bool] | None = None,
    *,
    name: Path | None = None,
) -> GGUFError:
    """open_model(path) raises exactly GGUFError naming ``name`` (default: path) and the offset."""
    with pytest.raises(Exception) as ei:
        open_model(path)
    err = ei.value
    assert type(err) is GGUFError, f"{type(err).__name__}: {err}"
    named = str(name or path)
    msg = str(err)
    assert err.path == named and msg.startswith(named), msg
    assert match.lower() in msg.lower(), msg
    if callable(offset):
        assert err.offset is not None and offset(err.offset), msg
        assert f"at byte {err.offset}:" in msg
    elif offset is not None:
        assert err.offset == offset, msg
        assert f"at byte {offset}:" in msg, msg
    return err


# --- GGUFWriter files and the builder --------------------------------------------------------


def _writer_file(path: Path, *, n_tokens: int = 300) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(2048)
    w.add_string("test.str", "text")
    w.add_array("test.ints", [1, 2, 3])
    w.add_token_list([f"tok{i}" for i in range(n_tokens)])
    w.add_tensor("token_embd.weight", np.zeros((2, 32), dtype=np.float32))
    w.add_tensor(
        "blk.0.attn_q.weight",
        np.zeros((4, 18), dtype=np.uint8),
        raw_dtype=gguf.GGMLQuantizationType.Q4_0,
    )
    w.add_tensor("output_norm.weight", np.zeros(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _header_end(path: Path) -> int:
    """End of the last tensor info (not the aligned data offset), parsed with struct."""
    data = path.read_bytes()
    n_t, n_kv = struct.unpack_from("<QQ", data, 8)
    pos = HEADER_START

    def string(p: int) -> int:
        return p + 8 + int(struct.unpack_from("<Q", data, p)[0])

    sizes = {U8: 1, I8: 1, U16: 2, I16: 2, U32: 4, I32: 4, F32: 4, BOOL: 1, U64: 8, I64: 8, F64: 8}

    def value(p: int, vt: int) -> int:
        if vt == STR:
            return string(p)
        if vt == ARR:
            et, n = struct.unpack_from("<IQ", data, p)
            p += 12
            for _ in range(n):
                p = value(p, et)
            return p
        return p + sizes[vt]

    for _ in range(n_kv):
        pos = string(pos)
        (vt,) = struct.unpack_from("<I", data, pos)
        pos = value(pos + 4, vt)
    for _ in range(n_t):
        pos = string(pos)
        (nd,) = struct.unpack_from("<I", data, pos)
        pos += 4 + 8 * nd + 4 + 8
    return pos


def _kv_positions(path: Path) -> dict[str, tuple[int, int]]:
    """key -> (position of the key, position of its value type), parsed with struct."""
    data = path.read_bytes()
    (n_kv,) = struct.unpack_from("<Q", data, 16)
    out: dict[str, tuple[int, int]] = {}
    pos = HEADER_START
    for _ in range(n_kv):
        (n,) = struct.unpack_from("<Q", data, pos)
        key = data[pos + 8 : pos + 8 + n].decode()
        vt_pos = pos + 8 + n
        out[key] = (pos, vt_pos)
        (vt,) = struct.unpack_from("<I", data, vt_pos)
        if vt != STR:  # the keys we patch come before any array; strings are walked below
            assert vt in (U32, U64, I32), key
            pos = vt_pos + 4 + (8 if vt == U64 else 4)
        else:
            (m,) = struct.unpack_from("<Q", data, vt_pos + 4)
            pos = vt_pos + 4 + 8 + m
        if len(out) == 3:
            break
    return out


def _at_most(cut: int) -> Callable[[int], bool]:
    return lambda off: 0 <= off <= cut


def _patched(src: Path, dst: Path, at: int, new: bytes) -> Path:
    data = bytearray(src.read_bytes())
    data[at : at + len(new)] = new
    dst.write_bytes(bytes(data))
    return dst


@pytest.fixture(scope="module")
def writer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _writer_file(tmp_path_factory.mktemp("bad") / "w.gguf")


def test_builder_writes_what_gguf_writer_writes(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(str(tmp_path / "w.gguf"), "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((2, 32), dtype=np.float32))
    w.add_tensor(
        "blk.0.attn_q.weight", np.zeros((4, 18), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q4_0
    )
    w.add_tensor("output_norm.weight", np.zeros(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours = Raw().build()
    assert (tmp_path / "w.gguf").read_bytes()[: len(ours)] == ours
    m = open_model(Raw().write(tmp_path / "r.gguf"))
    assert [t.name for t in m.tensors] == [
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "output_norm.weight",
    ]
    assert not m.header_only


def test_writer_file_is_valid(writer_file: Path) -> None:
    m = open_model(writer_file)
    assert len(m.tensors) == 3 and not m.header_only


# --- truncation -------------------------------------------------------------------------------


def test_every_truncation_inside_the_header_is_a_gguf_error(
    writer_file: Path, tmp_path: Path
) -> None:
    data = writer_file.read_bytes()
    end = _header_end(writer_file)
    cut_file = tmp_path / "cut.gguf"
    for cut in range(end):
        cut_file.write_bytes(data[:cut])
        _expect(cut_file, "", _at_most(cut))
    cut_file.write_bytes(data[:end])  # the header is whole: a header-only file
    assert open_model(cut_file).header_only


def test_truncations_of_a_header_longer_than_the_first_read(tmp_path: Path) -> None:
    big = _writer_file(tmp_path / "big.gguf", n_tokens=200_000)
    data = big.read_bytes()
    end = _header_end(big)
    assert end > 2 << 20
    cut_file = tmp_path / "cut.gguf"
    mib = 1 << 20
    for cut in (mib - 1, mib, mib + 1, 2 * mib - 3, 2 * mib + 5, end - 40, end - 1):
        cut_file.write_bytes(data[:cut])
        err = _expect(cut_file, "", _at_most(cut))
        if cut > 2 * mib:  # the token array fits: the reader grew its buffer and ran out
            assert err.offset is not None and err.offset > mib
    cut_file.write_bytes(data[:end])
    assert open_model(cut_file).header_only


def test_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    _expect(p, "ends inside the header", 0)


# --- magic and version ------------------------------------------------------------------------


@pytest.mark.parametrize("magic", [b"GGML", b"gguf", b"\0\0\0\0", b"FUGG", b"GGJT"])
def test_wrong_magic(writer_file: Path, tmp_path: Path, magic: bytes) -> None:
    _expect(_patched(writer_file, tmp_path / "m.gguf", 0, magic), "not a GGUF file", 0)


@pytest.mark.parametrize("version", [0, 1, 4, 99, 0xFFFFFFFF])
def test_unsupported_version(writer_file: Path, tmp_path: Path, version: int) -> None:
    p = _patched(writer_file, tmp_path / "v.gguf", 4, u32(version))
    _expect(p, f"unsupported GGUF version {version}", 4)


@pytest.mark.parametrize("version", [2, 3])
def test_big_endian_version_field(writer_file: Path, tmp_path: Path, version: int) -> None:
    p = _patched(writer_file, tmp_path / "be.gguf", 4, struct.pack(">I", version))
    _expect(p, "big-endian", 4)


def test_big_endian_file_from_gguf_writer(tmp_path: Path) -> None:
    p = tmp_path / "be.gguf"
    w = gguf.GGUFWriter(str(p), "llama", endianess=gguf.GGUFEndian.BIG)
    w.add_block_count(1)
    w.add_tensor("output_norm.weight", np.zeros(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _expect(p, "big-endian", 4)


# --- counts and lengths -----------------------------------------------------------------------


@pytest.mark.parametrize("count", [2**60, 2**64 - 1, 2**32])
def test_absurd_tensor_count(writer_file: Path, tmp_path: Path, count: int) -> None:
    _expect(_patched(writer_file, tmp_path / "t.gguf", 8, u64(count)), f"tensor count {count}", 8)


@pytest.mark.parametrize("count", [2**60, 2**64 - 1, 2**32])
def test_absurd_kv_count(writer_file: Path, tmp_path: Path, count: int) -> None:
    _expect(
        _patched(writer_file, tmp_path / "k.gguf", 16, u64(count)), f"metadata count {count}", 16
    )


def test_huge_key_length(writer_file: Path, tmp_path: Path) -> None:
    p = _patched(writer_file, tmp_path / "s.gguf", HEADER_START, u64(2**40))
    _expect(p, "string length 1099511627776", HEADER_START)


def test_huge_string_value_length(writer_file: Path, tmp_path: Path) -> None:
    _, vt_at = _kv_positions(writer_file)["general.architecture"]
    p = _patched(writer_file, tmp_path / "s.gguf", vt_at + 4, u64(2**40))
    _expect(p, "value of 'general.architecture': string length", vt_at + 4)


def test_huge_tensor_name_length(tmp_path: Path) -> None:
    raw = Raw()
    raw.infos[1] = u64(2**40) + raw.infos[1][8:]
    _expect(raw.write(tmp_path / "n.gguf"), "tensor name: string length", raw.info_pos(1))


def test_huge_string_in_a_string_array(tmp_path: Path) -> None:
    raw = _with_kv(
        Raw(), kv_array("tokens", STR, 3, gstr("a") + gstr("b", length=2**40) + gstr("c"))
    )
    pos = raw.kv_pos(2) + 8 + len("tokens") + 4 + 12 + 9
    _expect(raw.write(tmp_path / "a.gguf"), "string 1 of an array: length", pos)


@pytest.mark.parametrize(
    ("etype", "payload"),
    [(U8, b""), (F64, b""), (STR, b""), (ARR, b""), (U64, b"\0" * 64), (STR, gstr("x") * 3)],
)
def test_huge_array_fails_fast_without_allocating(
    tmp_path: Path, etype: int, payload: bytes
) -> None:
    raw = _with_kv(Raw(), kv_array("huge", etype, 2**40, payload))
    p = raw.write(tmp_path / "h.gguf")
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        _expect(p, "'huge'", raw.kv_pos(2) + 8 + len("huge") + 4)
    finally:
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert elapsed < 1.0
    assert peak < p.stat().st_size + (1 << 20)


def test_huge_array_in_a_big_file_still_fails_fast(tmp_path: Path) -> None:
    """Even when the file is large, a count that cannot fit is refused before any allocation."""
    raw = _with_kv(Raw(), kv_array("huge", U32, 2**60))
    p = tmp_path / "h.gguf"
    with p.open("wb") as f:
        f.write(raw.build())
        f.truncate(64 << 20)  # sparse: 64 MiB of zeros after the header
    t0 = time.perf_counter()
    _expect(p, "cannot fit", raw.kv_pos(2) + 8 + len("huge") + 4)
    assert time.perf_counter() - t0 < 1.0


def _sparse(path: Path, head: bytes, size: int) -> Path:
    with path.open("wb") as f:
        f.write(head)
        f.truncate(size)  # no disk used: the rest reads as zeros
    return path


def _peak_bytes(fn: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        fn()
    except GGUFError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


def test_string_length_within_a_huge_file_is_not_read_into_memory(tmp_path: Path) -> None:
    """A 3 GiB string in a 4 GiB (sparse) file: refused, not copied (it used to be MemoryError)."""
    raw = _with_kv(Raw(), kv("general.name", STR, gstr("x", length=3 << 30)))
    p = _sparse(tmp_path / "s.gguf", raw.header(), 4 << 30)
    t0 = time.perf_counter()
    _expect(p, "a length field is corrupt", lambda off: off > raw.kv_pos(2))
    assert time.perf_counter() - t0 < 1.0
    assert _peak_bytes(lambda: open_model(p)) < 4 << 20


def test_string_array_length_past_the_end_of_a_huge_file(tmp_path: Path) -> None:
    """A bad length inside a long string array is found without reading the file to its end."""
    strings = gstr("a") + gstr("b", length=1 << 40) + gstr("c") * 20_000
    raw = _with_kv(Raw(), kv_array("tokenizer.ggml.tokens", STR, 20_002, strings))
    p = _sparse(tmp_path / "a.gguf", raw.header(), 4 << 30)
    pos = raw.kv_pos(2) + 8 + len("tokenizer.ggml.tokens") + 4 + 12 + 9
    t0 = time.perf_counter()
    _expect(p, "string 1 of an array: length 1099511627776 runs past the end", pos)
    assert time.perf_counter() - t0 < 1.0
    assert _peak_bytes(lambda: open_model(p)) < 8 << 20


def test_string_length_near_2_64_in_a_string_array(tmp_path: Path) -> None:
    """The walk past such a length overflows a C ssize_t (it used to raise OverflowError)."""
    strings = gstr("a", length=2**64 - 9) + gstr("b") * 3
    raw = _with_kv(Raw(), kv_array("tokenizer.ggml.tokens", STR, 4, strings))
    pos = raw.kv_pos(2) + 8 + len("tokenizer.ggml.tokens") + 4 + 12
    _expect(raw.write(tmp_path / "o.gguf"), "string 0 of an array: length", pos)


def test_nested_arrays_too_deep(tmp_path: Path) -> None:
    inner = u32(ARR) + u64(1)
    payload = inner * 3 + u32(U8) + u64(1) + b"\1"
    raw = _with_kv(Raw(), kv_array("deep", ARR, 1, payload))
    _expect(raw.write(tmp_path / "d.gguf"), "nested array", lambda off: off > raw.kv_pos(2))


def test_absurd_tensor_shape(tmp_path: Path) -> None:
    for shape in ([2**62, 1], [2**31, 2**31, 2**31, 2**31]):
        raw = Raw()
        raw.infos[0] = tinfo("token_embd.weight", shape, F32_T, 0)
        _expect(raw.write(tmp_path / "s.gguf"), "absurd shape", raw.info_pos(0))


# --- types ------------------------------------------------------------------------------------


@pytest.mark.parametrize("vtype", [13, 99, 2**32 - 1])
def test_unknown_value_type(writer_file: Path, tmp_path: Path, vtype: int) -> None:
    _, vt_at = _kv_positions(writer_file)["llama.block_count"]
    p = _patched(writer_file, tmp_path / "vt.gguf", vt_at, u32(vtype))
    _expect(p, f"unknown value type {vtype}", vt_at)


def test_unknown_array_element_type(tmp_path: Path) -> None:
    raw = _with_kv(Raw(), kv_array("arr", 13, 1, b"\0" * 8))
    _expect(
        raw.write(tmp_path / "a.gguf"), "unknown array element type 13", raw.kv_pos(2) + 8 + 3 + 4
    )


@pytest.mark.parametrize("type_id", [4, 5, 37, 1000, 2**32 - 1])
def test_unknown_tensor_type(tmp_path: Path, type_id: int) -> None:
    raw = Raw()
    raw.infos[2] = tinfo("output_norm.weight", [32], type_id, 352)
    _expect(raw.write(tmp_path / "t.gguf"), f"unknown ggml type id {type_id}", raw.info_pos(2))


def test_row_length_not_a_multiple_of_the_block_size(tmp_path: Path) -> None:
    raw = Raw()
    raw.infos[1] = tinfo("blk.0.attn_q.weight", [33, 4], Q4_0_T, 256)
    _expect(raw.write(tmp_path / "r.gguf"), "row length 33 is not a multiple", raw.info_pos(1))


def test_more_than_four_dimensions(tmp_path: Path) -> None:
    raw = Raw()
    raw.infos[0] = tinfo("token_embd.weight", [32, 2, 1, 1, 1], F32_T, 0)
    _expect(raw.write(tmp_path / "d.gguf"), "5 dimensions", raw.info_pos(0))


# --- duplicates, overlaps, alignment ----------------------------------------------------------


def test_duplicate_tensor_names(tmp_path: Path) -> None:
    raw = Raw()
    raw.infos[2] = tinfo("token_embd.weight", [32], F32_T, 352)
    _expect(
        raw.write(tmp_path / "d.gguf"), "duplicate tensor name 'token_embd.weight'", raw.info_pos(2)
    )


def test_duplicate_keys(tmp_path: Path) -> None:
    raw = _with_kv(Raw(), kv_u32("llama.block_count", 2))
    _expect(
        raw.write(tmp_path / "k.gguf"), "duplicate metadata key 'llama.block_count'", raw.kv_pos(2)
    )


def test_overlapping_tensor_data(tmp_path: Path) -> None:
    raw = Raw()
    raw.infos[1] = tinfo("blk.0.attn_q.weight", [32, 4], Q4_0_T, 224)  # token_embd ends at 256
    _expect(raw.write(tmp_path / "o.gguf"), "overlaps tensor 'token_embd.weight'", raw.info_pos(1))


def test_two_tensors_at_the_same_offset(tmp_path: Path) -> None:
    raw = Raw()
    raw.infos[2] = tinfo("output_norm.weight", [32], F32_T, 0)
    _expect(
        raw.write(tmp_path / "o.gguf"),
        "overlaps",
        lambda off: off in (raw.info_pos(0), raw.info_pos(2)),
    )


@pytest.mark.parametrize("offset", [1, 16, 100, 2**63 + 1])
def test_misaligned_tensor_offset(tmp_path: Path, offset: int) -> None:
    raw = Raw()
    raw.infos[2] = tinfo("output_norm.weight", [32], F32_T, offset)
    _expect(
        raw.write(tmp_path / "a.gguf"), f"data offset {offset} not aligned to 32", raw.info_pos(2)
    )


def test_misaligned_with_a_custom_alignment(tmp_path: Path) -> None:
    raw = _with_kv(Raw(alignment=64), kv_u32("general.alignment", 64))
    raw.infos[1] = tinfo("blk.0.attn_q.weight", [32, 4], Q4_0_T, 288)  # 32-aligned only
    _expect(raw.write(tmp_path / "a.gguf"), "not aligned to 64", raw.info_pos(1))


@pytest.mark.parametrize("alignment", [0, 3, 48])
def test_alignment_not_a_power_of_two(tmp_path: Path, alignment: int) -> None:
    raw = _with_kv(Raw(), kv_u32("general.alignment", alignment))
    _expect(raw.write(tmp_path / "a.gguf"), "not a power of two", raw.info_pos(0))


# --- names ------------------------------------------------------------------------------------


def test_non_utf8_tensor_name(tmp_path: Path) -> None:
    raw = Raw()
    raw.infos[1] = tinfo(b"blk.0.\xff\xfe.weight", [32, 4], Q4_0_T, 256)
    _expect(raw.write(tmp_path / "u.gguf"), "tensor name: not valid UTF-8", raw.info_pos(1))


def test_non_utf8_key(tmp_path: Path) -> None:
    raw = _with_kv(Raw(), kv(b"general.\xc3(", U32, u32(1)))
    _expect(raw.write(tmp_path / "u.gguf"), "metadata key: not valid UTF-8", raw.kv_pos(2))


def test_non_utf8_string_value(tmp_path: Path) -> None:
    raw = _with_kv(Raw(), kv_str("general.name", b"bad \xe2\x82"))
    pos = raw.kv_pos(2) + 8 + len("general.name") + 4
    _expect(raw.write(tmp_path / "u.gguf"), "not valid UTF-8", pos)


def test_tensor_name_too_long_for_ggml(tmp_path: Path) -> None:
    """llama.cpp refuses names of GGML_MAX_NAME (64) bytes or more; so do we."""
    raw = Raw()
    raw.infos[0] = tinfo("blk." + "9" * 5000 + ".attn_q.weight", [32, 2], F32_T, 0)
    _expect(raw.write(tmp_path / "n.gguf"), "too long", raw.info_pos(0))
    raw.infos[0] = tinfo("x" * 63, [32, 2], F32_T, 0)
    assert open_model(raw.write(tmp_path / "ok.gguf")).tensors[0].name == "x" * 63


# --- metadata values the file cannot back --------------------------------------------------------


def _with_value(key: str, vtype: int, payload: bytes) -> Raw:
    """The default file with ``key`` set (replacing it when the builder already has it)."""
    raw = Raw()
    raw.kvs = [k for k in raw.kvs if not k.startswith(gstr(key))] + [kv(key, vtype, payload)]
    return raw


@pytest.mark.parametrize("blocks", [2**31 - 1, 2**32 - 1, 513])
def test_block_count_beyond_llama_max_layers_fails_fast(tmp_path: Path, blocks: int) -> None:
    """2^31-1 blocks used to take 260 s and then a MemoryError (a per-layer tuple of 2^31)."""
    raw = _with_value("llama.block_count", U32, u32(blocks))
    t0 = time.monotonic()
    err = _expect(raw.write(tmp_path / "b.gguf"), f"'llama.block_count': {blocks} blocks", raw.kv_pos(1))
    assert "at most 512 (LLAMA_MAX_LAYERS)" in str(err)
    assert time.monotonic() - t0 < 2


def test_block_count_of_512_is_accepted(tmp_path: Path) -> None:
    raw = _with_value("llama.block_count", U32, u32(512))
    assert open_model(raw.write(tmp_path / "b.gguf")).summary.n_layer == 512


@pytest.mark.parametrize(
    ("key", "vtype", "payload", "fragment"),
    [
        ("llama.leading_dense_block_count", F32, struct.pack("<f", float("inf")), "inf is a float"),
        ("llama.attention.head_count_kv", F32, struct.pack("<f", float("nan")), "nan is a float"),
        ("llama.attention.head_count", F64, struct.pack("<d", -float("inf")), "-inf is a float"),
        ("llama.context_length", U64, u64(2**40), "1099511627776 is out of range"),
        ("llama.embedding_length", I32, struct.pack("<i", -4096), "-4096 is out of range"),
        ("llama.expert_count", STR, gstr("eight"), "'eight' is a str"),
        ("llama.attention.head_count_kv", ARR, u32(U32) + u64(600) + u32(8) * 600, "array of 600 values"),
        ("llama.feed_forward_length", ARR, u32(F32) + u64(1) + struct.pack("<f", float("nan")),
         "nan is a float"),
        ("llama.attention.head_count_kv", ARR, u32(U32) + u64(3) + u32(8) * 3,
         "array of 3 values where llama.cpp wants one per layer (block_count 1)"),
        ("llama.nextn_predict_layers", U32, u32(2), "2 NextN layers: more than block_count (1)"),
        ("llama.attention.sliding_window_pattern", ARR, u32(BOOL) + u64(513) + b"\1" * 513,
         "array of 513 values"),
    ],
)
def test_metadata_values_llama_cpp_cannot_read_name_the_key(
    tmp_path: Path, key: str, vtype: int, payload: bytes, fragment: str
) -> None:
    """inf/NaN where a count belongs used to escape as OverflowError/ValueError from summary.py."""
    raw = _with_value(key, vtype, payload)
    if key.endswith("sliding_window_pattern"):
        raw.kvs.insert(1, kv_u32("llama.attention.sliding_window", 128))
    at = next(i for i, k in enumerate(raw.kvs) if k.startswith(gstr(key)))
    _expect(raw.write(tmp_path / "v.gguf"), f"key {key!r}: {fragment}", raw.kv_pos(at))


def _unblock_fifo_later(path: Path) -> threading.Timer:
    """If the reader blocks opening the FIFO, open its other end after a while so that the test
    fails on the message instead of hanging."""

    def open_writer() -> None:
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    timer = threading.Timer(5.0, open_writer)
    timer.start()
    return timer


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_fifo_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    timer = _unblock_fifo_later(fifo)
    try:
        t0 = time.monotonic()
        err = _expect(fifo, "is a FIFO (named pipe), not a GGUF file")
        assert time.monotonic() - t0 < 2 and err.offset is None
    finally:
        timer.cancel()


def test_directory_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    err = _expect(tmp_path, "is a directory, not a GGUF file")
    assert str(err) == f"{tmp_path}: is a directory, not a GGUF file"


@pytest.mark.skipif(not Path("/dev/null").exists(), reason="no /dev/null")
def test_character_device_is_refused() -> None:
    _expect(Path("/dev/null"), "is a character device, not a GGUF file")


# --- split models -----------------------------------------------------------------------------


def _shards(
    tmp_path: Path,
    count: int = 3,
    *,
    skip: tuple[int, ...] = (),
    split_count: dict[int, int] | None = None,
    split_no: dict[int, int] | None = None,
    tensors_count: int | None = None,
    prefix: str = "m",
) -> list[Path]:
    paths = []
    for i in range(count):
        p = tmp_path / f"{prefix}-{i + 1:05d}-of-{count:05d}.gguf"
        paths.append(p)
        if i in skip:
            continue
        kvs = [
            kv_str("general.architecture", "llama"),
            kv_u16("split.no", (split_no or {}).get(i, i)),
            kv_u16("split.count", (split_count or {}).get(i, count)),
            kv("split.tensors.count", I32, struct.pack("<i", tensors_count or count)),
        ]
        Raw(
            kvs=kvs, infos=[tinfo(f"blk.{i}.attn_norm.weight", [32], F32_T, 0)], data_bytes=128
        ).write(p)
    return paths


def test_valid_split_model_opens(tmp_path: Path) -> None:
    paths = _shards(tmp_path)
    for p in paths:
        m: Model = open_model(p)
        assert [s.path for s in m.shards] == [str(q) for q in paths]


def test_split_model_with_a_missing_shard_names_it(tmp_path: Path) -> None:
    paths = _shards(tmp_path, skip=(1,))
    for opened in (paths[0], paths[2]):
        err = _expect(opened, "missing part 2 of 3", name=paths[1])
        assert paths[1].name in str(err)


def test_a_shard_that_is_a_dangling_or_looping_link_says_so(tmp_path: Path) -> None:
    """``ls`` lists a Hugging Face cache's snapshot links whose blob is missing, and a link that loops:
    "missing part 2 of 3" alone read as a lie; the message now says what the file is (newcomer4)."""
    paths = _shards(tmp_path, skip=(1,))
    blob = tmp_path / "blobs" / "0123abcd"
    paths[1].symlink_to(blob)
    err = _expect(paths[0], "missing part 2 of 3", name=paths[1])
    assert str(err).endswith(f"a symbolic link to {blob}, which does not exist (an interrupted download?)")
    paths[1].unlink()
    paths[1].symlink_to(paths[1].name)
    err = _expect(paths[0], "missing part 2 of 3", name=paths[1])
    assert str(err).endswith(f"a symbolic link that loops ({paths[1]} -> {paths[1].name})"), str(err)


def test_split_model_with_several_missing_shards(tmp_path: Path) -> None:
    paths = _shards(tmp_path, 4, skip=(0, 2))
    _expect(paths[1], "1 more parts missing", name=paths[0])


def test_inconsistent_split_count(tmp_path: Path) -> None:
    paths = _shards(tmp_path, split_count={1: 4})
    _expect(paths[0], "split.count is 4", name=paths[1])


def test_split_count_disagrees_with_the_file_name(tmp_path: Path) -> None:
    paths = _shards(tmp_path, split_count={0: 2})
    _expect(paths[0], "file name says 3 parts but split.count says 2")


def test_wrong_split_no(tmp_path: Path) -> None:
    paths = _shards(tmp_path, split_no={2: 1})
    _expect(paths[0], "split.no is 1, expected 2", name=paths[2])


def test_split_tensor_count_mismatch(tmp_path: Path) -> None:
    paths = _shards(tmp_path, tensors_count=7)
    _expect(paths[0], "split.tensors.count is 7 but the 3 parts hold 3", name=paths[0])


def test_split_model_with_an_unrecognised_name(tmp_path: Path) -> None:
    paths = _shards(tmp_path)
    odd = tmp_path / "renamed.gguf"
    paths[0].rename(odd)
    _expect(odd, "cannot be found")


def test_same_tensor_in_two_shards(tmp_path: Path) -> None:
    paths = _shards(tmp_path, 2)
    kvs = [
        kv_str("general.architecture", "llama"),
        kv_u16("split.no", 1),
        kv_u16("split.count", 2),
        kv("split.tensors.count", I32, struct.pack("<i", 2)),
    ]
    Raw(kvs=kvs, infos=[tinfo("blk.0.attn_norm.weight", [32], F32_T, 0)], data_bytes=128).write(
        paths[1]
    )
    _expect(paths[0], "also in", name=paths[1])
