"""What ik_llama.cpp allocates differently from mainline llama.cpp for DeepSeek-style MLA models.

Read from ik's source (``src/llama.cpp``: ``llm_prepare_mla``, ``llama_kv_cache_init``;
``src/llama-hparams.cpp``) and measured with ik's own libllama (the ik-llama-cpp-python wheel, CPU):
``tests/integration/test_ik_memory.py`` compares every figure here with what ik logs and reports.

* **MLA mode** (``-mla``, server default 3) applies to ``deepseek2`` models only.  The KV cache per
  layer is then ``c^KV``: ``kv_lora_rank + n_rot`` values per cell in the K type (in the V type
  for ``-mla 2/3`` without flash attention, although ik's log names the K type), plus, for
  ``-mla 1`` without flash attention, ``kv^T``: ``kv_lora_rank`` per cell in the V type.
  ``-mla 0`` keeps the standard cache with every head (``key_length_mla`` and
  ``value_length_mla`` per head).
* **Computed tensors.**  At load ik derives the attention tensors its MLA modes need that the file
  lacks, each in its own buffer of the source tensor's buffer type (so on that tensor's device):
  files converted by mainline (``attn_k_b``/``attn_v_b``, no ``attn_kv_b``) get ``attn_kv_b``
  unless ``-mla 1``: ``kv_lora_rank x n_head*(qk_nope + v_head)`` in Q8_0 (F16/BF16 when both
  sources are). Older files (``attn_kv_b`` only) get ``attn_k_b`` and ``attn_v_b`` for
  ``-mla`` >= 1.  For DeepSeek-V3 at Q4_K_M that is about 1 GiB more than the file holds.
* **Refusal.**  ik aborts on mainline-converted MLA files whose shapes it cannot map back
  (``n_head % 4``, ``key_length`` 576, ``value_length`` 512, ``n_rot`` 64).
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass

from offload_planner.core.ggml_types import GGMLType, type_by_name
from offload_planner.core.model import Model
from offload_planner.core.placement import CPU, Placement

IK_DEFAULT_MLA = 3  # gpt_params::mla_attn
_R8_FIRST, _R8_LAST = 202, 399  # GGML_TYPE_Q4_0_R8 .. GGML_TYPE_Q8_K_R8 in ik's enum


#: the architectures ik applies its MLA modes to (``llama_model::is_mla_model``, src/llama-model.h 593-595
#: at 8337e4cd, which also has mistral4 and bailingmoe3: not modelled here)
IK_MLA_ARCHS = frozenset({"deepseek2", "glm-dsa"})


def uses_mla(model: Model) -> bool:
    """ik applies its MLA modes to deepseek2 models (DeepSeek V2/V3/R1, Kimi K2, GLM-4.7-Flash...) and
    glm-dsa (GLM-5)."""
    return model.arch in IK_MLA_ARCHS and model.summary.kv_lora_rank > 0


def mla_mode(model: Model, requested: int | None) -> int:
    return (IK_DEFAULT_MLA if requested is None else requested) if uses_mla(model) else 0


def n_rot(model: Model) -> int:
    return model.arch_int("rope.dimension_count", model.summary.head_dim_k)


def head_dims(model: Model) -> tuple[int, int]:
    """Per-head K and V lengths ik uses for the standard cache (``-mla 0``) of a deepseek2 model:
    mainline-converted files are mapped back to ``key_length_mla``/``value_length_mla``."""
    s = model.summary
    if s.head_kv(0) == 1 and s.key_length_mla:
        return s.key_length_mla, s.value_length_mla
    return s.head_dim_k, s.head_dim_v


#: architectures the pinned llama.cpp loads and ik_llama.cpp (8337e4cd, 2026-08-15) does not know:
#: ``llm_arch_from_string`` finds no name in src/llama-arch.cpp and ``llm_load_arch`` throws
IK_UNKNOWN_ARCHS = frozenset({"deepseek32"})


def model_errors(model: Model) -> list[str]:
    """ik's refusals: an architecture it does not have; ``llm_load_hparams``' abort for mainline MLA
    files it cannot convert back."""
    if model.arch in IK_UNKNOWN_ARCHS:
        return [f"{model.path}: ik_llama.cpp cannot load it: \"unknown model architecture: "
                f"'{model.arch}'\" (no {model.arch} in its src/llama-arch.cpp at 8337e4cd; DeepSeek V3.2's "
                "sparse attention runs on mainline llama.cpp)"]
    s = model.summary
    # the same check for glm-dsa (ik's llm_load_hparams, its GLM_DSA case: src/llama-hparams.cpp 1946-1953)
    if model.arch not in ("deepseek2", "glm-dsa") or s.head_kv(0) != 1:
        return []
    n_gqa = s.per_layer(s.n_head, 0)
    if n_gqa % 4 == 0 and s.head_dim_k == 576 and s.head_dim_v == 512 and n_rot(model) == 64:
        return []
    return [f"{model.path}: ik_llama.cpp aborts loading it: \"Detected incompatible DeepSeek model without "
            f"a known way to fix it\" (a mainline MLA file needs n_head % 4 == 0, key_length 576, "
            f"value_length 512, n_rot 64; this one has {n_gqa}, {s.head_dim_k}, {s.head_dim_v}, "
            f"{n_rot(model)}). Re-convert it with ik_llama.cpp's convert_hf_to_gguf.py."]


@dataclass(frozen=True)
class ComputedTensor:
    name: str
    source: str  # the file tensor whose buffer type (device) it takes
    shape: tuple[int, ...]
    type: GGMLType

    @property
    def nbytes(self) -> int:
        return self.type.nbytes(self.shape)


def computed_tensors(model: Model, mla: int) -> list[ComputedTensor]:
    """The tensors ``llm_prepare_mla`` adds at load for MLA mode ``mla``."""
    if not uses_mla(model):
        return []
    s = model.summary
    k_head, v_head = head_dims(model)
    nope = k_head - n_rot(model)
    rank = s.kv_lora_rank
    out: list[ComputedTensor] = []
    for il in range(s.n_layer):
        n_head = s.per_layer(s.n_head, il)
        kv_b = model.get(f"blk.{il}.attn_kv_b.weight")
        k_b = model.get(f"blk.{il}.attn_k_b.weight")
        v_b = model.get(f"blk.{il}.attn_v_b.weight")
        if kv_b is not None and k_b is None and mla > 0:
            if kv_b.type.quantized:
                k_type = type_by_name("q8_0_r8" if _R8_FIRST <= kv_b.type.id <= _R8_LAST else "q8_0")
            else:
                k_type = kv_b.type
            out.append(ComputedTensor(f"blk.{il}.attn_k_b.weight", kv_b.name, (nope, rank, n_head), k_type))
            out.append(ComputedTensor(f"blk.{il}.attn_v_b.weight", kv_b.name, (rank, v_head, n_head),
                                      kv_b.type))
        elif kv_b is None and k_b is not None and v_b is not None and mla != 1:
            same = k_b.type.name == v_b.type.name and k_b.type.name in ("bf16", "f16")
            kv_type = k_b.type if same else type_by_name("q8_0")
            out.append(ComputedTensor(f"blk.{il}.attn_kv_b.weight", k_b.name,
                                      (rank, n_head * (nope + v_head)), kv_type))
    return out


def placed_computed_tensors(model: Model, placement: Placement, mla: int) -> list[tuple[ComputedTensor, str]]:
    """The computed tensors with their device: the source tensor's (a buffer of its buffer type)."""
    computed = computed_tensors(model, mla)
    where = placement.tensor_devices() if computed else {}
    return [(ct, where.get(ct.source) or CPU) for ct in computed]


