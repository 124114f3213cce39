"""The speed estimate as ``offload-planner plan`` prints it and as its ``--json`` carries it."""

from __future__ import annotations

from typing import Any

from offload_planner.core.speed.estimate import SpeedEstimate
from offload_planner.core.units import fmt_bytes


def _tps(x: float) -> str:
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def speed_lines(est: SpeedEstimate, *, assumptions: bool = True) -> list[str]:
    """Text lines under the memory table."""
    cal = "calibrated" if est.calibrated else "uncalibrated"
    lines = [
        f"speed estimate ({cal}): tg {_tps(est.tg_tps)} t/s at depth 0, {_tps(est.tg_tps_at_ctx)} t/s at "
        f"{est.n_ctx} tokens; pp {_tps(est.pp_tps)} t/s for a {est.prompt}-token prompt (-ub {est.n_ubatch}"
        + (", op offload: host weights copied to the GPU per micro-batch" if est.op_offload else "") + ")",
        "  device   read/token   ms/token  share   KV at full context",
    ]
    for d in est.devices:
        if not d.bytes_per_token and not d.kv_bytes_at_ctx:
            continue
        lines.append(f"  {d.name:7} {fmt_bytes(d.bytes_per_token):>12} {d.tg_ms_per_token:10.2f} "
                     f"{100 * d.share:5.0f}%   {fmt_bytes(d.kv_bytes_at_ctx)}")
    if est.n_splits:
        lines.append(f"  graph splits: {est.n_splits} per token, {est.split_ms:.2f} ms")
    lines.append(f"  tg bottleneck: {est.bottleneck}")
    lines.append(f"  pp bottleneck: {est.pp_bottleneck}")
    if assumptions:
        lines.append("  assumptions:")
        lines += [f"    {a.text()}" for a in est.assumptions]
    return lines


def speed_json(est: SpeedEstimate) -> dict[str, Any]:
    return {
        "tg_tps": round(est.tg_tps, 3),
        "tg_tps_at_ctx": round(est.tg_tps_at_ctx, 3),
        "ctx": est.n_ctx,
        "pp_tps": round(est.pp_tps, 3),
        "prompt": est.prompt,
        "n_ubatch": est.n_ubatch,
        "op_offload": est.op_offload,
        "devices": [{"name": d.name, "bytes_per_token": d.bytes_per_token,
                     "kv_bytes_at_ctx": d.kv_bytes_at_ctx,
                     "tg_ms_per_token": round(d.tg_ms_per_token, 4),
                     "tg_ms_at_ctx": round(d.tg_ms_at_ctx, 4), "share": round(d.share, 4),
                     "pp_ms": round(d.pp_ms, 3)} for d in est.devices],
        "n_splits": est.n_splits,
        "split_ms": round(est.split_ms, 4),
        "pp_transfer_ms": round(est.pp_transfer_ms, 3),
        "bottleneck": est.bottleneck,
        "pp_bottleneck": est.pp_bottleneck,
        "calibrated": est.calibrated,
        "assumptions": [a.as_json() for a in est.assumptions],
    }


def speed_label(est: SpeedEstimate) -> str:
    """One line for the window: ``est. tg 9.8 t/s · pp 210 t/s (CUDA0 61% · CPU 39%)``."""
    shares = " · ".join(f"{d.name} {100 * d.share:.0f}%" for d in est.devices if d.share >= 0.005)
    return f"est. tg {_tps(est.tg_tps)} t/s · pp {_tps(est.pp_tps)} t/s" + (f" ({shares})" if shares else "")
