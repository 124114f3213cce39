"""Fuzzing the header reader: mutated real headers give a Model or a GGUFError, nothing else.

The base files are written by GGUFWriter (every value type, nested and lazy arrays, several tensor
types).  Mutations: byte flips, truncations, inserted and deleted bytes, and length/count fields
overwritten with huge or off-by-one values.  Each example must finish quickly (deadline).
"""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offload_planner.core.errors import GGUFError
from offload_planner.core.gguf_reader import LazyArray, open_model
from offload_planner.core.model import Model

STR, ARR = 8, 9
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
Q = gguf.GGMLQuantizationType


def _write_base(path: Path, *, n_tokens: int) -> Path:
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv([2, 4])
    w.add_expert_count(4)
    w.add_expert_used_count(2)
    w.add_uint8("t.u8", 7)
    w.add_int8("t.i8", -7)
    w.add_uint16("t.u16", 65535)
    w.add_int16("t.i16", -300)
    w.add_int32("t.i32", -70000)
    w.add_int64("t.i64", -(2**40))
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_float32("t.f32", 0.5)
    w.add_float64("t.f64", 1e-300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_array("t.strs", ["a", "bc", ""])
    w.add_token_list([f"t{i}" for i in range(n_tokens)])
    w.add_token_scores([0.5] * 4200)  # > 4096: a lazy float array
    w.add_tensor("token_embd.weight", np.zeros((8, 64), dtype=np.float16))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), dtype=np.float32))
    w.add_tensor("blk.0.ffn_gate_inp.weight", np.zeros((4, 2 * 34), np.uint8), raw_dtype=Q.Q8_0)
    w.add_tensor("blk.1.ffn_up_exps.weight", np.zeros((4, 2, 144), np.uint8), raw_dtype=Q.Q4_K)
    w.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


class Base:
    """A valid file's bytes and where its header's fields are (not a dataclass: short reprs)."""

    def __init__(self, data: bytes, fields: tuple[tuple[int, int], ...], header_end: int) -> None:
        self.data = data
        self.fields = fields  # (offset, width) of every length, count and id field
        self.header_end = header_end

    def __repr__(self) -> str:  # keep hypothesis' reports short
        return f"Base({len(self.data)} bytes, header ends at {self.header_end})"


def _fields(data: bytes) -> tuple[tuple[tuple[int, int], ...], int]:
    """Offsets of the header's length/count/type fields, found by walking it with struct."""
    out: list[tuple[int, int]] = [(8, 8), (16, 8)]
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    pos = 24

    def string(p: int) -> int:
        out.append((p, 8))
        return p + 8 + int(struct.unpack_from("<Q", data, p)[0])

    def value(p: int, vt: int, depth: int = 0) -> int:
        if vt == STR:
            return string(p) if depth < 2 else p + 8 + struct.unpack_from("<Q", data, p)[0]
        if vt == ARR:
            out.extend([(p, 4), (p + 4, 8)])
            et, n = struct.unpack_from("<IQ", data, p)
            p += 12
            for _ in range(n):
                p = value(p, et, depth + 1)
            return p
        return p + _SCALAR_SIZES[vt]

    for _ in range(n_kv):
        pos = string(pos)
        out.append((pos, 4))
        pos = value(pos + 4, struct.unpack_from("<I", data, pos)[0])
    for _ in range(n_tensors):
        pos = string(pos)
        (nd,) = struct.unpack_from("<I", data, pos)
        out.append((pos, 4))
        out.extend((pos + 4 + 8 * i, 8) for i in range(nd))
        pos += 4 + 8 * nd
        out.extend([(pos, 4), (pos + 4, 8)])
        pos += 12
    return tuple(out), pos


def _base(path: Path, n_tokens: int) -> Base:
    data = _write_base(path, n_tokens=n_tokens).read_bytes()
    fields, end = _fields(data)
    return Base(data, fields, end)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def small(workdir: Path) -> Base:
    return _base(workdir / "small.gguf", 300)


@pytest.fixture(scope="module")
def lazy(workdir: Path) -> Base:
    return _base(workdir / "lazy.gguf", 5000)


HUGE = st.sampled_from(
    [2**64 - 1, 2**63, 2**62, 2**40, 2**32, 2**32 - 1, 2**31, 65, 64, 13, 5, 1, 0]
)


@st.composite
def mutations(draw: st.DrawFn, base: Base) -> bytes:
    """1 to 4 mutations, positions biased towards the header's fields and its start and end."""
    data = bytearray(base.data[: base.header_end + draw(st.integers(0, 64))])
    for _ in range(draw(st.integers(1, 4))):
        last = max(len(data) - 1, 0)
        kind = draw(st.sampled_from(["flip", "field", "field", "cut", "insert", "delete"]))
        pos = draw(
            st.one_of(
                st.integers(0, last),
                st.integers(0, min(96, last)),
                st.integers(min(max(base.header_end - 300, 0), last), last),
            )
        )
        if kind == "flip" and data:
            data[pos] ^= draw(st.integers(1, 255))
        elif kind == "field":
            off, width = draw(st.sampled_from(base.fields))
            v = draw(st.one_of(HUGE, st.integers(0, 2**64 - 1)))
            if draw(st.booleans()):  # off by a little from the real value
                v = int.from_bytes(data[off : off + width], "little") + draw(st.integers(-3, 3))
            if off + width <= len(data):
                data[off : off + width] = (v % (1 << (8 * width))).to_bytes(width, "little")
        elif kind == "cut":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        else:
            del data[pos : pos + draw(st.integers(1, 16))]
    return bytes(data)


def _touch(model: Model) -> None:
    """What callers do with a model must not fail either."""
    assert model.total_bytes >= 0
    _ = model.header_only, model.file_bytes, model.type_histogram(), model.role_bytes()
    for v in model.metadata.values():
        if isinstance(v, LazyArray):
            v.values()


def _check(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    try:
        model = open_model(path)
    except GGUFError as e:
        assert e.path == str(path)
        assert str(e).startswith(str(path))
        return
    _touch(model)


_SETTINGS = settings(
    max_examples=300,
    deadline=2000,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def test_base_files_are_valid(small: Base, lazy: Base) -> None:
    for base in (small, lazy):
        assert base.data[:4] == b"GGUF" and len(base.fields) > 40


@_SETTINGS
@given(data=st.data())
def test_mutated_headers_only_raise_gguf_error(
    small: Base, workdir: Path, data: st.DataObject
) -> None:
    _check(workdir / "m.gguf", data.draw(mutations(small)))


@settings(_SETTINGS, max_examples=100)
@given(data=st.data())
def test_mutated_lazy_arrays_only_raise_gguf_error(
    lazy: Base, workdir: Path, data: st.DataObject
) -> None:
    _check(workdir / "l.gguf", data.draw(mutations(lazy)))


@_SETTINGS
@given(cut=st.integers(0, 4000), extra=st.binary(max_size=64))
def test_truncated_and_padded_headers_only_raise_gguf_error(
    small: Base, workdir: Path, cut: int, extra: bytes
) -> None:
    _check(workdir / "t.gguf", small.data[: min(cut, small.header_end)] + extra)


def test_random_bytes_after_the_magic(workdir: Path) -> None:
    rng = np.random.default_rng(1234)
    for n in (0, 1, 7, 24, 100, 5000):
        for _ in range(20):
            _check(workdir / "r.gguf", b"GGUF\x03\0\0\0" + rng.bytes(n))
