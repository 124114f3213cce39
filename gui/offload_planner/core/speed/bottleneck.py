"""The largest part of a token's time and of a prompt's, as the estimate names it."""

from __future__ import annotations

from offload_planner.core.placement import CPU
from offload_planner.core.speed.pp import _PPParts

#: How the bottleneck names -nkvo's part of a token.
HOST_KV_PART = "attention over the host KV cache (-nkvo)"


def _bottleneck(times: dict[str, float], split_s: float, total: float, host_kv_s: float = 0.0,
                host_kv_cpu_s: float = 0.0) -> str:
    """The largest part of a token's time (``host_kv_s``: -nkvo's round trips; ``host_kv_cpu_s``:
    of the CPU's time, its KV reads and attention for them)."""
    parts = dict(times)
    parts["graph splits"] = split_s
    if host_kv_s:
        parts[HOST_KV_PART] = host_kv_s + host_kv_cpu_s
        if CPU in parts:
            parts[CPU] -= host_kv_cpu_s
    name, t = max(parts.items(), key=lambda kv: kv[1])
    what = name if name in ("graph splits", HOST_KV_PART) else f"{name} memory bandwidth"
    return f"{what} ({100 * t / total:.0f}% of the time per token)"


def _pp_bottleneck(pp: _PPParts, total: float, host_kv: bool = False) -> str:
    parts = {f"{k} compute": v for k, v in pp.device_s.items()}
    cpu_attn = pp.attn_s.get(CPU, 0.0) if host_kv else 0.0
    if host_kv:  # -nkvo: the CPU's attention over the host cache, its round trips and copies
        parts[HOST_KV_PART] = cpu_attn + pp.host_kv_s
        if f"{CPU} compute" in parts:
            parts[f"{CPU} compute"] = max(0.0, parts[f"{CPU} compute"] - cpu_attn)
    parts["op offload copies over the host link"] = pp.transfer_s
    parts["graph splits"] = pp.split_s - pp.host_kv_s
    name, t = max(parts.items(), key=lambda kv: kv[1])
    return f"{name} ({100 * t / total:.0f}% of the prompt time)"
