"""Devices as llama.cpp names and orders them, with the buffer rules that decide allocation sizes.

llama.cpp's device list (``llama_prepare_model_devices``): RPC servers first (in ``--rpc`` order),
then GPUs in backend registration order (``ggml-backend-reg.cpp``: CUDA or ROCm, Metal, SYCL,
Vulkan), each backend's devices by index; the CPU is not in the list but always holds the input
layer and anything not offloaded.  :class:`DeviceSet` keeps its GPUs in that order whatever order
they were declared in, so ``-ts 3,1`` gives CUDA0 the larger share as llama.cpp does.
Each kind of device allocates weights with its own alignment and padding
(``ggml_backend_buft_get_alignment`` / ``get_alloc_size``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from offload_planner.core.cmdline.handlers_mainline import MAX_DEVICES
from offload_planner.core.errors import PlannerError
from offload_planner.core.speed.catalogue import card, card_keys
from offload_planner.core.speed.declared import HARDWARE_KEYS, parse_hardware_keys
from offload_planner.core.units import fmt_bytes, parse_size


class DeviceKind(StrEnum):
    CPU = "CPU"
    CUDA = "CUDA"
    ROCM = "ROCm"
    VULKAN = "Vulkan"
    METAL = "Metal"
    SYCL = "SYCL"
    RPC = "RPC"


#: (alignment, quantized-row padding in elements) of each kind's default buffer type.
#: CUDA and ROCm pad quantized rows to MATRIX_ROW_PADDING (512); an RPC device reports the
#: rules of the backend behind it (ggml-rpc-server's default is the CPU backend).
BUFFER_RULES: dict[DeviceKind, tuple[int, int]] = {
    DeviceKind.CPU: (32, 0),
    DeviceKind.CUDA: (128, 512),
    DeviceKind.ROCM: (128, 512),
    DeviceKind.VULKAN: (32, 0),
    DeviceKind.METAL: (32, 0),
    DeviceKind.SYCL: (32, 0),
    DeviceKind.RPC: (32, 0),
}

#: Devices whose backend offers a pinned host buffer type (``<name>_Host``) for CPU weights.
HOST_BUFFER_NAMES: dict[DeviceKind, str] = {
    DeviceKind.CUDA: "CUDA_Host",
    DeviceKind.ROCM: "ROCm_Host",
    DeviceKind.SYCL: "SYCL_Host",
    DeviceKind.VULKAN: "Vulkan_Host",
}

#: Kinds whose backend wraps mmap'd weights in a buffer over the mapped file (``caps.buffer_from_host_ptr``
#: of ``ggml_backend_dev_get_props``, which ``load_tensors`` asks for the default buffer type of each
#: weight context: src/llama-model.cpp:1848-1870): the CPU (ggml/src/ggml-cpu/ggml-cpu.cpp:398, buffer
#: ``CPU_Mapped``) and Metal (ggml/src/ggml-metal/ggml-metal.cpp:704, buffer type ``MTL<i>_Mapped`` at
#: line 462). CUDA/ROCm (ggml-cuda.cu:5229), Vulkan (ggml-vulkan.cpp:15312), SYCL (ggml-sycl.cpp:6426)
#: and RPC (ggml-rpc.cpp:2196) report false: their weights are copied into buffers of their own.
MAPS_HOST_MEMORY: frozenset[DeviceKind] = frozenset({DeviceKind.CPU, DeviceKind.METAL})

#: What llama.cpp appends to a device's name for the buffer wrapping its mmap'd weights (``CPU_Mapped``,
#: ``MTL0_Mapped``)
MAPPED_SUFFIX = "_Mapped"


def is_mapped_buffer(name: str) -> bool:
    """A buffer (type) name of mmap'd weights: its size is the file span of its tensors."""
    return name.endswith(MAPPED_SUFFIX)


