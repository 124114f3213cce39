"""Fast GGUF header reader: metadata and tensor infos, never tensor data.

Big string arrays (``tokenizer.ggml.tokens``, ``merges``) are skipped by walking their length
prefixes; they are recorded as :class:`LazyArray` (type, length, offset) and decoded only on request.
Every count and length is checked against the bytes the file actually has before anything is
allocated, so a hostile header fails fast with a :class:`GGUFError` naming the file and offset.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from offload_planner.core.byte_source import ByteSource, FileSource, is_url
from offload_planner.core.dsa import nextn_tensor_loaded
from offload_planner.core.errors import GGUFError
from offload_planner.core.ggml_types import Flavor, detect_flavor, resolve_type
from offload_planner.core.model import Model, Shard, Tensor
from offload_planner.core.roles import Role, classify

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4
#: llama.cpp refuses tensor names of this many bytes or more (``GGML_MAX_NAME``).
GGML_MAX_NAME = 64
#: Arrays up to this many elements are decoded at once; longer ones stay lazy.
EAGER_ARRAY_LIMIT = 4096
_FIRST_READ = 1 << 20
#: No real header comes near this; a length field that needs more is corrupt (and reading it would
#: copy gigabytes of a big model into memory).
MAX_HEADER_BYTES = 1 << 30
_SKIP_CHUNK = 8192

# GGUF value types
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = (
    range(13)
)
_SCALAR: dict[int, struct.Struct] = {
    UINT8: struct.Struct("<B"),
    INT8: struct.Struct("<b"),
    UINT16: struct.Struct("<H"),
    INT16: struct.Struct("<h"),
    UINT32: struct.Struct("<I"),
    INT32: struct.Struct("<i"),
    FLOAT32: struct.Struct("<f"),
    BOOL: struct.Struct("<?"),
    UINT64: struct.Struct("<Q"),
    INT64: struct.Struct("<q"),
    FLOAT64: struct.Struct("<d"),
}
_TYPE_NAMES = {
    UINT8: "uint8", INT8: "int8", UINT16: "uint16", INT16: "int16", UINT32: "uint32",
    INT32: "int32", FLOAT32: "float32", BOOL: "bool", STRING: "string", ARRAY: "array",
    UINT64: "uint64", INT64: "int64", FLOAT64: "float64",
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class _Truncated(Exception):
    """Internal: the buffer ended; carries the offset that could not be read."""

    def __init__(self, offset: int) -> None:
        self.offset = offset


@dataclass(frozen=True, slots=True)
class LazyArray:
    """A GGUF array kept undecoded: its element type, length, and where it lies in the header."""

    elem_type: int
    count: int
    offset: int  # offset of the first element in the file
    _buf: bytes | mmap.mmap  # bytes once the array outlives the reading of its file
    _base: int = 0  # file offset of ``_buf[0]``

    @property
    def type_name(self) -> str:
        return _TYPE_NAMES.get(self.elem_type, str(self.elem_type))

    def __len__(self) -> int:
        return self.count

    def values(self) -> list[object]:
        """Decode every element (strings with invalid UTF-8 are decoded with replacement)."""
        return list(self.iter())

    def iter(self) -> Iterator[object]:
        buf, pos = self._buf, self.offset - self._base
        if self.elem_type == STRING:
            for _ in range(self.count):
                (n,) = _U64.unpack_from(buf, pos)
                pos += 8
                yield bytes(buf[pos : pos + n]).decode("utf-8", "replace")
                pos += n
        else:
            st = _SCALAR[self.elem_type]
            for v in st.iter_unpack(buf[pos : pos + st.size * self.count]):
                yield v[0]

    def __repr__(self) -> str:
        return f"<{self.type_name}[{self.count}]>"


@dataclass(frozen=True, slots=True)
class RawTensorInfo:
    name: str
    shape: tuple[int, ...]
    type_id: int
    offset: int  # relative to the data section
    info_offset: int  # where the tensor info starts in the file (for messages)


@dataclass(frozen=True, slots=True)
class Header:
    """One file's parsed header."""

    path: str
    version: int
    metadata: dict[str, object]
    tensors: list[RawTensorInfo]
    alignment: int
    data_offset: int
    file_size: int
    key_offsets: dict[str, int]  # metadata key -> offset of its key/value pair