def kv_row_bytes(model: Model, il: int, mla: int, flash_attn: bool, type_k: GGMLType,
                 type_v: GGMLType) -> tuple[int, int, str]:
    """Bytes per cell of layer ``il``'s K and V caches for a deepseek2 model, and a label."""
    s = model.summary
    if mla == 0:
        k_head, v_head = head_dims(model)
        n_head = s.per_layer(s.n_head, il)
        return type_k.row_bytes(n_head * k_head), type_v.row_bytes(n_head * v_head), "standard cache (-mla 0)"
    if mla >= 2 and not flash_attn:  # ik stores c^KV in the V type here (its log still names -ctk's)
        return type_v.row_bytes(s.kv_lora_rank + n_rot(model)), 0, f"MLA c^KV in the V type (-mla {mla} " \
            "without flash attention)"
    k = type_k.row_bytes(s.kv_lora_rank + n_rot(model))
    if mla == 1 and not flash_attn:
        return k, type_v.row_bytes(s.kv_lora_rank), "MLA c^KV + kv^T (-mla 1 without flash attention)"
    return k, 0, f"MLA c^KV only (-mla {mla}{', flash attention' if flash_attn else ''})"


#: ``is_model_split_supported`` in ik's src/llama.cpp (3895-3927 at 8337e4cd, 2026-08-15, GGUF names
#: from src/llama-arch.cpp): the architectures ``-sm graph``/``attn`` splits in builds of July 2026
#: (the list grew from December 2025: command-r 2026-03-23, deepseek2 / glm-dsa / mistral4 2026-05-19,
#: mellum and laguna 2026-06, cohere2_moe and minimax-m3 2026-06-10/14; muse-glimmer 2026-08-12 is
#: the August builds', :mod:`dialects.ik_amb256`).  The planner's list before had the December 2025 ones.
GRAPH_SPLIT_ARCHS = frozenset({
    "llama", "qwen3moe", "glm4moe", "mistral3", "command-r", "cohere2", "cohere2_moe", "mimo2", "qwen3",
    "qwen3vl", "hunyuan-moe", "gpt-oss", "ernie4_5-moe", "minimax-m2", "minimax-m3", "seed_oss", "step35",
    "laguna", "qwen35", "qwen35moe", "gemma4", "gemma4_mtp", "gemma4-assistant", "deepseek2", "glm-dsa",
    "mistral4", "mellum"})


