"""Fuzzing the header reader: mutated real headers give a Model or a GGUFError, nothing else.

The base files are written by GGUFWriter (every value type, lazy arrays, several tensor
types).  Mutations: byte flips, truncations, inserted and deleted bytes, and length/count fields
overwritten with huge or off-by-one values.  Each example must finish quickly (deadline).
"""

from __future__ import annotations

import random
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.support.deadline import deadline
from tests.support.fuzz import Tally, run_budget

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


_BYTES_TALLY = Tally("header byte-mutation fuzz")


@pytest.fixture(scope="module", autouse=True)
def _report_byte_mutations() -> Iterator[None]:
    """Print how many byte-mutated headers the hypothesis tests tried and how they ended."""
    _BYTES_TALLY.t0 = time.monotonic()
    yield
    if _BYTES_TALLY.tried:
        sys.stdout.write(_BYTES_TALLY.report() + "\n")


def _check(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    with deadline(10):  # a hang fails the example instead of the whole run
        try:
            model = open_model(path)
        except GGUFError as e:
            assert e.path == str(path)
            assert str(e).startswith(str(path))
            _BYTES_TALLY.counts["GGUFError"] += 1
            return
        _touch(model)
    _BYTES_TALLY.counts["model"] += 1


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


# --- metadata values: extreme, non-finite and mistyped values, then what `inspect` and `plan` do ---

_U64 = struct.Struct("<Q")
_PACK = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_INT_TYPES = (0, 1, 2, 3, 4, 5, 10, 11)
_EXTREME_INTS = [0, 1, 2, 3, 7, 63, 64, 511, 512, 513, 4096, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53 + 1,
                 2**63 - 1, 2**63, 2**64 - 1, -1, -2, -(2**31), -(2**63)]
_FLOATS = [float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 0.5, 3.0, 1e308, -1e308, 5e-324, 2.0**64]
#: Keys the planner reads (``{a}`` is the architecture), plus ones that change the code path.
_KEYS = [
    "{a}.block_count", "{a}.embedding_length", "{a}.feed_forward_length", "{a}.attention.head_count",
    "{a}.attention.head_count_kv", "{a}.attention.key_length", "{a}.attention.value_length",
    "{a}.context_length", "{a}.expert_count", "{a}.expert_used_count", "{a}.expert_shared_count",
    "{a}.expert_feed_forward_length", "{a}.leading_dense_block_count", "{a}.nextn_predict_layers",
    "{a}.attention.sliding_window", "{a}.attention.sliding_window_pattern", "{a}.attention.q_lora_rank",
    "{a}.attention.kv_lora_rank", "{a}.attention.key_length_mla", "{a}.attention.value_length_mla",
    "{a}.rope.dimension_count", "{a}.expert_gating_func", "{a}.expert_group_count",
    "{a}.expert_group_used_count", "{a}.expert_weights_scale", "{a}.expert_weights_norm",
    "{a}.final_logit_softcapping", "{a}.vocab_size", "{a}.attention.key_length_swa",
    "{a}.attention.value_length_swa", "general.architecture", "general.alignment", "general.file_type",
    "split.count", "split.no",
]
_ARCHS = ["llama", "qwen3moe", "deepseek2", "glm4moe", "gpt-oss", "gemma3", "gemma2", "unknown-arch", ""]


def _kv_spans(data: bytes) -> dict[str, tuple[int, int, int]]:
    """key -> (start of the key/value pair, start of its value type, end of its value)."""
    (n_kv,) = struct.unpack_from("<Q", data, 16)
    pos, out = 24, {}

    def value(p: int, vt: int) -> int:
        if vt == STR:
            return p + 8 + int(_U64.unpack_from(data, p)[0])
        if vt == ARR:
            et, n = struct.unpack_from("<IQ", data, p)
            p += 12
            if et != STR and et != ARR:
                return p + n * _SCALAR_SIZES[et]
            for _ in range(n):
                p = value(p, et)
            return p
        return p + _SCALAR_SIZES[vt]

    for _ in range(n_kv):
        start = pos
        (n,) = _U64.unpack_from(data, pos)
        key = data[pos + 8 : pos + 8 + n].decode()
        vt_pos = pos + 8 + n
        end = value(vt_pos + 4, struct.unpack_from("<I", data, vt_pos)[0])
        out[key] = (start, vt_pos, end)
        pos = end
    return out


def _scalar(vtype: int, v: object) -> bytes:
    fmt = _PACK[vtype]
    if vtype in _INT_TYPES:
        bits = struct.calcsize(fmt) * 8
        n = int(v) % (1 << bits)  # type: ignore[call-overload]
        if fmt[1].islower() and n >= 1 << (bits - 1):
            n -= 1 << bits
        return struct.pack(fmt, n)
    if vtype == 7:
        return struct.pack(fmt, bool(v))
    f = float(v)  # type: ignore[arg-type]
    if vtype == 6 and abs(f) > 3.4e38 and f == f:
        f = f * float("inf")  # past float32: its infinity
    return struct.pack(fmt, f)


def _typed_value(rng: random.Random) -> bytes:
    """A GGUF value type and payload: extreme ints in every int type, non-finite floats, bools,
    strings, arrays (empty, long, of extreme values, of strings, nested), or a wrong count."""
    kind = rng.choice(["int", "int", "float", "float", "bool", "str", "arr", "arr", "badcount"])
    if kind == "int":
        vt = rng.choice(_INT_TYPES)
        return struct.pack("<I", vt) + _scalar(vt, rng.choice(_EXTREME_INTS))
    if kind == "float":
        vt = rng.choice((6, 12))
        return struct.pack("<I", vt) + _scalar(vt, rng.choice(_FLOATS))
    if kind == "bool":
        return struct.pack("<I", 7) + bytes([rng.choice((0, 1, 2, 255))])
    if kind == "str":
        s = rng.choice(["", "llama", "deepseek2", "x" * 300, "\u00e9", "inf", "nan", "1e9"]).encode()
        return struct.pack("<IQ", STR, len(s)) + s
    if kind == "badcount":
        return struct.pack("<IIQ", ARR, rng.choice((4, 6, 8)), rng.choice(_EXTREME_INTS[9:19]) % 2**64)
    et = rng.choice((4, 5, 6, 7, 10, 12, STR, ARR))
    n = rng.choice((0, 1, 2, 3, 4, 61, 512, 513, 600))
    if et == STR:
        body = b"".join(struct.pack("<Q", 1) + b"a" for _ in range(n))
    elif et == ARR:
        body = b"".join(struct.pack("<IQ", 4, 1) + struct.pack("<I", 7) for _ in range(min(n, 4)))
        n = min(n, 4)
    else:
        pool = _FLOATS if et in (6, 12) else _EXTREME_INTS
        body = b"".join(_scalar(et, rng.choice(pool)) for _ in range(n))
    return struct.pack("<IIQ", ARR, et, n) + body


def _mutate_metadata(data: bytes, rng: random.Random) -> tuple[bytes, list[str]]:
    """Replace, add or drop 1 to 3 metadata values (keys the planner reads); returns what changed."""
    spans = _kv_spans(data)
    arch = str(open_arch(data, spans))
    (n_kv,) = struct.unpack_from("<Q", data, 16)
    out = bytearray(data)
    what: list[str] = []
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(_KEYS).format(a=arch)
        action = rng.choice(["set", "set", "set", "drop"])
        try:
            spans = _kv_spans(bytes(out))
        except (struct.error, OverflowError, KeyError, UnicodeDecodeError):
            break  # an earlier mutation left an array count the file cannot hold: enough
        if key == "general.architecture" and action == "set":
            s = rng.choice(_ARCHS).encode()
            payload = struct.pack("<IQ", STR, len(s)) + s
        else:
            payload = _typed_value(rng)
        if key in spans:
            start, vt_pos, end = spans[key]
            out[start if action == "drop" else vt_pos : end] = b"" if action == "drop" else payload
            n_kv -= action == "drop"
        elif action == "set":
            at = max((e for _, _, e in spans.values()), default=24)
            out[at:at] = struct.pack("<Q", len(key)) + key.encode() + payload
            n_kv += 1
        struct.pack_into("<Q", out, 16, n_kv)
        what.append(f"{action} {key}={payload[:24]!r}")
    return bytes(out), what


def open_arch(data: bytes, spans: dict[str, tuple[int, int, int]]) -> str:
    _, vt_pos, end = spans["general.architecture"]
    return data[vt_pos + 12 : end].decode()


def _plan_outcome(model: Model) -> str:
    """What `inspect` and `plan` do with a model: only our own errors may escape.  Like `plan` (and
    the window's loader: ``loadable.open_loadable``), a model llama.cpp refuses to load is refused
    before it is planned (a mutated expert_used_count of 4294967294 otherwise built graphs of that
    many experts until memory ran out)."""
    from offload_planner.core.analysis import analyse_command
    from offload_planner.core.cmdline import parse_server_args
    from offload_planner.core.devices import Device, DeviceKind, DeviceSet
    from offload_planner.core.errors import PlannerError
    from offload_planner.core.inspect_report import model_json, text_report
    from offload_planner.core.loadable import load_error

    text_report(model)
    model_json(model)
    if load_error(model) is not None:
        return "plan: refused at load"
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 << 30, 64 << 30),
                        (Device("CUDA0", DeviceKind.CUDA, 24 << 30, 24 << 30),))
    try:
        analyse_command(model, devices, parse_server_args(["-c", "4096", "-ngl", "3"]).args)
    except PlannerError as e:
        return f"plan: {type(e).__name__}"
    return "plan: projected"