class _Cursor:
    """Reads little-endian values from a byte source, fetching more of it as the header grows.

    A local file is read in place through its memory map (nothing is copied while walking the
    header); any other source is read into a ``bytes`` buffer that doubles as the header grows.
    Either way only the first ``have`` bytes count as read: ``grow`` raises exactly where a
    buffer read of the file would (past its end, or past :data:`MAX_HEADER_BYTES`).
    """

    def __init__(self, src: ByteSource) -> None:
        self.src = src
        self.size = src.size
        self.buf: bytes | mmap.mmap
        whole = src.buffer() if isinstance(src, FileSource) else None
        if isinstance(whole, mmap.mmap):
            self.buf = whole
            self.have = min(self.size, MAX_HEADER_BYTES)
        else:
            self.buf = src.read(0, min(self.size, _FIRST_READ))
            self.have = len(self.buf)
        self.pos = 0

    def fail(self, message: str, offset: int | None = None) -> GGUFError:
        return GGUFError(self.src.name, message, self.pos if offset is None else offset)

    def grow(self, needed_end: int) -> None:
        """Make ``buf`` hold at least ``needed_end`` bytes, or raise truncation."""
        have = self.have
        if needed_end <= have:
            return
        if needed_end > self.size:
            raise _Truncated(min(needed_end, self.size))
        if needed_end > MAX_HEADER_BYTES:
            raise self.fail(
                f"the header would need {needed_end} bytes (over {MAX_HEADER_BYTES >> 20} MiB): "
                "a length field is corrupt"
            )
        want = min(self.size, MAX_HEADER_BYTES, max(needed_end, have * 2))
        more = self.src.read(have, want - have)
        if len(more) < needed_end - have:
            raise _Truncated(have + len(more))
        assert isinstance(self.buf, bytes)  # a memory map already holds all it may
        self.buf += more
        self.have = len(self.buf)

    def take(self, st: struct.Struct) -> int:
        end = self.pos + st.size
        if end > self.have:
            self.grow(end)
        (v,) = st.unpack_from(self.buf, self.pos)
        self.pos = end
        return v

    def raw(self, n: int) -> bytes:
        end = self.pos + n
        if end > self.have:
            self.grow(end)
        b = self.buf[self.pos : end]
        self.pos = end
        return b

    def skip(self, n: int) -> None:
        """Step over ``n`` bytes (checked like :meth:`raw`, without copying them)."""
        end = self.pos + n
        if end > self.have:
            self.grow(end)
        self.pos = end

    def keep(self, start: int) -> tuple[bytes, int]:
        """A copy of the bytes from ``start`` to the cursor (it outlives the source and its
        memory map; the same for every kind of source), and their file offset."""
        return self.buf[start : self.pos], start

    def string(self, what: str) -> str:
        start = self.pos
        n = self.take(_U64)
        if n > self.size - self.pos:
            raise self.fail(f"{what}: string length {n} runs past the end of the file", start)
        data = self.raw(n)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what}: not valid UTF-8: {data[:40]!r}", start) from None

    def skip_strings(self, count: int) -> None:
        """Walk ``count`` length-prefixed strings without decoding them.

        Chunks of strings are walked by :func:`_walk_strings`, a tight loop with no bounds
        checks; a chunk that fails (it runs past the bytes read so far, or a length is corrupt)
        is walked again carefully, growing the buffer and checking every length against the
        file size, so that errors name the same string and offset whatever the chunking.
        """
        done = 0
        while done < count:
            k = min(_SKIP_CHUNK, count - done)
            pos = _walk_strings(self.buf, self.pos, k, self.have)
            if pos < 0:
                pos = self._skip_strings_checked(k, done)
            self.pos = pos
            done += k

    def _skip_strings_checked(self, k: int, done: int) -> int:
        """Walk ``k`` strings one by one from ``self.pos``; after each growth of the buffer the
        rest of the chunk is tried with the fast walk again (it reads nothing, so the reads and
        errors are those of the careful walk alone)."""
        unpack = _U64.unpack_from
        pos = self.pos
        for i in range(k):
            have = self.have
            self.grow(pos + 8)
            (n,) = unpack(self.buf, pos)
            if n > self.size - pos - 8:
                raise self.fail(
                    f"string {done + i} of an array: length {n} runs past the end of the file", pos
                )
            self.grow(pos + 8 + n)
            pos += 8 + n
            if self.have != have:
                end = _walk_strings(self.buf, pos, k - i - 1, self.have)
                if end >= 0:
                    return end
        return pos


