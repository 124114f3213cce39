"""From the planner's model and placement to ik's simulation: which models have ik's graph, the graph's
shape, the weights (plus the tensors ik computes at load), whether the NextN layers load."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from offload_planner.core import ik
from offload_planner.core.compute.ggml import T
from offload_planner.core.compute.graph import gating_func
from offload_planner.core.compute.simulate import weight_factory
from offload_planner.core.compute_ik.builder import IkShape
from offload_planner.core.ggml_types import type_by_name
from offload_planner.core.roles import Role

if TYPE_CHECKING:
    from offload_planner.core.memory import ContextParams, ResolvedContext
    from offload_planner.core.model import Model
    from offload_planner.core.placement import Placement


def loads_nextn(model: Model, placement: Placement) -> bool:
    """The model is loaded with its NextN layers (``llama_model_params.mtp``: an MTP stage)."""
    # the role, not the layer index: deepseek32 / glm-dsa files keep a NextN block's tensor loaded (core.dsa)
    nextn = Role.NEXTN
    return model.summary.n_nextn > 0 and any(
        it.device is not None for it in placement.items if it.tensor.role is nextn)


def supported(model: Model, p: ContextParams) -> bool:
    """Whether this module has ik's graph for the model: the configurations verified against ik's CPU
    build (``tests/integration/test_ik_compute.py``).  DeepSeek-style MLA files with sigmoid (V3, R1,
    Kimi K2, ...) or softmax routing (V2) in every -mla mode, with and without flash attention, -amb
    included; dense and Mixtral-style MoE llama; qwen3moe; glm4moe; gpt-oss; gemma3.  Other
    architectures are left to the estimate."""
    if model.arch == "deepseek2":
        return ik.uses_mla(model) and gating_func(model) in (1, 2)
    return model.arch in ("llama", "qwen3moe", "glm4moe", "gpt-oss", "gemma3")


def _norm_w(model: Model) -> bool:
    """``norm_w`` of the architecture's ``llm_build_moe_ffn`` call: fixed in the graph builder for
    llama/qwen3moe (on) and gpt-oss (off), from ``expert_weights_norm`` for the DeepSeek/GLM family."""
    if model.arch in ("llama", "qwen3moe"):
        return True
    if model.arch == "gpt-oss":
        return False
    return bool(model.metadata.get(f"{model.arch}.expert_weights_norm"))


def ik_shape(model: Model, ctx: ResolvedContext, p: ContextParams, cpu_only: bool) -> IkShape:
    s = model.summary
    # ik bounds the batch by the padded context: n_batch = min(n_ctx, -b), n_ubatch = min(n_batch, -ub)
    n_tokens = min(ctx.n_ctx, p.n_batch, p.n_ubatch or p.n_batch)
    head_k, head_v = ik.head_dims(model) if model.arch == "deepseek2" else (s.head_dim_k, s.head_dim_v)

    def per_layer(v: int | list[int]) -> tuple[int, ...]:
        return tuple(v) if isinstance(v, list) else (v,) * s.n_layer

    gating = gating_func(model)
    scale = model.arch_float("expert_weights_scale", 0.0)
    n_head = per_layer(s.n_head)
    return IkShape(
        arch=model.arch, n_layer=s.n_layer_trunk, n_embd=s.n_embd, n_head=n_head,
        n_head_kv=n_head if model.arch == "deepseek2" else per_layer(s.n_head_kv),
        head_k=head_k, head_v=head_v, n_rot=ik.n_rot(model), n_vocab=s.n_vocab,
        n_expert=s.n_expert, n_expert_used=s.n_expert_used, n_dense_lead=s.n_layer_dense_lead,
        gating=gating, norm_w=_norm_w(model),
        w_scale=scale,
        kv_lora_rank=s.kv_lora_rank, mla=p.mla, attn_max_batch=p.amb, n_tokens=n_tokens,
        n_outputs=n_tokens, n_kv=ctx.n_ctx,
        flash_attn=p.flash_attn, type_k=type_by_name(p.type_k), type_v=type_by_name(p.type_v),
        cpu_only=cpu_only, mask_f32=p.dialect.f32_kq_mask,
        mla_fa_steps_expanded=p.dialect.mla_fa_steps_expanded,
    )


def ik_weights(model: Model, placement: Placement, mla: int) -> Callable[[str], T | None]:
    """The model's weights, plus the attention tensors ik computes at load for the MLA mode."""
    base = weight_factory(model, placement)
    extra: dict[str, T] = {}
    for ct, dev in ik.placed_computed_tensors(model, placement, mla):
        t = T(ct.type, ct.shape, name=ct.name)
        t.dev, t.weights = dev, True
        extra[ct.name] = t

    def get(name: str) -> T | None:
        return extra.get(name) or base(name)

    return get
