"""What the fastest-plan search varies beside the experts' devices: ``-ub`` and the KV cache's types
and device (a variant of the command)."""

from __future__ import annotations

from dataclasses import replace

from offload_planner.core.mapped_span import mapping_gpus, unmapped_flags
from offload_planner.core.plan import Plan

PP_UBATCHES = (2048, 4096)  # -ub tried beyond the command's for the pp and balanced goals


KV_QUANT = "q8_0"  # the KV cache type the search may pick where the user allows it
QUANT_BLOCK = 32  # q8_0's block: flash attention needs head sizes that are multiples of it


#: -ub, K and V cache types, the KV cache on the layers' devices, and the flags that load without mmap
#: where a GPU would otherwise map the file (Metal: :func:`unmapped_flags`; else "")
Variant = tuple[int, str, str, bool, str]


def variant(plan: Plan) -> Variant:
    c = plan.context
    return c.n_ubatch, c.type_k, c.type_v, c.offload_kqv, unmapped_flags(plan)


def _describe(var: Variant) -> str:
    ub, k, v, on, unmapped = var
    kv = (f", -ctk {k}" if k != "f16" else "") + (f" -ctv {v}" if v != "f16" else "")
    return f"-ub {ub}{kv}" + ("" if on else ", -nkvo") + (f", {unmapped}" if unmapped else "")


def kvo_choices(plan: Plan, allow: bool) -> list[bool]:
    """Where the KV cache goes: the command's; with ``allow`` and the cache on the GPUs, also the
    CPU (``-nkvo``: its memory left to experts, at the cost of the attention's round trips to the
    host, which the estimate counts)."""
    on = plan.context.offload_kqv
    return [on] + ([False] if allow and on and plan.devices.gpus else [])


def kv_choices(plan: Plan, allow: bool) -> list[tuple[str, str]]:
    """The (K, V) cache types to try: the command's; with ``allow`` and an f16 cache in the command,
    also q8_0 where llama.cpp accepts it (``llama_init_from_model``): a quantized V cache needs flash
    attention, K and V of MLA models must have one type, and with flash attention each head's size
    must be a multiple of the type's block (32)."""
    c = plan.context
    out = [(c.type_k, c.type_v)]
    if not allow or (c.type_k, c.type_v) != ("f16", "f16"):
        return out
    s = plan.model.summary
    dims_ok = s.head_dim_k % QUANT_BLOCK == 0 and s.head_dim_v % QUANT_BLOCK == 0
    if c.flash_attn and dims_ok:
        out.append((KV_QUANT, KV_QUANT))
    elif not c.flash_attn and not s.is_mla:
        out.append((KV_QUANT, "f16"))
    return out


def with_kv(plan: Plan, kv: tuple[str, str], offload: bool | None = None) -> Plan:
    """``plan`` with the KV cache types ``kv`` and, unless None, ``offload`` (False: ``-nkvo``)."""
    ctx = replace(plan.context, type_k=kv[0], type_v=kv[1])
    return replace(plan, context=ctx if offload is None else replace(ctx, offload_kqv=offload))


def _ubatches(user_ub: int, goal: str) -> list[int]:
    return [user_ub] + [u for u in PP_UBATCHES if u > user_ub and goal != "tg"]


def unmapped_choice(plan: Plan, notes: list[str]) -> list[list[str]]:
    """Beside the command's load, loading without mmap where a GPU maps the file (Metal): its mapped
    buffer spans the file from its first tensor to its last, so the experts the search leaves on the CPU
    between a GPU's layers count on that GPU too (``--cpu-moe`` keeps the span); without mmap it holds
    its tensors only (the CPU's are read into a buffer of their own). The estimate ranks both; a note
    says why the candidates with the flags are there. [] without such a GPU."""
    gpus = mapping_gpus(plan)
    if not gpus:
        return []
    flags = list(plan.dialect.no_mmap_flags)
    notes.append(f"{', '.join(gpus)} map{'s' if len(gpus) == 1 else ''} the model file with mmap: "
                 "the weights count the file span from the first to the last of the GPU's tensors, the "
                 "CPU's tensors between them included (moving experts to the CPU does not shrink it); "
                 f"candidates with {' '.join(flags)} copy only the GPU's tensors")
    return [flags]