def _walk_strings(buf: bytes | mmap.mmap, pos: int, k: int, have: int) -> int:
    """The offset after ``k`` length-prefixed strings from ``pos``, or -1 if they do not all lie
    within the first ``have`` bytes of ``buf`` (no check inside the loop: a read past ``buf``
    raises ``struct.error``, a huge length ``OverflowError``). Unrolled by 4 for speed."""
    unpack = _U64.unpack_from
    try:
        for _ in range(k >> 2):
            pos += 8 + unpack(buf, pos)[0]
            pos += 8 + unpack(buf, pos)[0]
            pos += 8 + unpack(buf, pos)[0]
            pos += 8 + unpack(buf, pos)[0]
        for _ in range(k & 3):
            pos += 8 + unpack(buf, pos)[0]
    except (struct.error, OverflowError):  # OverflowError: a huge length, pos >= 2**63
        return -1
    return pos if pos <= have else -1


def _value(cur: _Cursor, vtype: int, key: str) -> object:
    st = _SCALAR.get(vtype)
    if st is not None:
        return cur.take(st)
    if vtype == STRING:
        return cur.string(f"value of {key!r}")
    if vtype == ARRAY:
        return _array(cur, key)
    raise cur.fail(f"key {key!r}: unknown value type {vtype}", cur.pos - 4)


def _array(cur: _Cursor, key: str) -> object:
    start = cur.pos
    etype = cur.take(_U32)
    count = cur.take(_U64)
    remaining = cur.size - cur.pos
    if etype == STRING:
        if count > remaining // 8:
            raise cur.fail(f"key {key!r}: array of {count} strings cannot fit in the file", start)
        first = cur.pos
        cur.skip_strings(count)
        if count <= EAGER_ARRAY_LIMIT:
            return LazyArray(STRING, count, first, cur.buf).values()
        return LazyArray(STRING, count, first, *cur.keep(first))
    if etype == ARRAY:  # gguf.cpp: "key '...' has invalid GGUF type 9", the file refused
        raise cur.fail(f"key {key!r}: a nested array (an array of arrays), which llama.cpp refuses", start)
    st = _SCALAR.get(etype)
    if st is None:
        raise cur.fail(f"key {key!r}: unknown array element type {etype}", start)
    if count > remaining // st.size:
        raise cur.fail(f"key {key!r}: array of {count} {_TYPE_NAMES[etype]} cannot fit", start)
    first = cur.pos
    cur.skip(count * st.size)
    if count <= EAGER_ARRAY_LIMIT:
        return LazyArray(etype, count, first, cur.buf).values()
    return LazyArray(etype, count, first, *cur.keep(first))


def read_header(src: ByteSource) -> Header:
    """Parse one GGUF file's header from ``src``."""
    cur = _Cursor(src)
    try:
        return _read_header(cur)
    except _Truncated as t:
        raise GGUFError(
            src.name, f"file ends inside the header (file is {src.size} bytes)", t.offset
        ) from None


def _what_it_is(name: str, head: bytes) -> str:
    """What a file that is not a GGUF is, where its start says ("" when it does not): a Hugging Face
    ``/blob/`` link is the file's web page (the browser's address of a model, the link to give is
    ``/resolve/``); a file of text starting with ``<`` or ``{`` is a web page or a JSON error saved as
    the model (other text, a README given as the model, keeps the plain message)."""
    import os
    from urllib.parse import urlsplit

    if is_url(name):
        parts = urlsplit(name)
        hosts = {"huggingface.co", "hf.co", urlsplit(os.environ.get("HF_ENDPOINT", "").strip()).hostname}
        if parts.hostname in hosts and "/blob/" in parts.path:
            fixed = parts._replace(path=parts.path.replace("/blob/", "/resolve/", 1)).geturl()
            return f"; a Hugging Face /blob/ link is the file's web page: give the download link, {fixed}"
    text = head[:80].decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    if len(head) < 16 or not text.startswith(("<", "{")):  # HTML or a JSON error; other text as before
        return ""
    if not all(ch.isprintable() or ch in "\t\r\n" for ch in text):
        return ""
    start = " ".join(text.split())[:60]
    return f"; it starts with text ({start!r}...): a web page or an error message, not a model"


