"""Blocks several architectures' graphs share (:mod:`.archs`, :mod:`.dsa`, :mod:`.mtp`)."""

from __future__ import annotations

from offload_planner.core.compute.ggml import T, dup_op
from offload_planner.core.compute.graph import Builder


def dense_lead_or_shared_moe(b: Builder, il: int, cur: T) -> T:
    """The FFN of DeepSeek-V3 / GLM-4.x layers: dense for the leading layers, else the routed
    experts (with the expert-bias router) plus the shared expert."""
    if il < b.sh.n_dense_lead:
        return b.ffn(cur, b.req(f"blk.{il}.ffn_up.weight"), b.lw(il, "ffn_gate.weight"),
                     b.req(f"blk.{il}.ffn_down.weight"))
    routed = b.moe(cur, il, probs_b=b.lw(il, "exp_probs_b.bias"))
    shared = b.ffn(cur, b.req(f"blk.{il}.ffn_up_shexp.weight"), b.lw(il, "ffn_gate_shexp.weight"),
                   b.req(f"blk.{il}.ffn_down_shexp.weight"))
    return dup_op(routed, "ADD", routed, shared)
