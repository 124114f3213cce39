"""Pure parser of llama.cpp / ik_llama.cpp server logs: buffer sizes, hparams, readiness, failures.

Accepts old and new function prefixes (``llm_load_tensors``/``load_tensors``,
``llama_kv_cache_unified``/``llama_kv_cache``/``llama_kv_cache_init``,
``llama_context``/``llama_init_from_model``/``sched_reserve``) and the optional
``M.SS.mmm.uuu L`` timestamp prefix of current builds.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

_PREFIX = r"^(?:\d+\.\d+\.\d+\.\d+ [IWEDT] )?"
_BUFFER_RE = re.compile(
    _PREFIX + r"(?P<func>\w+):\s+(?P<name>\S+)\s+(?P<kind>model |KV |RS |compute | output |)"
    r"buffer size =\s*(?P<mib>[\d.]+) MiB"
)
_INFO_RE = re.compile(_PREFIX + r"(?:print_info|llm_load_print_meta): (?P<key>[\w ]+?)\s*= (?P<value>.*)$")
_META_RE = re.compile(
    _PREFIX + r"llama_model_loader: loaded meta data with (?P<kv>\d+) key-value pairs and "
    r"(?P<tensors>\d+) tensors"
)
_LISTEN_RE = re.compile(
    r"(listening on (?P<url>\S+))|(server is listening on (?P<url2>\S+))|"
    r"(HTTP server listening.*?port=\"?(?P<port>\d+))"
)
_RPC_NAME_RE = re.compile(r"^RPC\d*\[(?P<endpoint>[^\]]+)\]$")

#: Buffer types that live in host RAM.
HOST_BUFFERS = {"CPU", "CPU_Mapped", "CPU_REPACK", "CUDA_Host", "ROCm_Host", "SYCL_Host", "Vulkan_Host"}

_KIND = {"model ": "model", "KV ": "kv", "RS ": "rs", "compute ": "compute", " output ": "output"}


@dataclass(frozen=True)
class BufferLine:
    buffer: str  # as logged: CUDA0, CPU_Mapped, RPC0[127.0.0.1:50052], ...
    kind: str  # model | kv | rs | compute | output
    mib: float
    line_no: int

    @property
    def bytes_approx(self) -> int:
        return round(self.mib * 1024 * 1024)


@dataclass
class LoadReport:
    """What a server log said about the load."""

    buffers: list[BufferLine] = field(default_factory=list)
    info: dict[str, str] = field(default_factory=dict)
    n_kv: int | None = None
    n_tensors: int | None = None
    listening_url: str | None = None
    errors: list[str] = field(default_factory=list)

    def by_device(self, resolve: dict[str, str] | None = None) -> dict[str, dict[str, float]]:
        """MiB per device and kind; host buffers count for CPU; ``resolve`` maps RPC endpoints to
        device names (``127.0.0.1:50052`` -> ``RPC1``)."""
        out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for b in self.buffers:
            out[device_of_buffer(b.buffer, resolve)][b.kind] += b.mib
        return {d: dict(k) for d, k in out.items()}

    def by_buffer(self) -> dict[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = defaultdict(float)
        for b in self.buffers:
            out[(b.buffer, b.kind)] += b.mib
        return dict(out)


def device_of_buffer(name: str, resolve: dict[str, str] | None = None) -> str:
    if name in HOST_BUFFERS:
        return "CPU"
    m = _RPC_NAME_RE.match(name)
    if m:
        return (resolve or {}).get(m["endpoint"], name)
    return name


_ERROR_MARKERS = (
    "error loading model", "failed to load model", "out of memory", "failed to allocate",
    "unknown buffer type", "invalid argument", "error while handling argument", "unknown argument",
    "failed to initialize the context", "exiting due to model loading error",
)


def parse_log(lines: Iterable[str]) -> LoadReport:
    rep = LoadReport()
    for no, raw in enumerate(lines, 1):
        line = raw.rstrip("\n")
        m = _BUFFER_RE.search(line)
        if m:
            rep.buffers.append(BufferLine(m["name"], _KIND.get(m["kind"], "model"), float(m["mib"]), no))
            continue
        m = _META_RE.search(line)
        if m:
            rep.n_kv, rep.n_tensors = int(m["kv"]), int(m["tensors"])
            continue
        m = _INFO_RE.search(line)
        if m:
            rep.info.setdefault(m["key"].strip(), m["value"].strip())
            continue
        m = _LISTEN_RE.search(line)
        if m and rep.listening_url is None:
            rep.listening_url = m["url"] or m["url2"] or f"http://127.0.0.1:{m['port']}"
            continue
        low = line.lower()
        if any(k in low for k in _ERROR_MARKERS):
            rep.errors.append(line)
    return rep