def _read_header(cur: _Cursor) -> Header:
    magic = cur.raw(4)
    if magic != GGUF_MAGIC:
        raise cur.fail(f"not a GGUF file (magic {magic!r}, expected b'GGUF')"
                       + _what_it_is(cur.src.name, bytes(cur.buf[:min(cur.have, 200)])), 0)
    version = cur.take(_U32)
    if version not in (2, 3):
        if version & 0xFFFF == 0 and version >> 16:
            raise cur.fail("big-endian GGUF files are not supported", 4)
        raise cur.fail(f"unsupported GGUF version {version} (2 and 3 are supported)", 4)
    n_tensors = cur.take(_U64)
    n_kv = cur.take(_U64)
    # A tensor info takes at least 8+1+4+8+4+8 bytes, a KV at least 8+1+4+1.
    if n_tensors > cur.size // 33:
        raise cur.fail(f"tensor count {n_tensors} is impossible for a {cur.size}-byte file", 8)
    if n_kv > cur.size // 14:
        raise cur.fail(f"metadata count {n_kv} is impossible for a {cur.size}-byte file", 16)

    metadata: dict[str, object] = {}
    key_offsets: dict[str, int] = {}
    for _ in range(n_kv):
        at = cur.pos
        key = cur.string("metadata key")
        if not key:  # gguf.cpp: "key N is empty", the file refused
            raise cur.fail("a metadata key is empty, which llama.cpp refuses", at)
        vtype = cur.take(_U32)
        if key in metadata:
            raise cur.fail(f"duplicate metadata key {key!r}", at)
        metadata[key] = _value(cur, vtype, key)
        key_offsets[key] = at
        if key == "general.alignment" and vtype != UINT32:  # gguf.cpp refuses the file
            raise cur.fail(f"general.alignment is a {_TYPE_NAMES.get(vtype, vtype)}; llama.cpp reads only a "
                           "uint32 there and refuses the file", at)

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise cur.fail(f"general.alignment {alignment!r} is not a power of two")

    tensors: list[RawTensorInfo] = []
    seen: set[str] = set()
    for _ in range(n_tensors):
        at = cur.pos
        name = cur.string("tensor name")
        if len(name.encode("utf-8")) >= GGML_MAX_NAME:
            raise cur.fail(f"tensor name {name[:40]!r}... is too long (llama.cpp: < 64 bytes)", at)
        # ggml keeps a C string (gguf.cpp: ggml_set_name(&info.t, name.c_str())): the name ends at a NUL
        name = name.split("\0", 1)[0]
        if name in seen:
            raise cur.fail(f"duplicate tensor name {name!r}", at)
        seen.add(name)
        n_dims = cur.take(_U32)
        if n_dims > GGML_MAX_DIMS:
            raise cur.fail(f"tensor {name!r}: {n_dims} dimensions (at most 4)", at)
        shape = tuple(cur.take(_U64) for _ in range(n_dims))
        n = 1
        for d in shape:
            n *= d
        if any(d >= 1 << 62 for d in shape) or n >= 1 << 62:
            raise cur.fail(f"tensor {name!r}: absurd shape {list(shape)}", at)
        type_id = cur.take(_U32)
        offset = cur.take(_U64)
        if offset % alignment:
            raise cur.fail(f"tensor {name!r}: data offset {offset} not aligned to {alignment}", at)
        tensors.append(RawTensorInfo(name, shape or (1,), type_id, offset, at))

    data_offset = -(-cur.pos // alignment) * alignment
    return Header(cur.src.name, version, metadata, tensors, alignment, data_offset, cur.size, key_offsets)


def _resolve_tensors(
    header: Header, shard_index: int, flavor: Flavor | None, n_layer_trunk: int | None
) -> tuple[list[Tensor], int]:
    """Typed tensors of one shard and the end of their data relative to the data section."""
    out: list[Tensor] = []
    arch = str(header.metadata.get("general.architecture", ""))
    for raw in header.tensors:
        gtype = resolve_type(raw.type_id, flavor)
        if gtype is None:
            tree = f" in {flavor.value}" if flavor else ""
            raise GGUFError(
                header.path,
                f"tensor {raw.name!r} has unknown ggml type id {raw.type_id}{tree}",
                raw.info_offset,
            )
        if raw.shape[0] % gtype.block_size:
            raise GGUFError(
                header.path,
                f"tensor {raw.name!r}: row length {raw.shape[0]} is not a multiple of "
                f"{gtype.name}'s block size {gtype.block_size}",
                raw.info_offset,
            )
        nbytes = gtype.nbytes(raw.shape)
        layer, role = classify(raw.name, n_layer_trunk)
        if role is Role.NEXTN and layer is not None and nextn_tensor_loaded(arch, raw.name, layer):
            layer, role = classify(raw.name)  # loaded without MTP too (core.dsa)
        out.append(
            Tensor(raw.name, raw.shape, gtype, nbytes, shard_index,
                   header.data_offset + raw.offset, layer, role)
        )
    end = 0
    prev: Tensor | None = None
    for t in sorted(out, key=lambda t: t.offset):
        if prev is not None and t.offset < prev.offset + prev.nbytes:
            raw_prev = t.offset - header.data_offset
            raise GGUFError(
                header.path,
                f"tensor {t.name!r} (data offset {raw_prev}) overlaps tensor {prev.name!r}",
                next(r.info_offset for r in header.tensors if r.name == t.name),
            )
        prev = t
        end = max(end, t.offset + t.nbytes - header.data_offset)
    _check_contiguous(header, out)
    return out, end


def _check_contiguous(header: Header, tensors: list[Tensor]) -> None:
    """gguf.cpp (every build since 2023) refuses a file whose tensors' data are not laid out one after
    the other in the order of their infos, each padded to the alignment: "tensor '...' has offset X,
    expected Y" (a gap, or infos in another order than the data)."""
    expected = 0
    for raw, t in zip(header.tensors, tensors, strict=True):
        if raw.offset != expected:
            raise GGUFError(
                header.path,
                f"tensor {raw.name!r} has data offset {raw.offset}, where llama.cpp expects {expected} (each "
                f"tensor's data right after the one before it, padded to {header.alignment} bytes): "
                "llama.cpp refuses the file",
                raw.info_offset,
            )
        expected += -(-t.nbytes // header.alignment) * header.alignment


def _shard(header: Header, data_end: int) -> Shard:
    return Shard(
        path=header.path,
        file_size=header.file_size,
        data_offset=header.data_offset,
        data_bytes=data_end,
        header_only=header.file_size < header.data_offset + data_end,
        version=header.version,
        alignment=header.alignment,
        n_tensors=len(header.tensors),
    )


def _open_source(location: str) -> ByteSource:
    if is_url(location):
        from offload_planner.core.remote import HttpRangeSource

        return HttpRangeSource(location)
    return FileSource(location)


def read_file_header(location: str | Path) -> Header:
    src = _open_source(str(location))
    try:
        return read_header(src)
    finally:
        src.close()


def _n_layer_trunk(md: dict[str, object]) -> int | None:
    arch = md.get("general.architecture")
    n = md.get(f"{arch}.block_count")
    if not isinstance(n, int):
        return None
    nextn = md.get(f"{arch}.nextn_predict_layers", 0)
    return n - (nextn if isinstance(nextn, int) else 0)


def open_model(
    location: str | Path, *, progress: Callable[[int, int], None] | None = None
) -> Model:
    """Open a GGUF model from a path or http(s) URL; any shard of a split model opens all of them.

    ``progress(done, total)`` is called after each shard's header is read.
    """
    from offload_planner.core.split import shard_locations

    location = str(location)
    first = read_file_header(location)
    locations = shard_locations(location, first)
    headers: list[Header] = []
    for i, loc in enumerate(locations):
        headers.append(first if loc == location else read_file_header(loc))
        if progress is not None:
            progress(i + 1, len(locations))
    from offload_planner.core.split import check_shards

    check_shards(headers)
    metadata = headers[0].metadata
    flavor = detect_flavor(r.type_id for h in headers for r in h.tensors)
    trunk = _n_layer_trunk(metadata)
    tensors: list[Tensor] = []
    shards: list[Shard] = []
    seen: dict[str, str] = {}
    for i, h in enumerate(headers):
        ts, end = _resolve_tensors(h, i, flavor, trunk)
        for t in ts:
            if t.name in seen:
                raise GGUFError(h.path, f"tensor {t.name!r} is also in {seen[t.name]}")
            seen[t.name] = h.path
        tensors.extend(ts)
        shards.append(_shard(h, end))
    model = Model(path=location, shards=shards, metadata=metadata, tensors=tensors, flavor=flavor,
                  key_offsets=headers[0].key_offsets)
    _ = model.summary  # hyperparameters the file cannot back fail here, as one GGUFError
    return model