#: The name prefix of each kind's devices where it is not the kind's own name: the pinned build names
#: its Metal devices ``MTL<i>`` (ggml/src/ggml-metal/ggml-metal-device.m:1301,
#: ``snprintf(dev->props.name, ..., "%s%d", "MTL", device)``; llama.cpp PR 18919 of January 2026,
#: "metal : support virtual devices"), and so its buffer types (ggml-metal.cpp: ``GGML_METAL_NAME "MTL"``).
#: How other builds name them is the dialect's (:attr:`Dialect.metal_device`).
DEVICE_PREFIX: dict[DeviceKind, str] = {DeviceKind.METAL: "MTL"}

#: ``Metal0``: the planner's name for MTL0 before it followed the pinned build; still read (old plan
#: files, commands and --device values), written MTL0
LEGACY_METAL = "Metal"

_NAME_RE = re.compile(r"^(CPU|CUDA|ROCm|Vulkan|MTL|Metal|SYCL|RPC)([0-9]*)$", re.IGNORECASE)


def prefix_of(kind: DeviceKind) -> str:
    """How the planner (and the pinned build) names a device of this kind: ``CUDA``, ``MTL``, ..."""
    return DEVICE_PREFIX.get(kind, kind.value)


def _kind_of_prefix(prefix: str) -> DeviceKind:
    low = prefix.lower()
    if low in ("mtl", LEGACY_METAL.lower()):
        return DeviceKind.METAL
    return next(k for k in DeviceKind if k.value.lower() == low)


def canonical_device_name(name: str) -> str:
    """The planner's spelling of a device name: ``cuda0`` is CUDA0, ``Metal0`` / ``mtl0`` are MTL0; a
    name that is no device's is returned as given."""
    m = _NAME_RE.match(name.strip())
    if m is None:
        return name
    kind = _kind_of_prefix(m.group(1))
    return "CPU" if kind is DeviceKind.CPU else prefix_of(kind) + m.group(2)

#: Rank of each kind in llama.cpp's device list: RPC servers first (llama.cpp moves them to the
#: front), then backends in the order ggml_backend_registry registers them; CUDA and ROCm are
#: one backend (a build has one of them). The CPU is never an offload device.
_ORDER: dict[DeviceKind, int] = {
    DeviceKind.RPC: 0,
    DeviceKind.CUDA: 1,
    DeviceKind.ROCM: 1,
    DeviceKind.METAL: 2,
    DeviceKind.SYCL: 3,
    DeviceKind.VULKAN: 4,
    DeviceKind.CPU: 5,
}


def legacy_names(texts: Sequence[str]) -> list[str]:
    """The ``--device`` names given as ``Metal<i>`` (read as ``MTL<i>``: :data:`LEGACY_METAL`)."""
    names = [t.partition("=")[0].strip() for t in texts]
    return [n for n in names if re.fullmatch(LEGACY_METAL + r"\d+", n, re.IGNORECASE)]


def kind_of(name: str) -> DeviceKind:
    m = _NAME_RE.match(name)
    if m is None:
        raise PlannerError(f"unknown device name {name!r} (use CPU, CUDA0, ROCm0, Vulkan0, MTL0, RPC0, ...)")
    return _kind_of_prefix(m.group(1))


def declared_name_problem(name: str) -> str:
    """Why llama.cpp has no device of this (well-formed) name, "" when it may: a GPU is named with its
    index as llama.cpp writes it (``CUDA%d``: ``CUDA1``, never ``CUDA01`` nor ``CUDA``), below its
    ``llama_max_devices()`` (16). A declared CUDA01 planned, and its -ot rules named a buffer type
    llama-server refuses."""
    m = _NAME_RE.match(name.strip())
    if m is None or m.group(1).upper() == "CPU":
        return ""
    digits = m.group(2)
    prefix = prefix_of(_kind_of_prefix(m.group(1)))
    if not digits:
        return (f"{name.strip()!r} needs its index, as llama.cpp names devices: {prefix}0, "
                f"{prefix}1, ...")
    if len(digits) > 1 and digits.startswith("0"):
        return f"{name.strip()!r}: llama.cpp names it {prefix}{int(digits)} (no leading zero)"
    if int(digits) >= MAX_DEVICES:
        return (f"{name.strip()!r}: llama.cpp numbers at most {MAX_DEVICES} devices (llama_max_devices): "
                f"{prefix}0 ... {prefix}{MAX_DEVICES - 1}")
    return ""


