"""The MTP context's compute buffers: the NextN block's graph (``LLM_GRAPH_TYPE_DECODER_MTP``),
reserved as ``sched_reserve`` reserves the main graph (:mod:`.simulate`).

GLM-4.5 (``src/models/glm4-moe.cpp``) and DeepSeek-V3 (``deepseek2.cpp``, MLA), ``graph_mtp``: the
token rows of ``nextn.embed_tokens`` (else ``token_embd``) and the main model's hidden state
(``mtp_h_input``), each RMS-normed, concatenated and projected by ``nextn.eh_proj``; one attention +
MoE (+ shared expert) block over the MTP context's own KV of the NextN layer; ``shared_head_norm``
(kept: ``t_h_nextn``), the output rows and ``shared_head_head``.

Qwen3-Next and Qwen3.5 (``qwen3next.cpp``, ``qwen35.cpp``, ``qwen35moe.cpp``, ``graph_mtp``): the same
input, the trunk's gated attention over the MTP context's own KV, its FFN (routed experts and the
gated shared expert, or dense), the rows selected before the residual (Qwen3-Next) or after the
final norm (Qwen3.5).  Measured on the three (synth models with an MTP block, against llama-server).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from offload_planner.core.buffer import Buffer
from offload_planner.core.compute.archs import dense_lead_or_shared_moe, glm4moe_attention, mla_attention
from offload_planner.core.compute.archs_deltanet import gated_attention, hybrid_ffn
from offload_planner.core.compute.archs_qwen4exp import qwen4exp_mtp_graph
from offload_planner.core.compute.deltanet_shape import MROPE_ARCHS
from offload_planner.core.compute.ggml import (
    F32,
    I32,
    OUTPUT,
    T,
    concat,
    dup_op,
    get_rows,
    input_tensor,
    mul_mat,
)
from offload_planner.core.compute.graph import Builder
from offload_planner.core.compute.reserve import reserve
from offload_planner.core.compute.scheduler import N_COPIES_PIPELINE
from offload_planner.core.compute.simulate import (
    backends_for,
    full_offload,
    pipeline_parallel,
    reserve_shapes,
    weight_factory,
)

if TYPE_CHECKING:
    from offload_planner.core.devices import DeviceSet
    from offload_planner.core.memory import ContextParams, ResolvedContext
    from offload_planner.core.model import Model
    from offload_planner.core.placement import Placement


def _mtp_input(b: Builder, il: int, *, k_only: bool = False) -> T:
    """Token rows and the main model's hidden state, normed, concatenated and projected."""
    n = b.n_tokens
    tokens = input_tensor(I32, [n], "inp_tokens")
    tok = get_rows(b.lw(il, "nextn.embed_tokens.weight") or b.req("token_embd.weight"), tokens)
    h = input_tensor(F32, [b.sh.n_embd, n], "mtp_h_input")
    b.build_inp_pos()
    b.build_out_ids()
    b.build_inp_attn(k_only=k_only)
    h_norm = b.norm(h, b.lw(il, "nextn.hnorm.weight"), il)
    e_norm = b.norm(tok, b.lw(il, "nextn.enorm.weight"), il)
    return mul_mat(b.req(f"blk.{il}.nextn.eh_proj.weight"), concat(e_norm, h_norm, 0))


def _mtp_head(b: Builder, il: int, cur: T) -> None:
    """``shared_head_norm`` (kept as ``t_h_nextn``), the output rows, ``shared_head_head``."""
    cur = b.norm(cur, b.lw(il, "nextn.shared_head_norm.weight") or b.w("output_norm.weight"), -1)
    cur.flags |= OUTPUT  # t_h_nextn
    (cur,) = b.out_rows(cur)
    cur = mul_mat(b.lw(il, "nextn.shared_head_head.weight") or b.req("output.weight"), cur)
    cur.flags |= OUTPUT
    b.g.expand(cur)


def _deepseek2_mtp(b: Builder) -> None:
    il = b.sh.n_layer  # the first NextN block follows the trunk
    cur = _mtp_input(b, il, k_only=True)
    inp_sa = cur
    cur = mla_attention(b, il, b.norm(cur, b.lw(il, "attn_norm.weight"), il))
    ffn_inp = dup_op(cur, "ADD", cur, inp_sa)
    cur = b.norm(ffn_inp, b.lw(il, "ffn_norm.weight"), il)
    cur = dense_lead_or_shared_moe(b, il, cur)
    _mtp_head(b, il, dup_op(cur, "ADD", cur, ffn_inp))


