"""Text and JSON reports of a projection for ``offload-planner plan``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from offload_planner.core.device_figures import DeviceFigures
from offload_planner.core.mapped_span import mapped_span, unified_note
from offload_planner.core.memory import DeviceMemory, Projection
from offload_planner.core.units import GiB, MiB

MMPROJ = "mmproj"  # the projector's buffers (core.mmproj.attach.KIND)


def _g(n: int | None) -> str:
    return "        -" if n is None else f"{n / GiB:9.2f}"


def device_json(dm: DeviceMemory) -> dict[str, Any]:
    return {
        "name": dm.device.name,
        "weights_bytes": dm.weights,
        "kv_bytes": dm.kv,
        **({"rs_bytes": dm.rs} if dm.rs else {}),  # a hybrid model's recurrent state
        "compute_bytes": dm.compute,
        "output_bytes": dm.output,
        **({"mmproj_bytes": dm.total(MMPROJ)} if dm.total(MMPROJ) else {}),
        "total_bytes": dm.total(),
        "capacity_bytes": dm.device.capacity,
        "buffers": [
            {"name": b.name, "kind": b.kind, "bytes": b.bytes, "why": b.why,
             **({"owner": b.owner} if b.owner else {})}
            for b in dm.buffers
        ],
    }


def extras_json(projection: Projection) -> list[dict[str, Any]]:
    """The extra models/contexts (draft, MTP, mmproj): bytes per device and kind."""
    return [{"key": e.key, "label": e.label, "shares_model": e.shares_model,
             "devices": {d: {k: sum(b.bytes for b in e.buffers if b.device == d and b.kind == k)
                             for k in ("model", "kv", "compute", "output")}
                         for d in dict.fromkeys(b.device for b in e.buffers)}}
            for e in projection.extras]


def extras_lines(projection: Projection) -> list[str]:
    """One line per extra model/context, its GiB per device (already counted in the rows above)."""
    out = []
    for e in projection.extras:
        per = e.by_device()
        cells = ", ".join(f"{d} {n / GiB:.2f}" for d, n in per.items())
        out.append(f"+ {e.label}: {cells} GiB (counted in the rows above)")
    return out


def device_left(dm: DeviceMemory) -> int | None:
    """What the table's "left" column shows: capacity minus what the device holds and its margin
    (None when the capacity is unknown); negative means the row is marked OVER."""
    return DeviceFigures.of(dm).left


def plan_json(projection: Projection, *, warnings: Sequence[str], errors: Sequence[str],
              command: Sequence[str], notes: Sequence[str] = (),
              fit: dict[str, Any] | None = None) -> dict[str, Any]:
    """``fit``: what the pinned build's --fit would change (None: off, no GPU or another backend)."""
    ctx = projection.context
    return {
        "devices": [device_json(d) for d in projection.devices],
        "tensors": projection.placement.tensor_devices(),
        "context": {"n_ctx": ctx.n_ctx, "n_ctx_seq": ctx.n_ctx_seq, "n_stream": ctx.n_stream,
                    "n_batch": ctx.n_batch, "n_ubatch": ctx.n_ubatch, "swa_cells": ctx.swa_cells},
        "warnings": list(warnings),
        "errors": list(errors),
        "notes": list(notes),
        "command": list(command),
        "fit": fit,
        **({"extras": extras_json(projection)} if projection.extras else {}),
    }


