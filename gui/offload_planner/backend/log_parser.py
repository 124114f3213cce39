"""Pure parser of llama.cpp / ik_llama.cpp server logs: buffer sizes, hparams, readiness, failures.

Accepts old and new function prefixes (``llm_load_tensors``/``load_tensors``,
``llama_kv_cache_unified``/``llama_kv_cache``/``llama_kv_cache_init``,
``llama_context``/``llama_init_from_model``/``sched_reserve``) and the optional
``M.SS.mmm.uuu L`` timestamp prefix of current builds.

:func:`parse_log` reads a whole log; :class:`LogAccumulator` reads one line at a time (a running
server) and says which load stage a line marks (:func:`load_stage`). Also here: the level of a line
(:func:`line_level`), the devices llama.cpp says it uses with their free memory, the memory
breakdown table printed at exit, and allocation failures that name a device (:class:`OomEvent`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from offload_planner.core.units import MiB

_PREFIX = r"^(?:\d+\.\d+\.\d+\.\d+ [IWEDT] )?"
_BUFFER_RE = re.compile(
    _PREFIX + r"(?P<func>\w+):\s+(?P<name>\S+)\s+(?P<kind>model |KV |RS |DSV4 \w+ state |compute | output |)"
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
_IK_HOST_RE = re.compile(r'hostname="(?P<host>[^"]+)"')
_RPC_NAME_RE = re.compile(r"^RPC\d*\[(?P<endpoint>[^\]]+)\]$")
#: the pinned build's other Metal buffer types, on their device MTL<i>: mmap'd weights (``MTL0_Mapped``,
#: ggml-metal.cpp:462, what the weights land in with mmap: llama-model.cpp:1856 ``buffer_from_host_ptr``)
#: and the private type of a GPU without unified memory (``MTL0_Private``, ggml-metal.cpp:384); the 2025
#: builds' one Metal device ``Metal`` has them as ``Metal_Mapped`` / ``Metal_Private``
_METAL_BUFFER_RE = re.compile(r"^(?P<device>MTL\d+|Metal)_(?:Mapped|Private)$")
_DEVICE_RE = re.compile(
    r"using device (?P<name>\S+) \((?P<desc>[^)]*)\)(?: \([^)]*\))? - (?P<free>\d+) MiB free"
)
_LEVEL_RE = re.compile(r"^\d+\.\d+\.\d+\.\d+ (?P<level>[IWEDT]) ")
_IK_LEVEL_RE = re.compile(r"^(?P<level>INFO|WARN|ERR|VERB|DEBUG) \[")
_CLIP_DEVICE_RE = re.compile(r"clip_ctx: CLIP using (?:(?P<name>\S+) backend|CPU backend)")
_CLIP_MODEL_RE = re.compile(r"load_hparams: model size:\s+(?P<mib>[\d.]+) MiB")
_BREAKDOWN_RE = re.compile(r"(?:common|llama)_memory_breakdown_print: \|\s*(?P<body>.*)\|\s*$")

#: Buffer types that live in host RAM.
HOST_BUFFERS = {"CPU", "CPU_Mapped", "CPU_REPACK", "CUDA_Host", "ROCm_Host", "SYCL_Host", "Vulkan_Host"}

_KIND = {"model ": "model", "KV ": "kv", "RS ": "rs", "compute ": "compute", " output ": "output"}
#: DeepSeek V4's compressor states (``llama_dsv4_comp_state``: ``<buft> DSV4 csa state buffer size``),
#: per-sequence rows the planner counts as recurrent state (core.compressed_kv)
_STATE_RE = re.compile(r"^DSV4 \w+ state $")

#: At most this many error lines are kept (a server in a loop must not grow memory).
MAX_ERRORS = 200
#: At most this many buffer, device, allocation-failure and print_info lines are kept (a load logs
#: dozens; a server printing them in a loop grew the report by 200 bytes a line for as long as it ran)
MAX_RECORDS = 10_000
#: At most this many rows of the memory breakdown (one per device and the host); a repeated row was
#: moved with a copy of the table, so 20,000 distinct rows took 5 s and 100,000 two minutes
MAX_BREAKDOWN_ROWS = 256


@dataclass(frozen=True)
class BufferLine:
    buffer: str  # as logged: CUDA0, CPU_Mapped, RPC0[127.0.0.1:50052], ...
    kind: str  # model | kv | rs | compute | output
    mib: float
    line_no: int

    @property
    def bytes_approx(self) -> int:
        return round(self.mib * MiB)


@dataclass(frozen=True)
class LoggedDevice:
    """``using device RPC0 (127.0.0.1:50052) (unknown id) - 24105 MiB free``."""

    name: str
    description: str
    free_mib: int


@dataclass(frozen=True)
class BreakdownRow:
    """One row of the memory breakdown table llama.cpp prints at exit (MiB; None where blank)."""

    name: str  # "CUDA0 (RTX 4090)", "RPC0 (127.0.0.1:50052)", "Host", or a buffer type
    total: int | None
    free: int | None
    self_: int
    model: int
    context: int
    compute: int
    unaccounted: int | None


@dataclass(frozen=True)
class OomEvent:
    """An allocation that failed, with the device it names when the line says.

    ``device`` is a device name (``CUDA1``, ``CPU``) or a logged buffer name (``RPC0[host:port]``,
    resolve it with :func:`device_of_buffer`); ``kind`` is model | kv | compute | None (unknown
    yet; later lines of the same failure fill it in :attr:`LoadReport.oom`).
    """

    device: str | None
    mib: float | None
    kind: str | None
    line: str
    runtime: bool = False  # "CUDA error: out of memory" while serving, not while loading


@dataclass(frozen=True)
class Stage:
    """A load milestone: the fraction of the load it marks and a label for a progress bar."""

    fraction: float
    label: str


@dataclass
class LoadReport:
    """What a server log said about the load."""

    buffers: list[BufferLine] = field(default_factory=list)
    info: dict[str, str] = field(default_factory=dict)
    n_kv: int | None = None
    n_tensors: int | None = None
    listening_url: str | None = None
    errors: list[str] = field(default_factory=list)
    devices: list[LoggedDevice] = field(default_factory=list)
    breakdown: list[BreakdownRow] = field(default_factory=list)
    oom: list[OomEvent] = field(default_factory=list)
    model_loaded: bool = False

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

    def rpc_endpoints(self) -> dict[str, str]:
        """Endpoint -> device name from the ``using device RPCi (host:port)`` lines."""
        return {d.description: d.name for d in self.devices if d.name.startswith("RPC")}


def device_of_buffer(name: str, resolve: dict[str, str] | None = None) -> str:
    if name in HOST_BUFFERS:
        return "CPU"
    m = _RPC_NAME_RE.match(name)
    if m:
        return (resolve or {}).get(m["endpoint"], name)
    m = _METAL_BUFFER_RE.match(name)
    return m["device"] if m else name


_ERROR_MARKERS = (
    "error loading model", "failed to load model", "out of memory", "failed to allocate",
    "unknown buffer type", "invalid argument", "error while handling argument", "unknown argument",
    "failed to initialize the context", "exiting due to model loading error", "insufficient memory",
    "failed to open gguf file", "failed to create context",
)

# --- levels -----------------------------------------------------------------------------------

_ERROR_WORDS = ("error", "failed", "out of memory", "fatal", "abort", "exception", "segmentation fault")
_WARN_WORDS = ("warning", "warn:", "deprecated")


def line_level(line: str) -> str:
    """``E``, ``W``, ``I``, ``D`` or ``T``: the ``M.SS.mmm.uuu L`` prefix's level, ik's ``INFO [``/
    ``WARN [``/``ERR [``, else keywords (error/failed -> E, warning -> W), else ``I``."""
    m = _LEVEL_RE.match(line)
    if m:
        return m["level"]
    m = _IK_LEVEL_RE.match(line)
    if m:
        return {"INFO": "I", "WARN": "W", "ERR": "E", "VERB": "D", "DEBUG": "D"}[m["level"]]
    low = line.lower()
    if any(w in low for w in _ERROR_WORDS):
        return "E"
    if any(w in low for w in _WARN_WORDS):
        return "W"
    return "I"


# --- load stages --------------------------------------------------------------------------------

#: (substring, fraction, label) in load order; the first matching substring wins.
_STAGES: tuple[tuple[str, float, str], ...] = (
    ("load_model: loading model", 0.05, "opening the model"),
    ("loaded meta data with", 0.10, "reading the GGUF header"),
    ("using device", 0.12, "choosing devices"),
    ("loading model tensors", 0.20, "loading weights"),
    ("llm_load_tensors: ggml ctx size", 0.20, "loading weights"),
    ("offloaded", 0.30, "loading weights"),
    ("model buffer size", 0.35, "loading weights"),
    ("llm_load_tensors:", 0.35, "loading weights"),
    ("constructing llama_context", 0.75, "creating the context"),
    ("llama_new_context_with_model:", 0.75, "creating the context"),
    ("KV buffer size", 0.80, "allocating the KV cache"),
    ("KV self size", 0.80, "allocating the KV cache"),
    ("reserving", 0.85, "reserving compute buffers"),
    ("compute buffer size", 0.90, "reserving compute buffers"),
    ("warming up the model", 0.93, "warming up"),
    ("initializing slots", 0.96, "starting slots"),
    ("load_model: initializing, n_slots", 0.96, "starting slots"),
    ("model loaded", 0.98, "model loaded"),
)

#: Weight loading runs from the "loading model tensors" stage to the context stage; the loader's
#: progress dots (one per percent, when the build prints them) move the bar inside that span.
DOTS_SPAN = (0.35, 0.75)


def load_stage(line: str) -> Stage | None:
    for needle, fraction, label in _STAGES:
        if needle in line:
            return Stage(fraction, label)
    return None


def dots_fraction(n_dots: int) -> float:
    lo, hi = DOTS_SPAN
    return lo + (hi - lo) * min(n_dots, 100) / 100


def count_progress_dots(text: str) -> int:
    """Dots the model loader printed in ``text`` (a run of dots at the end of a partial line or a
    line that is only dots); ellipses inside sentences are not progress."""
    stripped = text.rstrip()
    if not stripped.endswith("."):
        return 0
    body = stripped.rstrip(".")
    n = len(stripped) - len(body)
    if body and not body.endswith((":", " ")) and n < 4:
        return 0  # "this can take a while..." and friends
    return n


# --- failures -----------------------------------------------------------------------------------

_OOM_PATTERNS: tuple[tuple[re.Pattern[str], str | None], ...] = (
    (re.compile(r"allocating (?P<mib>[\d.]+) MiB on device (?P<dev>\d+): cudaMalloc failed"), None),
    (re.compile(r"alloc_buffer_n_default: failed to allocate (?P<buf>\S+) buffer of size (?P<size>\d+)"),
     None),
    (re.compile(r"ggml_gallocr_reserve_n(?:_impl)?: failed to allocate (?P<buf>\S+) buffer of size "
                r"(?P<size>\d+)"), "compute"),
    (re.compile(r"failed to allocate (?P<buf>\S+) buffer of size (?P<size>\d+)"), None),
    (re.compile(r"cpu_buffer_type_alloc_buffer: failed to allocate buffer of size (?P<size>\d+)"), None),
)
_CUDA_RUNTIME_OOM = re.compile(r"(CUDA|ROCm) error: out of memory")
_CURRENT_DEVICE = re.compile(r"current device: (?P<dev>\d+)")
_UNABLE_RE = re.compile(r"unable to allocate (?P<buf>\S+) buffer")
_KIND_HINTS = (
    ("buffer for kv cache", "kv"),
    ("failed to allocate compute", "compute"),
    ("graph_reserve: failed to allocate", "compute"),
    ("unable to allocate", "model"),
    ("error loading model", "model"),
)


def _cuda_name(index: str) -> str:
    return f"CUDA{int(index)}"


class LogAccumulator:
    """Feed a log line by line; :attr:`report` is what :func:`parse_log` would return so far."""

    def __init__(self) -> None:
        self.report = LoadReport()
        self.line_no = 0
        self._runtime_oom: bool = False
        self._clip_buft = "CPU"  # the projector's buffer type (clip_ctx: CLIP using ... backend)

    def feed(self, raw: str) -> Stage | None:
        """Parse one line; return the load stage it marks, if any."""
        self.line_no += 1
        line = raw.rstrip("\n")
        rep = self.report
        m = _BUFFER_RE.search(line)
        if m:
            kind = "mmproj" if m["func"] == "reserve_compute_meta" else _KIND.get(m["kind"], "model")
            if _STATE_RE.match(m["kind"]):
                kind = "rs"
            if len(rep.buffers) < MAX_RECORDS:
                rep.buffers.append(BufferLine(m["name"], kind, float(m["mib"]), self.line_no))
            return load_stage(line)
        if self._clip(line):
            return None
        m = _META_RE.search(line)
        if m:
            rep.n_kv, rep.n_tensors = int(m["kv"]), int(m["tensors"])
            return load_stage(line)
        m = _INFO_RE.search(line)
        if m:
            if len(rep.info) < MAX_RECORDS:
                rep.info.setdefault(m["key"].strip(), m["value"].strip())
            return None
        m = _LISTEN_RE.search(line)
        if m and rep.listening_url is None:
            url = m["url"] or m["url2"]
            if url is None:
                h = _IK_HOST_RE.search(line)
                host = h["host"] if h else "127.0.0.1"
                url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{m['port']}"
            rep.listening_url = url
            return Stage(1.0, "listening")
        m = _DEVICE_RE.search(line)
        if m:
            if len(rep.devices) < MAX_RECORDS:
                rep.devices.append(LoggedDevice(m["name"], m["desc"], int(m["free"])))
            return load_stage(line)
        if "memory_breakdown_print" in line:
            self._breakdown(line)
            return None
        if "model loaded" in line:
            rep.model_loaded = True
        low = line.lower()
        if any(k in low for k in _ERROR_MARKERS) or self._runtime_oom:
            if len(rep.errors) < MAX_ERRORS:
                rep.errors.append(line)
            self._oom(line)
            return None
        return load_stage(line)

    def _clip(self, line: str) -> bool:
        """The multimodal projector (clip.cpp): its device, then its weights as ``model size``
        (unpadded: the weights buffer itself is not logged); its compute lines are kind mmproj."""
        m = _CLIP_DEVICE_RE.search(line)
        if m:
            self._clip_buft = m["name"] or "CPU"
            return True
        m = _CLIP_MODEL_RE.search(line)
        if m:
            if len(bufs := self.report.buffers) < MAX_RECORDS:
                bufs.append(BufferLine(self._clip_buft, "mmproj", float(m["mib"]), self.line_no))
            return True
        return False

    def _breakdown(self, line: str) -> None:
        m = _BREAKDOWN_RE.search(line)
        if not m:
            return
        cells = [c.strip() for c in m["body"].split("|")]
        if len(cells) < 2 or cells[0].startswith("memory breakdown"):
            return
        name = cells[0].lstrip("- ").strip()
        nums = [int(x) for x in re.findall(r"-?\d+", cells[1])]
        if "(" in cells[1] and len(nums) >= 6:  # total = free + (self = model + context + compute) + unacc.
            row = BreakdownRow(name, nums[0], nums[1], nums[2], nums[3], nums[4], nums[5],
                               nums[6] if len(nums) > 6 else None)
        elif len(nums) >= 4:  # host: self = model + context + compute
            row = BreakdownRow(name, None, None, nums[0], nums[1], nums[2], nums[3], None)
        else:
            return
        rows = self.report.breakdown
        if len(rows) < MAX_BREAKDOWN_ROWS or any(r.name == name for r in rows):
            self.report.breakdown = [r for r in rows if r.name != name] + [row]

    def _oom(self, line: str) -> None:
        rep = self.report
        if len(rep.oom) >= MAX_RECORDS:
            return
        if _CUDA_RUNTIME_OOM.search(line):
            self._runtime_oom = True
            rep.oom.append(OomEvent(None, None, None, line, runtime=True))
            return
        if self._runtime_oom:
            cur = _CURRENT_DEVICE.search(line)
            if cur:
                rep.oom[-1] = OomEvent(_cuda_name(cur["dev"]), None, None, rep.oom[-1].line, runtime=True)
                self._runtime_oom = False
            return
        last = rep.oom[-1] if rep.oom else None
        for hint, kind in _KIND_HINTS:
            if hint not in line:
                continue
            if last is not None and not last.runtime and last.kind is None:
                rep.oom[-1] = OomEvent(last.device, last.mib, kind, last.line)
            elif kind == "model":
                unable = _UNABLE_RE.search(line)
                if unable:
                    rep.oom.append(OomEvent(unable["buf"], None, "model", line))
            return
        for rx, okind in _OOM_PATTERNS:
            hit = rx.search(line)
            if not hit:
                continue
            groups = hit.groupdict()
            if groups.get("dev") is not None:
                dev: str | None = _cuda_name(groups["dev"])
                mib: float | None = float(groups["mib"])
            else:
                dev = groups.get("buf") or ("CPU" if "cpu_buffer_type" in line else None)
                mib = int(groups["size"]) / MiB if groups.get("size") else None
            if last is not None and not last.runtime and last.kind is None and _same_size(last.mib, mib):
                # the same allocation reported again one level up: fill in what the first line lacked
                rep.oom[-1] = OomEvent(last.device or dev, last.mib or mib, okind, last.line)
            else:
                rep.oom.append(OomEvent(dev, mib, okind, line))
            return


def _same_size(a: float | None, b: float | None) -> bool:
    return a is None or b is None or abs(a - b) < 0.5


def parse_log(lines: Iterable[str]) -> LoadReport:
    acc = LogAccumulator()
    for raw in lines:
        acc.feed(raw)
    return acc.report