def _glm4moe_mtp(b: Builder) -> None:
    sh = b.sh
    il = sh.n_layer  # the first NextN block follows the trunk
    cur = _mtp_input(b, il)
    inp_sa = cur
    cur = glm4moe_attention(b, il, cur)
    ffn_inp = dup_op(cur, "ADD", cur, inp_sa)
    cur = b.norm(ffn_inp, b.lw(il, "post_attention_norm.weight"), il)
    cur = dense_lead_or_shared_moe(b, il, cur)
    _mtp_head(b, il, dup_op(cur, "ADD", cur, ffn_inp))


def _delta_net_mtp(b: Builder) -> None:
    """Qwen3-Next / Qwen3.5 (``llama_model_qwen3next::graph_mtp``, ``qwen35``, ``qwen35moe``): the gated
    attention (3-D views of Q and its gate), the FFN of the trunk (routed experts plus the sigmoid-gated
    shared expert, or dense); Qwen3-Next selects the output rows before the residual and its head
    takes them as they are, Qwen3.5 normalizes every token (``t_h_nextn``) and selects them after."""
    sh = b.sh
    il = sh.n_layer  # the NextN block follows the trunk
    cur = _mtp_input(b, il)
    if sh.arch in MROPE_ARCHS:  # IMRoPE: 4 positions per token
        b.inp_pos = input_tensor(I32, [b.n_tokens * 4], "inp_pos")
    inp_sa = cur
    cur = gated_attention(b, b.norm(cur, b.lw(il, "attn_norm.weight"), il), il, views_4d=False)
    late_rows = sh.arch != "qwen3next"
    if not late_rows:
        cur, inp_sa = b.out_rows(cur, inp_sa)
    cur = dup_op(cur, "ADD", cur, inp_sa)
    ffn_residual = cur
    cur = hybrid_ffn(b, b.norm(cur, b.lw(il, "post_attention_norm.weight"), il), il)
    cur = dup_op(cur, "ADD", cur, ffn_residual)
    cur = b.norm(cur, b.lw(il, "nextn.shared_head_norm.weight") or b.w("output_norm.weight"), -1)
    cur.flags |= OUTPUT  # t_h_nextn
    if late_rows:
        (cur,) = b.out_rows(cur)
    cur = mul_mat(b.lw(il, "nextn.shared_head_head.weight") or b.req("output.weight"), cur)
    cur.flags |= OUTPUT
    b.g.expand(cur)

#: deepseek32 / glm-dsa: their ``graph_mtp`` is dense MLA without the indexer (deepseek32.cpp, glm-dsa.cpp),
#: node for node deepseek2's (held to the real server's MTP compute buffers: test_dsa_vs_llama)
MTP_GRAPHS: dict[str, Callable[[Builder], None]] = {
    "glm4moe": _glm4moe_mtp, "deepseek2": _deepseek2_mtp,
    "qwen3next": _delta_net_mtp, "qwen35": _delta_net_mtp, "qwen35moe": _delta_net_mtp,
    "deepseek32": _deepseek2_mtp, "glm-dsa": _deepseek2_mtp, "qwen4exp": qwen4exp_mtp_graph,
}


def mtp_compute_buffers(model: Model, devices: DeviceSet, placement: Placement, ctx: ResolvedContext,
                        p: ContextParams, *, no_alloc: bool = False) -> list[Buffer]:
    """One compute buffer per backend the MTP graph uses (the larger of its prompt and one-token
    reserves; ``no_alloc``: the dry run's prompt reserve, as ``--fit`` measures it); none for an
    architecture without an MTP graph here (:data:`MTP_GRAPHS`) or a file without NextN layers (a
    ``-md`` draft without them: the server stops, ``speculative.spec_refusals``)."""
    arch_fn = MTP_GRAPHS.get(model.arch)
    if arch_fn is None or not model.summary.n_nextn:
        return []
    backends = backends_for(devices, placement)
    n_copies = N_COPIES_PIPELINE if pipeline_parallel(devices, placement, p) else 1
    kv_dev: Callable[[int], str] = (placement.layer_device if p.offload_kqv else (lambda il: "CPU"))
    weights = weight_factory(model, placement)
    shapes = reserve_shapes(model, ctx, p, full_offload(placement))
    reserves = [reserve(sh, arch_fn, backends, n_copies, weights, placement.layer_device, kv_dev,
                        no_alloc=no_alloc, op_offload=p.op_offload)
                for sh in (shapes[:1] if no_alloc else shapes)]
    sizes = [max(r.sizes[i] for r in reserves) for i in range(len(backends))]
    return [Buffer(be.name, be.buft, "compute", size,
                   f"MTP graph (NextN block {model.summary.n_layer_trunk}): peak at "
                   f"{max(reserves, key=lambda r: r.sizes[i]).peaks[i] or 'its inputs'}")
            for i, (be, size) in enumerate(zip(backends, sizes, strict=True)) if size > 1]
