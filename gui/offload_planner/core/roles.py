"""Tensor roles: which part of the network a tensor belongs to, derived from its name.

Names follow ``LLM_TENSOR_NAMES`` in llama.cpp's ``src/llama-arch.cpp`` across all architectures.
The rules are ordered; the first that matches decides.  Unknown names get :attr:`Role.OTHER` and
are still placed and counted.  NextN/MTP blocks are recognised by name (``.nextn.``) and by layer
index (``blk.N`` with N >= the trunk layer count) when the caller passes ``n_layer_trunk``.
"""

from __future__ import annotations

import re
from enum import StrEnum


class Role(StrEnum):
    TOKEN_EMBD = "token_embd"
    OUTPUT = "output"
    OUTPUT_NORM = "output_norm"
    ATTENTION = "attention"
    ATTN_NORM = "attn_norm"
    ROUTER = "router"
    FFN_DENSE = "ffn_dense"
    FFN_NORM = "ffn_norm"
    SHARED_EXPERT = "shared_expert"
    EXPERTS_UP = "experts_up"
    EXPERTS_GATE = "experts_gate"
    EXPERTS_DOWN = "experts_down"
    EXPERTS_GATE_UP = "experts_gate_up"
    NEXTN = "nextn"
    RECURRENT = "recurrent"
    ROPE = "rope"
    OTHER = "other"

    @property
    def label(self) -> str:
        return _LABELS[self]

    @property
    def is_routed_expert(self) -> bool:
        return self in ROUTED_EXPERT_ROLES

    @property
    def is_norm(self) -> bool:
        return self in (Role.ATTN_NORM, Role.FFN_NORM, Role.OUTPUT_NORM)


ROUTED_EXPERT_ROLES = frozenset(
    {Role.EXPERTS_UP, Role.EXPERTS_GATE, Role.EXPERTS_DOWN, Role.EXPERTS_GATE_UP}
)

_LABELS: dict[Role, str] = {
    Role.TOKEN_EMBD: "token embedding",
    Role.OUTPUT: "output",
    Role.OUTPUT_NORM: "output norm",
    Role.ATTENTION: "attention",
    Role.ATTN_NORM: "attention norm",
    Role.ROUTER: "router",
    Role.FFN_DENSE: "dense FFN",
    Role.FFN_NORM: "FFN norm",
    Role.SHARED_EXPERT: "shared expert",
    Role.EXPERTS_UP: "routed experts (up)",
    Role.EXPERTS_GATE: "routed experts (gate)",
    Role.EXPERTS_DOWN: "routed experts (down)",
    Role.EXPERTS_GATE_UP: "routed experts (gate+up)",
    Role.NEXTN: "NextN / MTP",
    Role.RECURRENT: "recurrent / SSM",
    Role.ROPE: "rope factors",
    Role.OTHER: "other",
}

_LAYER_RE = re.compile(r"^(?:enc\.|dec\.)?blk\.(\d+)\.")

# Non-layer tensors.
_GLOBAL_RULES: tuple[tuple[re.Pattern[str], Role], ...] = (
    (re.compile(r"^(token_embd|per_layer_token_embd|position_embd|token_types)\."), Role.TOKEN_EMBD),
    (re.compile(r"^(output_norm|enc\.output_norm|dec\.output_norm|cls\.norm)\."), Role.OUTPUT_NORM),
    (re.compile(r"^(output|cls|cls\.output|dense_2|dense_3|output_hc_\w+|output_res_score)\."),
     Role.OUTPUT),
    (re.compile(r"^rope_(freqs|factors_long|factors_short)\."), Role.ROPE),
    (re.compile(r"^(token_embd_norm|per_layer_model_proj|per_layer_proj_norm)\."), Role.TOKEN_EMBD),
)

# Per-layer tensors, matched against the name with the ``blk.N.`` prefix removed.
_LAYER_RULES: tuple[tuple[re.Pattern[str], Role], ...] = (
    (re.compile(r"^nextn\."), Role.NEXTN),
    (re.compile(r"^ffn_(gate_up)_(ch)?exps\b"), Role.EXPERTS_GATE_UP),
    (re.compile(r"^ffn_up_(ch)?exps\b"), Role.EXPERTS_UP),
    (re.compile(r"^ffn_gate_(ch)?exps\b"), Role.EXPERTS_GATE),
    (re.compile(r"^ffn_down_(ch)?exps\b"), Role.EXPERTS_DOWN),
    (re.compile(r"^ffn_up\.\d+\.weight$"), Role.EXPERTS_UP),  # legacy split experts (Mixtral)
    (re.compile(r"^ffn_gate\.\d+\.weight$"), Role.EXPERTS_GATE),
    (re.compile(r"^ffn_down\.\d+\.weight$"), Role.EXPERTS_DOWN),
    (re.compile(r"^ffn_(gate|up|down|gate_up)_shexp\b|^ffn_gate_inp_shexp\b"), Role.SHARED_EXPERT),
    (re.compile(r"^(ffn_gate_inp|exp_probs_b(_vl)?|ffn_exp_probs_b|ffn_gate_tid2eid)\b"), Role.ROUTER),
    (re.compile(r"^(ffn_norm_exps|ffn_latent_(down|up))\b"), Role.OTHER),
    (re.compile(r"^(ffn_norm|post_ffw_norm(_1|_2)?|pre_ffw_norm(_2)?|ffn_sub_norm|"
                r"layer_output_norm|layer_output_scale|ffn_post_norm)\."), Role.FFN_NORM),
    (re.compile(r"^ffn_(gate|up|down|gate_up|act)\."), Role.FFN_DENSE),
    (re.compile(r"^(attn_norm|attn_norm_2|attn_q_norm|attn_k_norm|attn_sub_norm|attn_output_norm|"
                r"post_attention_norm|attn_q_a_norm|attn_kv_a_norm|attn_post_norm)\."), Role.ATTN_NORM),
    (re.compile(r"^(attn_\w+|indexer[._]\w*|attn)\b"), Role.ATTENTION),
    (re.compile(r"^(ssm_\w+|time_mix_\w+|channel_mix_\w+|shortconv\.\w+)"), Role.RECURRENT),
    (re.compile(r"^rope_(freqs|factors_long|factors_short)\."), Role.ROPE),
)


def layer_of(name: str) -> int | None:
    """The ``blk.N`` index of a tensor name, or None for non-layer tensors."""
    m = _LAYER_RE.match(name)
    return int(m.group(1)) if m else None


def classify(name: str, n_layer_trunk: int | None = None) -> tuple[int | None, Role]:
    """Layer index and role of a tensor name.

    ``n_layer_trunk`` (block_count minus nextn_predict_layers) marks every ``blk.N`` with
    N >= it as a NextN/MTP block, as llama.cpp does.
    """
    m = _LAYER_RE.match(name)
    if m is None:
        for pattern, role in _GLOBAL_RULES:
            if pattern.search(name):
                return None, role
        return None, Role.OTHER
    layer = int(m.group(1))
    if n_layer_trunk is not None and layer >= n_layer_trunk:
        return layer, Role.NEXTN
    rest = name[m.end():]
    for pattern, role in _LAYER_RULES:
        if pattern.search(rest):
            return layer, role
    return layer, Role.OTHER