def splits_by_graph(model: Model, archs: frozenset[str]) -> bool:
    """ik splits this model with ``-sm graph``/``attn`` (src/llama.cpp 4225-4241: a Gemma 4 with
    per-layer embeddings, ``n_embd_per_layer > 0``, and architectures outside ``archs`` change to
    ``layer``)."""
    if model.arch not in archs:
        return False
    per_layer = model.metadata.get(f"{model.arch}.embedding_length_per_layer_input", 0)
    return not (model.arch == "gemma4" and isinstance(per_layer, int) and per_layer > 0)


def split_mode_warnings(model: Model, split_mode: str, n_gpus: int,
                        archs: frozenset[str] = GRAPH_SPLIT_ARCHS) -> list[str]:
    """What ik does with ``-sm graph``/``-sm attn``, which the planner projects as a layer split."""
    if split_mode not in ("graph", "attn") or n_gpus < 2:
        return []
    if not splits_by_graph(model, archs):
        return [f"-sm {split_mode}: ik_llama.cpp does not split {model.arch} that way and changes the "
                "split mode to 'layer' (it says so at load); projected as a layer split, as ik runs it"]
    return [f"-sm {split_mode}: ik_llama.cpp spreads each layer's tensors over the GPUs (tensor "
            "parallel); not modelled here: the per-GPU figures are those of -sm layer with the same -ts"]


def repeated_gpu(names: Sequence[str], offload: Container[str] | None = None) -> str | None:
    """The first name a ``-dev`` list gives twice (among ``offload``, the build's offload devices, when
    given), or None."""
    return next((n for i, n in enumerate(names) if n in names[:i] and (offload is None or n in offload)),
                None)


def repeated_device_refusal(flag: str, value: str, name: str) -> str:
    """Why the plan refuses a ``-dev``/``-devd`` list naming an ik GPU twice: ik adds it to
    ``model->devices`` once per mention (src/llama.cpp 7822-7826 at 8337e4cd), the context's device names
    likewise (8076-8081), the backends reordered by those names then hold the same backend object twice
    (8458-8467: ``ggml_backend_by_name`` returns the one it has) and ``~llama_context`` frees each entry
    (858-869: ``ggml_backend_free``, a double free); the layer split counts the device's free memory once
    per entry as well (4331-4365)."""
    return (f"{flag} {value} names {name} twice: ik_llama.cpp adds it to the model's devices once per "
            f"mention and its context then holds the same {name} backend twice, which it frees twice when "
            "the server frees the context (src/llama.cpp: model->devices 7822-7826, the backends reordered "
            "by name 8458-8467, ~llama_context 867-869): a double free, undefined behaviour, not planned; "
            "its layer split also counts the device's free memory once per mention")