@dataclass(frozen=True)
class Device:
    """One llama.cpp device. ``total``/``free`` are bytes; None when unknown."""

    name: str
    kind: DeviceKind
    total: int | None = None
    free: int | None = None
    description: str = ""
    source: str = "declared"  # declared | nvml | rpc | psutil
    endpoint: str = ""  # host:port for RPC devices
    bandwidth_gbs: float | None = None
    margin: int = 0  # bytes the user keeps free on this device
    #: the margin was given (margin=0B included; always with a margin above 0): with it False a margin
    #: of 0 means "not set" and the planner's default margin applies where it has one
    #: (core.speed.candidate.margin_of, the window's settings)
    margin_given: bool = False
    hardware: tuple[tuple[str, str], ...] = ()  # declared speed keys (card, bw, pcie, ...): core.speed

    def __post_init__(self) -> None:
        if self.margin and not self.margin_given:  # a margin above 0 is one given
            object.__setattr__(self, "margin_given", True)

    @property
    def alignment(self) -> int:
        return BUFFER_RULES[self.kind][0]

    @property
    def row_padding(self) -> int:
        return BUFFER_RULES[self.kind][1]

    @property
    def host_buffer_name(self) -> str | None:
        return HOST_BUFFER_NAMES.get(self.kind)

    @property
    def mapped_buffer_name(self) -> str | None:
        """The buffer llama.cpp wraps this device's mmap'd weights in (:data:`MAPS_HOST_MEMORY`):
        ``CPU_Mapped``, ``MTL0_Mapped``; None for a device whose weights are copied."""
        return self.name + MAPPED_SUFFIX if self.kind in MAPS_HOST_MEMORY else None

    @property
    def buffer_type(self) -> str:
        """The name -ot takes for this device's buffer type: ``CUDA0``; an RPC device's is
        ``RPC<i>[host:port]`` with i its index on its own server (0 for one-device servers)."""
        if self.kind is DeviceKind.RPC and self.endpoint:
            return f"RPC0[{self.endpoint}]"
        return self.name

    @property
    def is_gpu(self) -> bool:
        return self.kind is not DeviceKind.CPU

    @property
    def capacity(self) -> int | None:
        """What the plan may use: free memory when known, else total."""
        return self.free if self.free is not None else self.total


def llama_order(device: Device) -> tuple[int, int]:
    """Sort key of a device in llama.cpp's list: (backend rank, index within the backend)."""
    m = _NAME_RE.match(device.name)
    index = int(m.group(2)) if m and m.group(2) else 0
    return _ORDER[device.kind], index


@dataclass(frozen=True)
class DeviceSet:
    """The CPU plus llama.cpp's ordered list of offload devices: ``gpus`` are sorted into
    llama.cpp's order (:func:`llama_order`) unless ``reported_order`` says they are in the order a
    running llama-server reported them (its log is the authority)."""

    cpu: Device
    gpus: tuple[Device, ...] = field(default_factory=tuple)
    reported_order: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if not self.reported_order:
            object.__setattr__(self, "gpus", tuple(sorted(self.gpus, key=llama_order)))

    def buffer_types(self) -> dict[str, str]:
        """Device name -> the buffer type name ``-ot`` takes for it (``RPC0[host:port]`` for RPC)."""
        return {d.name: d.buffer_type for d in self}

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield from self.gpus
        yield self.cpu

    def by_name(self, name: str) -> Device | None:
        """The device of that name, whatever its case; ``Metal0`` (the planner's name before MTL0) is MTL0."""
        name = canonical_device_name(name)
        for d in (*self.gpus, self.cpu):
            if d.name.lower() == name.lower():
                return d
        return None

    def resolve_buffer_type(self, buft: str) -> str | None:
        """The device an -ot buffer type names (``CPU``, ``CUDA0``, ``RPC0[127.0.0.1:50052]``)."""
        if buft.upper() == "CPU":
            return self.cpu.name
        for d in self.gpus:
            if buft == d.buffer_type or buft == d.name:
                return d.name
        m = re.match(r"^RPC\d+\[(?P<ep>[^\]]+)\]$", buft)
        if m:
            return next((d.name for d in self.gpus if d.endpoint == m["ep"]), None)
        return None

    @property
    def names(self) -> list[str]:
        """llama.cpp's order: offload devices first, then CPU."""
        return [d.name for d in self.gpus] + [self.cpu.name]


