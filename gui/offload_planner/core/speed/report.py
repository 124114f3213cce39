"""The speed estimate as ``offload-planner plan`` prints it and as its ``--json`` carries it."""

from __future__ import annotations

from typing import Any

from offload_planner.core.speed.result import SpeedEstimate
from offload_planner.core.speed.tps import tps_json
from offload_planner.core.speed.tps import tps_text as _tps
from offload_planner.core.units import fmt_bytes


def _with_spec(est: SpeedEstimate) -> str:
    sp = est.spec
    if sp is None:
        return ""
    return (f" with {sp.kind} ({_tps(sp.tg_tps_plain)} and {_tps(sp.tg_tps_at_ctx_plain)} t/s without "
            "speculative decoding)")


def _spec_lines(est: SpeedEstimate) -> list[str]:
    sp = est.spec
    if sp is None:
        return []
    a = sp.accept
    return [f"  speculative decoding, {sp.kind}: {sp.n_draft} tokens drafted a step, acceptance "
            f"{a.value:g} a drafted token ({a.source}), {sp.tokens_per_step:.2f} tokens a step of "
            f"{sp.step_ms:.2f} ms (the target verifies {sp.n_draft + 1} tokens in one batch: "
            f"{sp.verify_ms:.2f} ms; one draft pass: {sp.draft_ms:.2f} ms)"]


def slots_text(est: SpeedEstimate) -> str:
    """``all 4 slots generating: 7.90 t/s each, 31.6 t/s in total at depth 0; ...`` ("" with one slot)."""
    sl = est.slots
    if sl is None:
        return ""
    return (f"all {sl.n_slots} slots generating: {_tps(sl.tg_tps_each)} t/s each, "
            f"{_tps(sl.tg_tps_total)} t/s in total at depth 0; {_tps(sl.tg_tps_each_at_ctx)} t/s each, "
            f"{_tps(sl.tg_tps_total_at_ctx)} t/s in total at {sl.depth_at_ctx} tokens each "
            f"(the {sl.cells}-token cache shared)"
            + (" (without drafting)" if sl.drafting else ""))


def _slots_lines(est: SpeedEstimate) -> list[str]:
    text = slots_text(est)
    return [f"  {text}"] if text else []


def _slots_json(est: SpeedEstimate) -> dict[str, Any]:
    """With ``-np N`` > 1: every slot generating at once (one batch of N tokens a step)."""
    sl = est.slots
    if sl is None:
        return {}
    return {"slots": {"n": sl.n_slots, "depth_at_ctx": sl.depth_at_ctx, "cells": sl.cells,
                      "tg_tps_each": tps_json(sl.tg_tps_each), "tg_tps_total": tps_json(sl.tg_tps_total),
                      "tg_tps_each_at_ctx": tps_json(sl.tg_tps_each_at_ctx),
                      "tg_tps_total_at_ctx": tps_json(sl.tg_tps_total_at_ctx),
                      "experts_read": None if sl.experts_read is None else round(sl.experts_read, 4),
                      "drafting": sl.drafting}}


def _depth_lines(est: SpeedEstimate) -> list[str]:
    if not est.depth or est.pp_tps_at_depth is None or est.tg_tps_at_depth is None:
        return []
    return [f"  after {est.depth} tokens of context (--depth): pp {_tps(est.pp_tps_at_depth)} t/s for the "
            f"{est.prompt}-token prompt (attention over the cache, its KV read per micro-batch), tg "
            f"{_tps(est.tg_tps_at_depth)} t/s"]


#: What a graph split is, said once after its line under ``plan --explain`` (and in the window's
#: tooltip): "118 graph splits per token" meant nothing to a llama.cpp user who had never read the
#: scheduler's log line.
SPLIT_MEANING = ("where a token's pass hands over from one device to the next; each costs a copy of the "
                 "activations across and a latency")


