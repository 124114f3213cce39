"""A GPU that maps the model file for its weights (Metal's ``MTL0_Mapped`` with mmap) and what it costs.

llama.cpp's ``--fit`` measures its dry runs without mmap (``mparams_copy.load_mode = LLAMA_LOAD_MODE_NONE``,
common/fit.cpp:58-59 of the pinned build): a Metal GPU then counts only its tensors. The server it starts
loads with mmap (unless ``-lm none``), and Metal wraps the file span from the first to the last of the
GPU's tensors (src/llama-model.cpp:1848-1870, ggml-metal.cpp:750), CPU tensors lying between them
included: the fitted command can be over on that GPU although the fit says it fits.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from offload_planner.core.device_figures import DeviceFigures
from offload_planner.core.devices import DeviceKind, is_mapped_buffer
from offload_planner.core.memory import DeviceMemory, Projection
from offload_planner.core.placement import CPU
from offload_planner.core.units import GiB

if TYPE_CHECKING:
    from offload_planner.core.model import Tensor
    from offload_planner.core.plan import Plan


#: per file (shard): the first byte and the end of the span some tensors occupy
Extents = dict[int, tuple[int, int]]


def extents(tensors: Iterable[Tensor]) -> Extents:
    """The file span of ``tensors`` per shard, from the first byte of the first to the end of the last."""
    out: Extents = {}
    for t in tensors:
        lo, hi = out.get(t.shard, (t.offset, t.offset + t.nbytes))
        out[t.shard] = (min(lo, t.offset), max(hi, t.offset + t.nbytes))
    return out


def merged_extents(a: Extents, b: Extents) -> Extents:
    """The spans holding both ``a``'s and ``b``'s tensors."""
    out = dict(a)
    for shard, (lo, hi) in b.items():
        was = out.get(shard, (lo, hi))
        out[shard] = (min(was[0], lo), max(was[1], hi))
    return out


def span_bytes(e: Extents) -> int:
    """The bytes the spans take, over every shard."""
    return sum(hi - lo for lo, hi in e.values())


def mapping_gpus(plan: Plan) -> list[str]:
    """The GPUs whose backend wraps the mmap'd model file for their weights (Metal's ``MTL0_Mapped``,
    :data:`~offload_planner.core.devices.MAPS_HOST_MEMORY`), where the plan maps it: each counts the file
    span of its tensors, other devices' tensors lying between them included."""
    if not plan.placement_options.use_mmap:
        return []
    return [g.name for g in plan.devices.gpus if g.mapped_buffer_name is not None]


def unmapped_flags(plan: Plan) -> str:
    """The dialect's flags that load without mmap (``-lm none``, ``--no-mmap``) where the plan has them
    and a GPU would map the file with mmap (Metal); "" otherwise (every plan without such a GPU)."""
    if plan.placement_options.use_mmap or not any(g.mapped_buffer_name for g in plan.devices.gpus):
        return ""
    return " ".join(plan.dialect.no_mmap_flags)


@dataclass(frozen=True)
class SpanOver:
    """A GPU over capacity with its mapped span: the span and its own tensors' bytes, what it holds
    with its margin, its capacity."""

    device: str
    span: int
    own: int
    used: int
    margin: int
    capacity: int


def mapped_span(dm: DeviceMemory) -> tuple[int, int]:
    """The bytes of a GPU's mapped weight buffers (the file spans) and of its tensors in them; (0, 0)
    for a device whose weights are not a mapped span (every non-Metal GPU, the CPU)."""
    if dm.device.mapped_buffer_name is None or not dm.device.is_gpu:
        return 0, 0
    spans = [b for b in dm.buffers if b.kind == "model" and b.resident is None and b.tensor_bytes is not None]
    return sum(b.bytes for b in spans), sum(b.tensor_bytes or 0 for b in spans)


def spans_over(projection: Projection) -> list[SpanOver]:
    """The GPUs over their capacity (the one capacity rule, margin included) whose mapped span holds other
    devices' tensors (without mmap they would hold less)."""
    out = []
    for dm in projection.devices:
        span, own = mapped_span(dm)
        f = DeviceFigures.of(dm) if span > own else None
        if f is not None and f.over and f.capacity is not None:
            out.append(SpanOver(dm.device.name, span, own, f.used, f.margin, f.capacity))
    return out


def fit_span_note(over: list[SpanOver], no_mmap: str) -> str:
    """Why llama.cpp's fitted command is over on a GPU that maps the file, and the flag that avoids it."""
    parts = [f"{o.device} maps the {o.span / GiB:.2f} GiB file span of its {o.own / GiB:.2f} GiB of tensors, "
             f"{o.used / GiB:.2f} GiB projected" + (f" + {o.margin / GiB:.2f} GiB margin" if o.margin else "")
             + f" > {o.capacity / GiB:.2f} GiB" for o in over]
    return ("--fit's command is still over with mmap: llama.cpp's fit measures its dry runs without mmap "
            "(common/fit.cpp:58), where a Metal GPU holds only its tensors, but the server loads with mmap "
            f"and {'; '.join(parts)} (the CPU's tensors between its own count too). With {no_mmap} the fit "
            "places the same way and the GPU holds only its tensors; `offload-planner fit` compares both")