def mmap_notes(projection: Projection) -> list[str]:
    """Per device whose weights are mmap'd with gaps: the bytes read (what the plan counts, in the
    table and the window's bars) against the file span llama.cpp logs for the mapping."""
    out = []
    gpu_maps = [dm.device.name for dm in projection.devices if mapped_span(dm)[0]]  # Metal with mmap
    for dm in projection.devices:
        mapped = [b for b in dm.buffers if b.resident is not None and b.resident != b.bytes]
        if mapped:
            span = sum(b.bytes for b in mapped)
            read = sum(b.resident or 0 for b in mapped)
            others = "other devices' tensors, which are never read into RAM"
            if gpu_maps:  # on a Mac they are not: Metal maps them
                owners = " and ".join(f"{g}'s" for g in gpu_maps)
                spans = "its mapped span" if len(gpu_maps) == 1 else "their mapped spans"
                others = (f"other devices' tensors, which the CPU does not read: {owners} count in {spans} "
                          "(Metal maps them into the GPU's working set)")
            out.append(
                f"{dm.device.name} weights count the {read / GiB:.2f} GiB of tensors read from the model "
                f"file (mmap), not the {span / GiB:.2f} GiB file span llama.cpp logs for the mapping: the "
                f"span includes {others}"
            )
        if note := _gpu_span_note(dm):
            out.append(note)
    if note := unified_note(projection):  # "" without a Metal GPU
        out.append(note)
    return out


def _gpu_span_note(dm: DeviceMemory) -> str:
    """A GPU whose backend maps the model file (Metal's ``MTL0_Mapped``) counts the whole span, which holds
    other devices' tensors where its own are not contiguous in the file (a partial offload of a model
    whose output or tied embedding lies at the file's start): said where the gaps are over 1% (and 1 MiB)."""
    spans = [b for b in dm.buffers if b.resident is None and b.tensor_bytes is not None]
    span = sum(b.bytes for b in spans)
    own = sum(b.tensor_bytes or 0 for b in spans)
    if not spans or span - own <= max(span // 100, MiB):
        return ""
    return (f"{dm.device.name} weights count the {span / GiB:.2f} GiB file span llama.cpp maps for them with "
            f"mmap ({spans[0].name}), of which {own / GiB:.2f} GiB are its tensors: the span includes other "
            "devices' tensors lying between them, mapped into the GPU's working set too; without mmap only "
            "its tensors are copied")


def plan_text(projection: Projection, *, warnings: Sequence[str], errors: Sequence[str],
              command: str, notes: Sequence[str] = (), explain: bool = False) -> str:
    lines = ["device     weights       KV  compute   output    total capacity     left   (GiB)"]
    for dm in projection.devices:
        cap = dm.device.capacity
        left = device_left(dm)
        lines.append(
            f"{dm.device.name:7}  {_g(dm.resident('model'))}{_g(dm.kv)}{_g(dm.compute)}{_g(dm.output)}"
            f"{_g(dm.resident())}{_g(cap)}{_g(left)}" + ("  OVER" if left is not None and left < 0 else "")
        )
        if rs := dm.rs:  # a hybrid model's recurrent state, counted in the row's total
            lines.append(f"{'+RS':7}  {_g(None)}{_g(rs)}{_g(None)}{_g(None)}{_g(rs)}")
        if mm := [b for b in dm.buffers if b.kind == MMPROJ]:
            w = sum(b.bytes for b in mm if b.why.startswith("projector weights"))
            c = sum(b.bytes for b in mm) - w
            lines.append(f"{'+mmproj':7}  {_g(w)}{_g(None)}{_g(c)}{_g(None)}{_g(w + c)}")
        if explain:
            for b in dm.buffers:
                owner = f"[{b.owner}] " if b.owner else ""
                lines.append(f"           {b.kind:8} {b.name:24} {b.bytes / MiB:10.2f} MiB  {owner}{b.why}")
    lines += extras_lines(projection)
    lines += mmap_notes(projection)
    ctx = projection.context
    lines.append(
        f"context: {ctx.n_ctx} cells ({ctx.n_stream} stream(s) of {ctx.n_ctx_seq}), "
        f"batch {ctx.n_batch}, ubatch {ctx.n_ubatch}"
    )
    lines += [f"note: {n}" for n in notes]
    lines += [f"warning: {w}" for w in warnings]
    lines += [f"error: {e}" for e in errors]
    lines.append("")
    lines.append(command)
    return "\n".join(lines)
