"""Hyperparameters of a model, read from its metadata as llama.cpp reads them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence, Sized
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from offload_planner.core.metadata import LLAMA_MAX_LAYERS, Meta, PerLayer

if TYPE_CHECKING:
    from offload_planner.core.model import Model

#: Default SWA pattern per architecture when the file has no ``sliding_window_pattern``:
#: (n_pattern, dense_first), from ``load_swa_pattern`` calls in llama.cpp's ``src/models/``.
SWA_DEFAULT_PATTERN: dict[str, tuple[int, bool]] = {
    "afmoe": (4, False), "cohere2": (4, False), "cohere2moe": (4, True),
    "exaone-moe": (4, False), "exaone4": (4, False), "gemma-embedding": (6, False),
    "gemma2": (2, False), "gemma3": (6, False), "gemma3n": (5, False), "laguna": (4, True),
    "llama4": (4, False), "mellum": (4, False), "modern-bert": (3, True),
    "muse-glimmer": (4, False), "olmo2": (4, False), "gpt-oss": (2, False),
    "plamo3": (8, False), "smallthinker": (4, True),
}

#: llama_ftype names (``general.file_type``), from ``include/llama.h``.
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 1024: "GUESSED",
}

#: The most of ``general.name`` a summary keeps: a file's 5 MB name took the window 9 s to show
#: (the model line elided it on every layout) and filled a terminal through inspect
MAX_NAME_CHARS = 200


def short_name(value: object, limit: int = MAX_NAME_CHARS) -> str:
    """A file's string (``general.name``, a tokenizer's name) as a summary or a message shows it: at
    most ``limit`` characters."""
    text = str(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


#: The longest ``general.architecture`` taken (llama.cpp's names have at most 20 characters): a 2 MB
#: one went into every key the planner looks up and into the message that names a missing one (a
#: 2 MB error line; 17 s before the window said it)
MAX_ARCH_CHARS = 128


@dataclass(frozen=True)
class ModelSummary:
    arch: str
    name: str
    n_layer: int  # block_count, NextN/MTP blocks included (llama.cpp's n_layer_all)
    n_nextn: int
    n_ctx_train: int
    n_embd: int
    n_ff: PerLayer
    n_head: PerLayer
    n_head_kv: PerLayer
    head_dim_k: int
    head_dim_v: int
    n_expert: int
    n_expert_used: int
    n_expert_shared: int
    n_ff_exp: int
    n_layer_dense_lead: int
    n_vocab: int
    n_swa: int
    swa_layers: tuple[bool, ...]  # per layer; all False when the model has no SWA
    q_lora_rank: int
    kv_lora_rank: int
    key_length_mla: int
    value_length_mla: int
    file_type: str
    tied_embeddings: bool
    header_only: bool
    total_bytes: int
    n_tensors: int
    role_bytes: dict[str, int] = field(default_factory=dict)
    type_counts: dict[str, int] = field(default_factory=dict)

    @property
    def n_layer_trunk(self) -> int:
        return self.n_layer - self.n_nextn

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    @property
    def is_mla(self) -> bool:
        return self.key_length_mla > 0

    @property
    def has_swa(self) -> bool:
        return any(self.swa_layers)

    def per_layer(self, value: PerLayer, layer: int) -> int:
        return value[layer] if isinstance(value, list) else value

    def head_kv(self, layer: int) -> int:
        return self.per_layer(self.n_head_kv, layer)


def _first(v: PerLayer) -> int:
    return v if isinstance(v, int) else max(v, default=0)


#: architectures whose ``load_arch_hparams`` marks the NextN blocks SWA as well (deepseek4: ``is_swa_impl[il]
#: = true`` for ``il >= n_layer()``, src/models/deepseek4.cpp 72-74)
SWA_NEXTN_ARCHS = frozenset({"deepseek4"})


def swa_layers(meta: Meta, arch: str, n_layer: int, n_trunk: int) -> tuple[bool, ...]:
    """Which layers use sliding-window attention, as ``llama_hparams::set_swa_pattern`` decides."""
    if meta.count(f"{arch}.attention.sliding_window") <= 0:
        return (False,) * n_layer
    key = f"{arch}.attention.sliding_window_pattern"
    pat = meta.md.get(key)
    if isinstance(pat, Sequence) and not isinstance(pat, str):
        meta.per_layer(key, 0, n_layer)  # at most LLAMA_MAX_LAYERS integers (bools)
        flags = [bool(x) for x in pat][:n_layer]
        return tuple(flags + [False] * (n_layer - len(flags)))
    n_pattern, dense_first = SWA_DEFAULT_PATTERN.get(arch, (0, False))
    if pat is not None:
        n_pattern = meta.count(key)
    out = []
    for il in range(n_layer):
        if il >= n_trunk:
            out.append(arch in SWA_NEXTN_ARCHS)
        elif dense_first:
            out.append(n_pattern == 0 or il % n_pattern != 0)
        else:
            out.append(n_pattern == 0 or il % n_pattern < n_pattern - 1)
    return tuple(out)


def summarize(model: Model) -> ModelSummary:
    md = model.metadata
    m = model.meta
    arch = model.arch
    if len(arch) > MAX_ARCH_CHARS:
        raise m.fail("general.architecture", f"{len(arch):,} characters ({arch[:40]!r}...): no llama.cpp "
                                             "architecture is named so (it refuses the file: unknown model "
                                             "architecture)")
    a = f"{arch}."
    n_layer = m.count(a + "block_count", hi=LLAMA_MAX_LAYERS,
                      what=f"blocks: llama.cpp loads at most {LLAMA_MAX_LAYERS} (LLAMA_MAX_LAYERS)")
    n_nextn = m.count(a + "nextn_predict_layers", hi=n_layer,
                      what=f"NextN layers: more than block_count ({n_layer})")
    n_embd = m.count(a + "embedding_length")
    n_head = m.per_layer(a + "attention.head_count", 0, n_layer)
    n_head_kv = m.per_layer(a + "attention.head_count_kv", n_head, n_layer)
    head0 = _first(n_head)
    head_dim_k = m.count(a + "attention.key_length", n_embd // head0 if head0 else 0)
    head_dim_v = m.count(a + "attention.value_length", n_embd // head0 if head0 else 0)
    tokens = md.get("tokenizer.ggml.tokens")
    n_vocab = len(tokens) if isinstance(tokens, Sized) and not isinstance(tokens, str) else 0
    if not n_vocab:
        n_vocab = m.count(a + "vocab_size")
    ftype = md.get("general.file_type")
    file_type = FILE_TYPES.get(ftype, f"type {ftype}") if isinstance(ftype, int) else "unknown"
    role_bytes: Counter[str] = Counter()
    for t in model.tensors:
        role_bytes[t.role.value] += t.nbytes
    return ModelSummary(
        arch=arch,
        name=short_name(md.get("general.name", "")),
        n_layer=n_layer,
        n_nextn=n_nextn,
        n_ctx_train=m.count(a + "context_length"),
        n_embd=n_embd,
        n_ff=m.per_layer(a + "feed_forward_length", 0, n_layer),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        n_expert=m.count(a + "expert_count"),
        n_expert_used=m.count(a + "expert_used_count"),
        n_expert_shared=m.count(a + "expert_shared_count"),
        n_ff_exp=m.count(a + "expert_feed_forward_length"),
        n_layer_dense_lead=m.count(a + "leading_dense_block_count"),
        n_vocab=n_vocab,
        n_swa=m.count(a + "attention.sliding_window"),
        swa_layers=swa_layers(m, arch, n_layer, n_layer - n_nextn),
        q_lora_rank=m.count(a + "attention.q_lora_rank"),
        kv_lora_rank=m.count(a + "attention.kv_lora_rank"),
        key_length_mla=m.count(a + "attention.key_length_mla"),
        value_length_mla=m.count(a + "attention.value_length_mla"),
        file_type=file_type,
        tied_embeddings=model.get("output.weight") is None,
        header_only=model.header_only,
        total_bytes=model.total_bytes,
        n_tensors=len(model.tensors),
        role_bytes=dict(role_bytes),
        type_counts=dict(model.type_histogram()),
    )