@pytest.fixture(scope="module")
def synth_headers(small_models: dict[str, Path]) -> list[bytes]:
    """The header (and a little data) of every small catalogue model, one per architecture."""
    out = []
    for path in small_models.values():
        data = path.read_bytes()
        out.append(data[: _fields(data)[1] + 64])
    return out


def test_mutated_metadata_values_only_raise_our_errors(synth_headers: list[bytes], workdir: Path) -> None:
    """Extreme ints, inf/NaN, wrong types and bad arrays where the planner reads hyperparameters:
    open_model, the inspect report and a projection give a result or our own error, each fast."""
    path = workdir / "meta.gguf"

    def make(rng: random.Random) -> tuple[bytes, list[str]]:
        return _mutate_metadata(rng.choice(synth_headers), rng)

    def check(case: tuple[bytes, list[str]]) -> str:
        path.write_bytes(case[0])
        try:
            model = open_model(path)
        except GGUFError as e:
            assert e.path == str(path) and str(e).startswith(str(path))
            return "GGUFError"
        _touch(model)
        return _plan_outcome(model)

    tally = run_budget("metadata fuzz", make, check, seed=2026, seconds=12)
    assert tally.tried >= 20 and tally.counts["GGUFError"] > 0 and tally.counts["plan: projected"] > 0, \
        tally.report()
