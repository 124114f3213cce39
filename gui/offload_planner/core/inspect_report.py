"""Text and JSON reports of a model for ``offload-planner inspect``."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from offload_planner.core.model import Model, Tensor
from offload_planner.core.printable import printable
from offload_planner.core.roles import ROUTED_EXPERT_ROLES, Role
from offload_planner.core.units import fmt_bytes

#: Columns of the per-layer table: heading -> roles it sums.
LAYER_COLUMNS: tuple[tuple[str, frozenset[Role]], ...] = (
    ("attn", frozenset({Role.ATTENTION})),
    ("router", frozenset({Role.ROUTER})),
    ("dense", frozenset({Role.FFN_DENSE})),
    ("shexp", frozenset({Role.SHARED_EXPERT})),
    ("experts", ROUTED_EXPERT_ROLES),
    ("norms", frozenset({Role.ATTN_NORM, Role.FFN_NORM})),
    ("other", frozenset({Role.NEXTN, Role.RECURRENT, Role.ROPE, Role.OTHER})),
)


def tensor_json(t: Tensor) -> dict[str, Any]:
    return {
        "name": t.name,
        "layer": t.layer,
        "role": t.role.value,
        "type": t.type.name,
        "shape": list(t.shape),
        "bytes": t.nbytes,
        "shard": t.shard,
    }


def model_json(model: Model) -> dict[str, Any]:
    s = model.summary
    return {
        "path": model.path,
        "arch": s.arch,
        "name": s.name,
        "n_layer": s.n_layer,
        "n_nextn": s.n_nextn,
        "n_ctx_train": s.n_ctx_train,
        "n_embd": s.n_embd,
        "n_head": s.n_head,
        "n_head_kv": s.n_head_kv,
        "head_dim_k": s.head_dim_k,
        "head_dim_v": s.head_dim_v,
        "n_ff": s.n_ff,
        "n_vocab": s.n_vocab,
        "n_expert": s.n_expert,
        "n_expert_used": s.n_expert_used,
        "n_expert_shared": s.n_expert_shared,
        "n_ff_exp": s.n_ff_exp,
        "n_layer_dense_lead": s.n_layer_dense_lead,
        "n_swa": s.n_swa,
        "swa_layers": [i for i, f in enumerate(s.swa_layers) if f],
        "q_lora_rank": s.q_lora_rank,
        "kv_lora_rank": s.kv_lora_rank,
        "key_length_mla": s.key_length_mla,
        "value_length_mla": s.value_length_mla,
        "file_type": s.file_type,
        "flavor": model.flavor.value if model.flavor else None,
        "tied_embeddings": s.tied_embeddings,
        "header_only": model.header_only,
        "total_bytes": model.total_bytes,
        "n_tensors": len(model.tensors),
        "shards": [
            {
                "path": sh.path,
                "file_size": sh.file_size,
                "data_offset": sh.data_offset,
                "header_only": sh.header_only,
                "n_tensors": sh.n_tensors,
                "version": sh.version,
            }
            for sh in model.shards
        ],
        "role_bytes": s.role_bytes,
        "type_counts": s.type_counts,
        "tensors": [tensor_json(t) for t in model.tensors],
    }


def _per_layer(model: Model) -> dict[int | None, dict[str, int]]:
    rows: dict[int | None, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    col_of = {role: name for name, roles in LAYER_COLUMNS for role in roles}
    for t in model.tensors:
        rows[t.layer][col_of.get(t.role, "other")] += t.nbytes
    return rows


def _unit(model: Model) -> tuple[str, int]:
    return ("GiB", 1024**3) if model.total_bytes >= 16 * 1024**3 else ("MiB", 1024**2)


def _cell(n: int, scale: int) -> str:
    return f"{n / scale:9.3f}" if n else "        -"


def text_report(model: Model, *, layers: bool = True) -> str:
    s = model.summary
    lines: list[str] = []
    # the file's strings (and the path) escaped one by one: the report keeps its own line breaks, so a
    # line break in general.name printed a line of the file's making
    title = printable(s.name or str(model.path))
    lines.append(f"{title}")
    lines.append(
        f"  arch {printable(s.arch)}, {s.n_layer} layers"
        + (f" ({s.n_nextn} NextN/MTP)" if s.n_nextn else "")
        + f", file type {s.file_type}, {fmt_bytes(model.total_bytes)} of weights"
        + (", HEADER ONLY (no tensor data)" if model.header_only else "")
    )
    if len(model.shards) > 1:
        lines.append(f"  {len(model.shards)} shards")
    if model.flavor is not None:
        lines.append(f"  quant types of {model.flavor.value}")
    lines.append(
        f"  n_embd {s.n_embd}, n_head {s.n_head}, n_head_kv {s.n_head_kv}, "
        f"head dim k/v {s.head_dim_k}/{s.head_dim_v}, context {s.n_ctx_train}, vocab {s.n_vocab}"
    )
    if s.is_moe:
        lines.append(
            f"  experts {s.n_expert} ({s.n_expert_used} used, {s.n_expert_shared} shared), "
            f"expert FFN {s.n_ff_exp}, leading dense layers {s.n_layer_dense_lead}"
        )
    if s.is_mla:
        lines.append(
            f"  MLA: q_lora_rank {s.q_lora_rank}, kv_lora_rank {s.kv_lora_rank}, "
            f"key_length_mla {s.key_length_mla}, value_length_mla {s.value_length_mla}"
        )
    if s.has_swa:
        n_swa_layers = sum(s.swa_layers)
        lines.append(f"  sliding window {s.n_swa} on {n_swa_layers} of {s.n_layer} layers")
    hist = Counter(model.type_histogram())
    lines.append("  types: " + ", ".join(f"{k} {v}" for k, v in hist.most_common()))
    lines.append(
        "  by role: "
        + ", ".join(
            f"{Role(k).label} {fmt_bytes(v)}"
            for k, v in sorted(s.role_bytes.items(), key=lambda kv: -kv[1])
        )
    )
    if layers:
        lines.append("")
        lines.extend(_layer_table(model))
    return "\n".join(lines)


def _layer_table(model: Model) -> list[str]:
    unit, scale = _unit(model)
    heads = [name for name, _ in LAYER_COLUMNS]
    # the tensors outside the layers in a table of their own: printed under the layer table's header,
    # their name, type and size ran across its columns
    outside = [t for t in model.tensors if t.layer is None]
    lines: list[str] = []
    if outside:
        names = [printable(t.name) for t in outside]
        w = max(map(len, names))
        lines.append(f"  {'outside the layers':<18} {'tensor':<{w}} {'type':<6} {'size':>9}  ({unit})")
        lines += [f"  {t.role.label:<18} {name:<{w}} {t.type.name:<6} {_cell(t.nbytes, scale)}"
                  for t, name in zip(outside, names, strict=True)]
        lines.append("")
    lines.append("  layer   " + " ".join(f"{h:>9}" for h in heads) + f"     total  ({unit})")
    rows = _per_layer(model)
    for k in sorted(k for k in rows if k is not None):
        row = rows[k]
        lines.append(
            f"  {k:6d}  "
            + " ".join(_cell(row.get(h, 0), scale) for h in heads)
            + f" {sum(row.values()) / scale:9.3f}"
        )
    return lines