#: The longest --device value taken: a card, a size and every speed key fit in a tenth of it
MAX_DECL_CHARS = 1024


def parse_device_decl(text: str) -> Device:
    """``CUDA0=24GiB``, ``CUDA1=24GiB,free=22GiB``, ``CUDA0=rtx3090`` (a catalogue card sets the
    size), ``CUDA0=24GiB,bw=936GB/s,pcie=4x16,tflops=71``, ``CPU=512GiB,ram=12xDDR5-4800``,
    ``RPC0=64GiB,link=10Gb/s``: the speed keys are checked by :mod:`offload_planner.core.speed`."""
    if len(text) > MAX_DECL_CHARS:  # its error lines quoted it whole, twice (a 100 KB value: 200 KB)
        raise PlannerError(f"--device {text[:60]!r}... ({len(text)} characters): longer than any device "
                           f"declaration (at most {MAX_DECL_CHARS} characters)")
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not rest:
        named = card(text) if not sep else None
        if named is not None:  # --device rtx3090: the card without the device it is
            prefix = prefix_of(DeviceKind(named.kind))
            raise PlannerError(f"--device {text!r}: a card is declared on a device name: --device "
                               f"{prefix}0={named.key} (NAME=SIZE or NAME=CARD; {prefix}1=... for a "
                               "second GPU)")
        raise PlannerError(f"--device {text!r}: expected NAME=SIZE, e.g. CUDA0=24GiB")
    try:
        kind = kind_of(name)
    except PlannerError as e:
        raise PlannerError(f"--device {text!r}: {e}") from None
    hardware: list[tuple[str, str]] = []
    try:
        parts = _fields(text, text.index("=") + 1)
        first = card(parts[0]) if parts else None
        if first is not None:
            hardware.append(("card", first.key))
            parts = parts[1:]
            if parts and "=" not in parts[0]:  # CUDA0=rtx3090,20GiB / MTL0=m2ultra,192GiB
                given = parse_size(parts[0])
                total: int | None = given
                if first.vram_gib is not None and given > first.vram_gib * 1024**3:  # rtx3090,100TiB
                    raise ValueError(f"{parts[0]} is more than the {first.name}'s {first.vram_gib:g} GiB: "
                                     "give at most that (free= for the part unused now)")
                parts = parts[1:]
            elif first.vram_gib is None:
                raise ValueError(f"{first.name} comes in several memory sizes: give it after the name, "
                                 f"e.g. {name}={first.key},128GiB")
            else:
                total = int(first.vram_gib * 1024**3)
        else:
            total = _size_or_card(parts[0], name)
            parts = parts[1:]
        free: int | None = None
        margin: int | None = None
        _check_fields(parts)
        for p in parts:
            key, _, val = p.partition("=")
            if key == "free":
                free = parse_size(val)
            elif key == "margin":
                margin = parse_size(val)
            elif key in HARDWARE_KEYS:
                _check_host_key(kind, key, val)
                hardware.append((key, val))
            else:
                raise ValueError(f"unknown field {key!r} (free=, margin=, {'=, '.join(HARDWARE_KEYS)}=)")
        decl = parse_hardware_keys(hardware)
        _check_room(total, free, margin or 0)
    except (ValueError, IndexError) as e:
        raise PlannerError(f"--device {text!r}: {e}") from None
    canonical = canonical_device_name(name)
    return Device(canonical, kind, total, free, source="declared", bandwidth_gbs=decl.bw,
                  margin=margin or 0, margin_given=margin is not None, hardware=tuple(hardware))