def speed_lines(est: SpeedEstimate, *, assumptions: bool = True, explain: bool = False) -> list[str]:
    """Text lines under the memory table; ``explain``: what a graph split is, after its line."""
    cal = "calibrated" if est.calibrated else "uncalibrated"
    lines = [
        f"speed estimate ({cal}): tg {_tps(est.tg_tps)} t/s at depth 0, {_tps(est.tg_tps_at_ctx)} t/s at "
        f"{est.n_ctx} tokens{_with_spec(est)}; pp {_tps(est.pp_tps)} t/s for a {est.prompt}-token prompt "
        f"(-ub {est.n_ubatch}"
        + (", op offload: host weights copied to the GPU per micro-batch" if est.op_offload else "") + ")",
        *_spec_lines(est),
        *_depth_lines(est),
        *_slots_lines(est),
        "  device   read/token   ms/token  share   KV at full context",
    ]
    for d in est.devices:
        if not d.bytes_per_token and not d.kv_bytes_at_ctx:
            continue
        lines.append(f"  {d.name:7} {fmt_bytes(d.bytes_per_token):>12} {d.tg_ms_per_token:10.2f} "
                     f"{100 * d.share:5.0f}%   {fmt_bytes(d.kv_bytes_at_ctx)}")
    if est.n_splits:
        host = f", {2 * est.host_kv_layers} of them -nkvo's" if est.host_kv_layers else ""
        lines.append(f"  graph splits: {est.n_splits} per token{host}, {est.split_ms:.2f} ms"
                     + (f" (a graph split: {SPLIT_MEANING})" if explain else ""))
    if est.host_kv_layers:
        lines.append(f"  -nkvo: {est.host_kv_layers} GPU layers run their attention on the CPU over the host "
                     f"KV cache: {est.host_kv_ms:.2f} ms a token in round trips, the KV read from RAM at "
                     "depth")
    lines += [f"  warning: {w}" for w in est.warnings]
    lines.append(f"  tg bottleneck: {est.bottleneck}")
    if est.host_kv_layers:
        lines.append(f"  tg bottleneck at {est.n_ctx} tokens: {est.bottleneck_at_ctx}")
    lines.append(f"  pp bottleneck: {est.pp_bottleneck}")
    if assumptions:
        lines.append("  assumptions:")
        lines += [f"    {a.text()}" for a in est.assumptions]
    return lines


def speed_json(est: SpeedEstimate) -> dict[str, Any]:
    return {
        "tg_tps": tps_json(est.tg_tps),
        "tg_tps_at_ctx": tps_json(est.tg_tps_at_ctx),
        "ctx": est.n_ctx,
        "pp_tps": tps_json(est.pp_tps),
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
        **_spec_json(est),
        **_depth_json(est),
        **_slots_json(est),
        **({"warnings": list(est.warnings)} if est.warnings else {}),
        **({"host_kv_layers": est.host_kv_layers, "host_kv_ms": round(est.host_kv_ms, 4),
            "bottleneck_at_ctx": est.bottleneck_at_ctx} if est.host_kv_layers else {}),
    }


def _depth_json(est: SpeedEstimate) -> dict[str, Any]:
    """With ``--depth D``: pp of the prompt and tg after D tokens of context."""
    if not est.depth or est.pp_tps_at_depth is None or est.tg_tps_at_depth is None:
        return {}
    return {"depth": est.depth, "pp_tps_at_depth": tps_json(est.pp_tps_at_depth),
            "tg_tps_at_depth": tps_json(est.tg_tps_at_depth)}


def _spec_json(est: SpeedEstimate) -> dict[str, Any]:
    """With a draft model or MTP: tg_tps/tg_tps_at_ctx are with speculative decoding; these say how,
    and the figures without it."""
    sp = est.spec
    if sp is None:
        return {}
    return {
        "tg_tps_plain": tps_json(sp.tg_tps_plain),
        "tg_tps_at_ctx_plain": tps_json(sp.tg_tps_at_ctx_plain),
        "speculative": {"kind": sp.kind, "n_draft": sp.n_draft, "accept": sp.accept.value,
                        "accept_source": str(sp.accept.source), "accept_note": sp.accept.note,
                        "tokens_per_step": round(sp.tokens_per_step, 4), "step_ms": round(sp.step_ms, 4),
                        "verify_ms": round(sp.verify_ms, 4), "draft_ms": round(sp.draft_ms, 4)},
    }


def speed_label(est: SpeedEstimate) -> str:
    """One line for the window: ``est. tg 9.83 t/s · pp 210 t/s (CUDA0 61% · CPU 39%)``."""
    shares = " · ".join(f"{d.name} {100 * d.share:.0f}%" for d in est.devices if d.share >= 0.005)
    return f"est. tg {_tps(est.tg_tps)} t/s · pp {_tps(est.pp_tps)} t/s" + (f" ({shares})" if shares else "")
