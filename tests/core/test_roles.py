"""Roles from tensor names, over every tensor name the gguf package knows for any architecture."""

from __future__ import annotations

import pytest
from gguf.constants import MODEL_ARCH_NAMES, MODEL_TENSORS, TENSOR_NAMES

from offload_planner.core.roles import ROUTED_EXPERT_ROLES, Role, classify

# Expected role per gguf MODEL_TENSOR member-name pattern (an independent statement of intent,
# checked against our name-based rules for every architecture llama.cpp's converter writes).
EXPECTED: list[tuple[str, Role]] = [
    ("FFN_GATE_UP_EXP", Role.EXPERTS_GATE_UP),
    ("FFN_GATE_EXP", Role.EXPERTS_GATE),
    ("FFN_UP_EXP", Role.EXPERTS_UP),
    ("FFN_DOWN_EXP", Role.EXPERTS_DOWN),
    ("FFN_GATE_INP_SHEXP", Role.SHARED_EXPERT),
    ("_SHEXP", Role.SHARED_EXPERT),
    ("FFN_GATE_INP", Role.ROUTER),
    ("FFN_EXP_PROBS_B", Role.ROUTER),
    ("TOKEN_EMBD", Role.TOKEN_EMBD),
    ("OUTPUT_NORM", Role.OUTPUT_NORM),
    ("NEXTN_", Role.NEXTN),
    ("SSM_", Role.RECURRENT),
    ("TIME_MIX_", Role.RECURRENT),
    ("CHANNEL_MIX_", Role.RECURRENT),
]


def _expected(member: str) -> Role | None:
    for pat, role in EXPECTED:
        if pat in member:
            return role
    return None


def _layer_tensor_names() -> list[tuple[str, str]]:
    out = []
    for arch in MODEL_ARCH_NAMES:
        for t in MODEL_TENSORS.get(arch, []):
            fmt = TENSOR_NAMES[t]
            if not fmt.startswith("blk."):
                continue
            out.append((t.name, fmt.format(bid=7, xid=1) + ".weight"))
    return sorted(set(out))


@pytest.mark.parametrize(("member", "name"), _layer_tensor_names())
def test_known_layer_tensors_get_layer_and_expected_role(member: str, name: str) -> None:
    layer, role = classify(name)
    assert layer == 7
    want = _expected(member)
    if want is not None:
        assert role is want, (member, name, role)
    elif member.startswith("ATTN_") and "NORM" not in member:
        assert role is Role.ATTENTION, (member, name, role)
    elif member.startswith("ATTN_") or (member.endswith("_NORM") and member.startswith("FFN")):
        assert role in (Role.ATTN_NORM, Role.FFN_NORM, Role.OTHER), (member, name, role)


@pytest.mark.parametrize(
    ("name", "layer", "role"),
    [
        ("token_embd.weight", None, Role.TOKEN_EMBD),
        ("output.weight", None, Role.OUTPUT),
        ("output_norm.weight", None, Role.OUTPUT_NORM),
        ("blk.3.ffn_up_exps.weight", 3, Role.EXPERTS_UP),
        ("blk.3.ffn_gate_exps.weight", 3, Role.EXPERTS_GATE),
        ("blk.3.ffn_down_exps.weight", 3, Role.EXPERTS_DOWN),
        ("blk.3.ffn_down_exps.bias", 3, Role.EXPERTS_DOWN),  # gpt-oss
        ("blk.3.ffn_gate_up_exps.weight", 3, Role.EXPERTS_GATE_UP),
        ("blk.3.ffn_up_chexps.weight", 3, Role.EXPERTS_UP),  # GroveMoE chunk experts
        ("blk.3.ffn_up_shexp.weight", 3, Role.SHARED_EXPERT),
        ("blk.3.ffn_gate_inp_shexp.weight", 3, Role.SHARED_EXPERT),
        ("blk.3.ffn_gate_inp.weight", 3, Role.ROUTER),
        ("blk.3.exp_probs_b.bias", 3, Role.ROUTER),
        ("blk.0.ffn_up.weight", 0, Role.FFN_DENSE),
        ("blk.0.ffn_up.3.weight", 0, Role.EXPERTS_UP),  # legacy Mixtral split experts
        ("blk.3.attn_k_b.weight", 3, Role.ATTENTION),
        ("blk.3.attn_kv_a_mqa.weight", 3, Role.ATTENTION),
        ("blk.3.attn_kv_a_norm.weight", 3, Role.ATTN_NORM),
        ("blk.3.attn_sinks.weight", 3, Role.ATTENTION),
        ("blk.3.attn_norm.weight", 3, Role.ATTN_NORM),
        ("blk.3.ffn_norm.weight", 3, Role.FFN_NORM),
        ("blk.3.post_ffw_norm.weight", 3, Role.FFN_NORM),
        ("blk.3.indexer.k_norm.weight", 3, Role.ATTENTION),
        ("blk.46.nextn.eh_proj.weight", 46, Role.NEXTN),
        ("blk.3.ssm_conv1d.weight", 3, Role.RECURRENT),
        ("rope_freqs.weight", None, Role.ROPE),
        ("enc.blk.2.attn_q.weight", 2, Role.ATTENTION),
        ("mystery.tensor", None, Role.OTHER),
        ("blk.5.something_new.weight", 5, Role.OTHER),
    ],
)
def test_classify_examples(name: str, layer: int | None, role: Role) -> None:
    assert classify(name) == (layer, role)


def test_blocks_past_the_trunk_are_nextn_whatever_their_name() -> None:
    # GLM-4.5-Air: block_count 47 with 1 NextN layer; blk.46 holds ordinary-looking tensors too.
    assert classify("blk.46.ffn_up_exps.weight", n_layer_trunk=46) == (46, Role.NEXTN)
    assert classify("blk.45.ffn_up_exps.weight", n_layer_trunk=46) == (45, Role.EXPERTS_UP)


def test_routed_expert_roles_are_exactly_the_four_expert_kinds() -> None:
    assert {r for r in Role if r.is_routed_expert} == ROUTED_EXPERT_ROLES
    assert all(r.label for r in Role)