def _fields(text: str, start: int) -> list[str]:
    """The comma-separated fields after ``NAME=`` (``start``: where they begin in ``text``), stripped.
    An empty one (``24GiB,,bw=900GB/s``, a comma at the end) is refused naming its place: it was
    dropped silently, so a field lost in an edit went unnoticed."""
    parts = text[start:].split(",")
    at = start
    for i, p in enumerate(parts):
        if not p.strip():
            if len(parts) == 1:
                raise ValueError("nothing after '=': expected a size or a card, e.g. 24GiB or rtx3090")
            where = ("a comma at the end" if i == len(parts) - 1 and i else
                     "a comma right after '='" if i == 0 else f"nothing between the commas at character {at}")
            raise ValueError(f"field {i + 1} is empty ({where}): remove the extra comma")
        at += len(p) + 1
    return [p.strip() for p in parts]


#: keys only the host's figures read (its RAM, compute threads, cores, clock, instruction set); an RPC
#: device's ``threads=`` is its rpc-server's (``gpu_speed`` caps the device's bandwidth by them)
HOST_KEYS = ("ram", "threads", "cores", "ghz", "isa")


def _check_host_key(kind: DeviceKind, key: str, val: str) -> None:
    """A host-only key on a GPU was accepted and ignored: refused, saying where it belongs."""
    if kind is DeviceKind.CPU or key not in HOST_KEYS or (kind is DeviceKind.RPC and key == "threads"):
        return
    rpc = " (an RPC device takes threads= only: its rpc-server's)" if kind is DeviceKind.RPC else ""
    raise ValueError(f"{key}= describes the host's CPU, not a {kind.value} device, and would be ignored "
                     f"here: give it on the CPU, e.g. --device CPU=64GiB,{key}={val}{rpc}")


def _check_fields(parts: Sequence[str]) -> None:
    """A field given twice (which one was meant? the last silently won) or a second bare size
    (``CUDA0=24GiB,22GiB``: most likely the free memory) is refused with what to write."""
    seen: set[str] = set()
    for p in parts:
        key, sep, _ = p.partition("=")
        if not sep:
            try:
                parse_size(p)
            except ValueError:
                continue  # the unknown field's own message follows
            raise ValueError(f"{p!r} is a second size: the size comes first, the free memory as free={p}")
        canonical = "bw" if key == "bandwidth" else key
        if canonical in seen:
            same = " (bandwidth= is bw=)" if canonical == "bw" and key == "bandwidth" else ""
            raise ValueError(f"{key}= is given twice{same}: give each field once")
        seen.add(canonical)


def _check_room(total: int | None, free: int | None, margin: int) -> None:
    """``free=`` is part of the size (a device cannot have more free than it has), and ``margin=``
    must leave room: llama.cpp would be planned against memory the device does not have, or none."""
    if total is not None and free is not None and free > total:
        raise ValueError(f"free={fmt_bytes(free)} is more than the device's size {fmt_bytes(total)}: free "
                         "is the part of the size unused now; lower free= or raise the size")
    room = free if free is not None else total
    if margin and room is not None and margin >= room:
        what = "free memory" if free is not None else "size"
        raise ValueError(f"margin={fmt_bytes(margin)} leaves nothing of the device's {what} "
                         f"{fmt_bytes(room)}: the margin is what the plan keeps free; make it smaller "
                         f"than the {what}")


#: GPUs a plan can split layers over: its command pins the split with ``-ts``, one value a GPU, and
#: llama.cpp refuses a ``-ts`` of ``llama_max_devices()`` values or more (common/arg.cpp, ``--tensor-split``:
#: ``split_arg.size() >= llama_max_devices()``), so 16 GPUs made a command llama-server exits on.
MAX_GPUS = MAX_DEVICES - 1
#: How the CPU is described once its size is declared (--device CPU=..., the window's Size column):
#: "system RAM" beside 512 GiB on a 23.5 GiB machine read as this machine's memory.
DECLARED_RAM = "declared RAM"