def fit_row_note(projection: Projection, over: list[str], no_mmap: str) -> str:
    """The ``fit`` command's note on llama.cpp's ``--fit`` row where it is over on a GPU whose mapped span
    holds other devices' tensors ("" where no such GPU is over)."""
    parts = []
    for name in over:
        span, own = mapped_span(projection.device(name))
        if span > own:
            parts.append(f"{name}'s {span / GiB:.2f} GiB file span for its {own / GiB:.2f} GiB of tensors")
    if not parts:
        return ""
    return ("llama.cpp --fit: over with mmap: its dry runs load without mmap (common/fit.cpp:58), where a "
            "Metal GPU holds only its tensors, but its command loads with mmap and maps "
            f"{'; '.join(parts)} (the CPU's tensors between them count too); with {no_mmap} it holds what "
            "the fit measured")


def shared_bytes(projection: Projection) -> dict[str, int]:
    """Per GPU that maps the file (Metal with mmap): the bytes of the CPU's mapped tensors (``CPU_Mapped``,
    read into the page cache) lying inside that GPU's mapped span of the same file, which the plan counts
    on both devices. On Apple silicon they are the same pages of one memory."""
    on_gpu: dict[str, list[Tensor]] = {}
    cpu: dict[tuple[int, str], tuple[int, int]] = {}  # (shard, tensor) -> its bytes in the file
    for p in projection.placement.items:
        if p.device is None or p.buft is None or not is_mapped_buffer(p.buft):
            continue
        t = p.tensor
        if p.device == CPU:
            cpu[(t.shard, t.name)] = (t.offset, t.offset + t.nbytes)
        else:
            on_gpu.setdefault(p.device, []).append(t)
    spans = {(gpu, shard): span for gpu, ts in on_gpu.items() for shard, span in extents(ts).items()}
    out: dict[str, int] = {}
    for (gpu, shard), (lo, hi) in spans.items():
        n = sum(e - o for (sh, _), (o, e) in cpu.items() if sh == shard and o >= lo and e <= hi)
        if n:
            out[gpu] = out.get(gpu, 0) + n
    return out


def unified_held(projection: Projection) -> tuple[int, int] | None:
    """On a Mac (a Metal GPU in the plan): the bytes the CPU and the Metal GPUs take of their one memory
    (each as the table counts it), the CPU's mapped tensors inside a GPU's mapped span
    counted once, and those shared bytes; None without a Metal GPU."""
    devs = [dm for dm in projection.devices if dm.device.kind is DeviceKind.METAL or dm.device.name == CPU]
    if len(devs) < 2:
        return None
    twice = sum(shared_bytes(projection).values())
    figs = [DeviceFigures.of(dm) for dm in devs]
    return sum(f.used for f in figs) - twice, twice


def unified_over(projection: Projection) -> int:
    """Bytes a Mac's CPU and Metal GPUs together take beyond the CPU's capacity (the RAM): 0 within it,
    with the RAM unknown, or without a Metal GPU."""
    held = unified_held(projection)
    cap = projection.device(CPU).device.capacity
    return max(0, held[0] - cap) if held is not None and cap is not None else 0


def ram_sharers(projection: Projection) -> str:
    """``CPU + MTL0``: the devices of a Mac's one memory, the CPU first."""
    rows = sorted(projection.devices, key=lambda dm: dm.device.is_gpu)
    kinds = (DeviceKind.CPU, DeviceKind.METAL)
    return " + ".join(dm.device.name for dm in rows if dm.device.kind in kinds)


def no_placement_fits(projection: Projection) -> int:
    """Bytes a Mac's CPU and Metal GPUs together take beyond its RAM (:func:`unified_over`) when those
    GPUs are the only ones: what moves off a Metal GPU lands in the same RAM, so no placement fits
    (Fill, the Fastest plan and moving layers cannot help); 0 when another GPU could take some."""
    if any(dm.device.is_gpu and dm.device.kind is not DeviceKind.METAL for dm in projection.devices):
        return 0
    return unified_over(projection)


def unified_note(projection: Projection) -> str:
    """The note on a Mac's plan where the CPU's mapped tensors lie inside a Metal GPU's mapped span (which
    bytes the table counts twice) or the devices together take more than the RAM: what the devices take
    of the one memory they share ("" elsewhere)."""
    held = unified_held(projection)
    over = unified_over(projection)
    if held is None or not (held[1] or over):
        return ""
    total, twice = held
    shared = shared_bytes(projection)
    cap = projection.device(CPU).device.capacity
    where = ", ".join(f"{g} ({b / GiB:.2f} GiB)" if len(shared) > 1 else g for g, b in shared.items())
    ram = ""
    if cap is not None:
        ram = (f" of the CPU's {cap / GiB:.2f} GiB" if not over else
               f", more than the CPU's {cap / GiB:.2f} GiB by {over / GiB:.2f} GiB")
    head = (f"{twice / GiB:.2f} GiB of the CPU's mapped tensors lie inside the mapped span of {where} and "
            "are counted on both rows, one copy in RAM (the file's pages, which Metal maps into the GPU's "
            "working set); " if twice else "")
    return (f"unified memory: {head}a Metal GPU's capacity is its share of the same RAM "
            "(recommendedMaxWorkingSetSize, what llama.cpp reports as its memory), so the devices "
            f"together take {total / GiB:.2f} GiB{ram}")
