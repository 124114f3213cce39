"""Text and JSON reports of a projection for ``offload-planner plan``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from offload_planner.core.device_figures import DeviceFigures
from offload_planner.core.memory import DeviceMemory, Projection
from offload_planner.core.units import GiB, MiB


def _g(n: int | None) -> str:
    return "        -" if n is None else f"{n / GiB:9.2f}"


def device_json(dm: DeviceMemory) -> dict[str, Any]:
    return {
        "name": dm.device.name,
        "weights_bytes": dm.weights,
        "kv_bytes": dm.kv,
        "compute_bytes": dm.compute,
        "output_bytes": dm.output,
        "total_bytes": dm.total(),
        "capacity_bytes": dm.device.capacity,
        "buffers": [
            {"name": b.name, "kind": b.kind, "bytes": b.bytes, "why": b.why} for b in dm.buffers
        ],
    }


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
    }


def mmap_notes(projection: Projection) -> list[str]:
    """Per device whose weights are mmap'd with gaps: the bytes read (what the plan counts, in the
    table and the window's bars) against the file span llama.cpp logs for the mapping."""
    out = []
    for dm in projection.devices:
        mapped = [b for b in dm.buffers if b.resident is not None and b.resident != b.bytes]
        if mapped:
            span = sum(b.bytes for b in mapped)
            read = sum(b.resident or 0 for b in mapped)
            out.append(
                f"{dm.device.name} weights count the {read / GiB:.2f} GiB of tensors read from the model "
                f"file (mmap), not the {span / GiB:.2f} GiB file span llama.cpp logs for the mapping: the "
                "span includes other devices' tensors, which are never read into RAM"
            )
    return out


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
        if explain:
            for b in dm.buffers:
                lines.append(f"           {b.kind:8} {b.name:24} {b.bytes / MiB:10.2f} MiB  {b.why}")
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