def parse_device_decls(texts: Sequence[str]) -> list[Device]:
    """Every ``--device`` value (:func:`parse_device_decl`), refusing a device declared twice: which
    size was meant is not ours to guess (the last one silently won)."""
    out: list[Device] = []
    seen: dict[str, str] = {}
    for text in texts:
        d = parse_device_decl(text)
        if d.name.lower() in seen:
            raise PlannerError(f"--device {text!r}: {d.name} is already declared by --device "
                               f"{seen[d.name.lower()]!r} (declare each device once)")
        seen[d.name.lower()] = text
        out.append(d)
    offload = [d.name for d in out if d.kind is not DeviceKind.CPU]
    if len(offload) > MAX_GPUS:
        raise PlannerError(f"--device: {len(offload)} GPUs declared ({offload[0]} ... {offload[-1]}); "
                           f"at most {MAX_GPUS}: llama.cpp's -ts takes fewer values than its "
                           f"{MAX_DEVICES} devices (llama_max_devices)")
    for d, text in zip(out, texts, strict=True):  # after the count: 17 GPUs are refused as such
        problem = declared_name_problem(d.name)
        if problem:
            raise PlannerError(f"--device {text!r}: {problem}")
    return out


def _size_or_card(text: str, name: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        if not any(ch.isdigit() for ch in text.lstrip("+-")[:1]):  # -24GiB: a size, not a card
            raise ValueError(f"{text!r} is neither a size (24GiB) nor a known card "
                             f"({', '.join(card_keys())})") from None
        cards = _cards_numbered(text)
        if cards:  # CUDA0=3090 meant the RTX 3090, not 3090 GiB
            raise ValueError(f"{e}; for the card: {' or '.join(f'{name}={c}' for c in cards)}") from None
        raise


def _cards_numbered(text: str) -> list[str]:
    """Catalogue cards a bare model number stands for (``3090``: ``rtx3090``; ``6000``: ``rtxa6000``,
    ``rtxpro6000``): letters, then exactly that number."""
    num = text.strip()
    if not num.isdigit():
        return []
    return [k for k in card_keys() if re.fullmatch(r"[a-z]+" + num, k)]


def build_device_set(
    *,
    cpu: Device,
    detected: list[Device],
    rpc_endpoints: list[str],
    declared: list[Device],
) -> DeviceSet:
    """llama.cpp's device order (:func:`llama_order`): RPC servers (RPC0..) first, then GPUs by
    backend and index; declared devices set the capacity of a device of the same name or add a
    virtual GPU in its place in that order."""
    gpus: list[Device] = [
        Device(f"RPC{i}", DeviceKind.RPC, description=f"RPC server {ep}", source="rpc", endpoint=ep)
        for i, ep in enumerate(rpc_endpoints)
    ]
    gpus.extend(detected)
    cpu_out = cpu
    for d in declared:
        if d.kind is DeviceKind.CPU:
            cpu_out = replace(cpu, total=d.total, free=d.free, margin=d.margin, hardware=d.hardware,
                              bandwidth_gbs=d.bandwidth_gbs, margin_given=d.margin_given,
                              description=DECLARED_RAM)
            continue
        idx = next((i for i, g in enumerate(gpus) if g.name.lower() == d.name.lower()), None)
        if idx is None:
            gpus.append(d)
        else:
            g = gpus[idx]
            gpus[idx] = replace(g, total=d.total, free=d.free if d.free is not None else g.free,
                                bandwidth_gbs=d.bandwidth_gbs or g.bandwidth_gbs, margin=d.margin,
                                margin_given=d.margin_given,
                                # declared keys win; the driver's figures (nvml_*) stay for the rest
                                hardware=d.hardware + tuple(kv for kv in g.hardware
                                                            if kv[0] not in dict(d.hardware)))
    if len(gpus) > MAX_GPUS and rpc_endpoints:  # --device alone is refused by parse_device_decls
        # llama.cpp copies llama_max_devices() split values for n_devices() devices: past 16 it reads
        # beyond its array, and its -ts takes at most 15 values (20 --rpc servers were planned)
        raise PlannerError(f"{len(gpus)} devices ({len(rpc_endpoints)} --rpc servers, "
                           f"{len(gpus) - len(rpc_endpoints)} GPU(s)); at most {MAX_GPUS}: llama.cpp's -ts "
                           f"takes fewer values than its {MAX_DEVICES} devices (llama_max_devices)")
    return DeviceSet(cpu_out, tuple(gpus))
