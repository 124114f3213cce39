"""ik_llama.cpp as built before July 2025: the public CUDA logs of April-June 2025.

What differs from the current source (``ikawrakow/ik_llama.cpp``, read at each date):

- ``-ot ...=CPU`` (and ``exps=CPU``) takes the plain CPU buffer type: the overridden weights are logged
  as ``CPU`` and the token embedding alone as ``CUDA_Host`` (``src/llama.cpp`` ``create_tensor`` used
  the override's buffer type as given until PR 1508, 2026-03-25, mapped host overrides to
  ``llama_default_buffer_type_cpu(true)``), and such a weight kept mmap on (PR 1510, 2026-03-26, turned
  it off for the whole model);
- no ``-ngl`` means no layer offloaded (``llama_model_default_params``: 0 until PR 2209, 2026-07-30);
- llama-server gives the context one sequence more than ``--parallel`` (``server.cpp`` ``load_model``:
  "dedicate one sequence to the system prompt", still there in October 2025): logits for np + 1
  sequences (the tools, ``llama-sweep-bench`` or ``llama-imatrix``, have no extra one);
- the KQ mask is an f32 input, cast to f16 where flash attention reads it, its rows padded to 32
  (``build_inp_KQ_mask`` until PR 825, 2025-10-13; ``GGML_KQ_MASK_PAD`` 32 until PR 574, 2025-07-03).

- the ``-mla 2/3`` flash-attention prompt path expands no head group's output inside its loop
  (``build_deepseek2``; ``ggml_build_forward_expand(gf, cur)`` came with b85a2a50d, 2026-01-31): the
  groups' attention outputs and their concatenation are reached from the layer's end, after every group's
  K and V (the May-2025 DeepSeek-V3 log of issue 450: 3650.00 MiB logged, 3648.25 this way, 4252.00 with
  the current order).

Everything else (the parser, MLA, the op-offload rule of PR 520) is the current ik dialect's; builds
before PR 520 (2025-06-12) offloaded MoE ops from 32 tokens whatever the expert count (with ``-rtr``, as
in the May-2025 logs replayed here, nothing is offloaded either way: :mod:`core.ik_repack`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from offload_planner.core.dialects.base import register
from offload_planner.core.dialects.ik import IkLlamaCpp

if TYPE_CHECKING:
    from offload_planner.core.buffer import Buffer
    from offload_planner.core.cmdline.flagspec import FlagTable
    from offload_planner.core.devices import DeviceSet
    from offload_planner.core.memory import ContextParams
    from offload_planner.core.model import Model
    from offload_planner.core.placement import Placement


class Ik2025(IkLlamaCpp):
    plain_cpu_overrides = True
    host_overrides_turn_mmap_off = False  # from PR 1510 (2026-03-26)
    applies_ser = True  # -ser (PR 239) selects experts with ggml_top_k_thresh until PR 840
    f32_kq_mask = True
    batch_floor = 32  # GGML_KQ_MASK_PAD before July 2025
    mla_fa_steps_expanded = False  # from b85a2a50d (2026-01-31)
    #: llama-server had no speculative decoding before PR 645 (2025-08-16): ``-md`` never drafts
    draft_model_types: frozenset[str] = frozenset()
    spec_stages = False
    detect_rank = 90  # never recognised from a server's output: picked by name
    help_markers: tuple[str, ...] = ()
    version_markers: tuple[str, ...] = ()

    def model_errors(self, model: Model) -> list[str]:
        """The current ik's, and the architectures these builds did not have yet: glm-dsa came with
        GLM-5 support (ik_llama.cpp PR 1268, 2026-02-15)."""
        if model.arch == "glm-dsa":
            return [f"{model.path}: ik_llama.cpp builds of 2025 cannot load it: \"unknown model "
                    f"architecture: '{model.arch}'\" (glm-dsa came with ik_llama.cpp PR 1268, 2026-02-15)"]
        return super().model_errors(model)

    def flag_table(self) -> FlagTable:
        """The current ik table without the speculative flags these builds did not have."""
        from offload_planner.core.cmdline.flags_ik import IK_2025_FLAGS
        from offload_planner.core.cmdline.flagspec import FlagTable

        return FlagTable(IK_2025_FLAGS)

    def moved_flags(self) -> Mapping[str, str]:
        from offload_planner.core.cmdline.flags_ik import IK_2025_ABSENT_SPEC

        why = "nothing: ik_llama.cpp's server had no speculative decoding before PR 645 (August 2025)"
        return {**super().moved_flags(), **dict.fromkeys(sorted(IK_2025_ABSENT_SPEC), why)}

    def default_ngl(self, ngl: Any, has_gpu: bool) -> Any:
        return 0 if ngl is None else ngl

    def extra_buffers(self, model: Model, devices: DeviceSet, placement: Placement, p: ContextParams,
                      bufs: list[Buffer]) -> list[Buffer]:
        """The server's logits for one sequence more (a server context: ``n_outputs_max`` set)."""
        if p.n_outputs_max is not None:
            row = 4 * model.summary.n_vocab
            for b in bufs:
                if b.kind == "output":
                    b.bytes += row
                    b.why += (f"; + {row / (1 << 20):.2f} MiB: the 2025 ik server gives the context one "
                              "sequence more than -np (server.cpp: 'dedicate one sequence to the system "
                              "prompt')")
        return super().extra_buffers(model, devices, placement, p, bufs)


IK_2025 = register(Ik2025("ik_llama.cpp-2025", "ik_llama.cpp (builds before July 2025)"), "IK_2025")
