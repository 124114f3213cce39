"""ik_llama.cpp: its own parser (``common/common.cpp: gpt_params_find_arg``), its MLA modes and
computed tensors, one KV stream, plain CPU buffers with a per-buffer extra, no CPU_REPACK, its own
compute graph (:mod:`offload_planner.core.compute_ik`, mainline's where it has none)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from offload_planner.core.dialects.base import Dialect, register

if TYPE_CHECKING:
    from offload_planner.core.buffer import Buffer
    from offload_planner.core.cmdline.envform import ArgGroup, EnvSplit
    from offload_planner.core.cmdline.flagspec import FlagTable
    from offload_planner.core.cmdline.model import ArgError, ParsedArgs, TensorOverride
    from offload_planner.core.devices import DeviceSet
    from offload_planner.core.ggml_types import GGMLType
    from offload_planner.core.memory import ContextParams, ResolvedContext
    from offload_planner.core.model import Model
    from offload_planner.core.placement import Override, Placement, PlacementOptions

IK_COMPUTE_NOTE = ("estimate for ik_llama.cpp: mainline's graph simulated; ik builds its own (fused MoE "
                   "and up/gate ops, its MLA paths), measured on CPU it needs less; ")
#: ik_llama.cpp's cache types (``kv_cache_type_from_str``): mainline's and q6_0, q8_KV.
IK_EXTRA_KV_CACHE_TYPES = ("q6_0", "q8_KV")


class IkLlamaCpp(Dialect):
    has_cpu_repack = False
    mainline_moe_rules = False
    split_modes = ("none", "layer", "attn", "graph")
    single_kv_stream = True
    has_mla_settings = True
    detect_rank = 10
    help_markers: tuple[str, ...] = (
        r"--mla-use", r"--attention-max-batch", r"--smart-expert-reduction", r"--run-time-repack",
        r"--merge-up-gate-experts", r"--k-cache-hadamard", r"--graph-reduce-type", r"-no-fmoe")
    version_markers: tuple[str, ...] = (r"(?i)ik_llama",)
    copies_whole_experts = True
    fast_cpu_kernels = True
    rpc_bufts_by_endpoint = True
    generic_arg_errors = True
    rpc_before_ot = False
    bad_split_message = "ik_llama.cpp fails while loading the model (a layer's device index is out of range)"
    pads_transposed_v = False
    mla_k_only_cache = False
    host_overrides_turn_mmap_off = True
    #: ``-amb`` when the command has none (``gpt_params::attn_max_batch``; 256 from PR 2312, August 2026)
    default_amb: int = 0
    #: ``-md`` alone neither drafts nor loads (ikawrakow/ik_llama.cpp 8337e4cd, 2026-08-15): ``-md``
    #: only sets ``speculative.model`` (common/common.cpp 1636-1640); a stage comes only from
    #: ``--spec-type`` or ``-mtp`` (``common_speculative_finalize_stages``, 697-719; the type defaults
    #: to NONE, common/common.h 213); with no stage ``needs_dft_model()`` (common.cpp 242-246) is false
    #: and ``common_speculative_prepare_startup`` clears the draft (common/speculative.cpp 2089-2091,
    #: called by the server, examples/server/server-context.cpp 218), which drafts only with a stage
    #: chain (289, 349).  So since PR 1949 (8a3802517, 2026-06-12); from PR 1908 (007d6400, 2026-06-04)
    #: it was loaded and not drafted with; from PR 645 (2025-08-16) to then ``-md`` alone drafted;
    #: before PR 645 (the 2025 ik dialects) llama-server had no speculative decoding.  (ik's parser
    #: here does not read ``-md``/``--spec-type``: no draft is projected for ik at all.)
    draft_needs_spec_type = True
    loads_idle_draft = False

    # --- flags ---
    def flag_table(self) -> FlagTable:
        from offload_planner.core.cmdline.flags_ik import IK_FLAGS
        from offload_planner.core.cmdline.flagspec import FlagTable

        return FlagTable(IK_FLAGS)

    def moved_flags(self) -> Mapping[str, str]:
        return {
            "-lm": "--no-mmap / --mlock",
            "--load-mode": "--no-mmap / --mlock",
            "-fmoe": "nothing: fused MoE is on by default (-no-fmoe turns it off)",
            "--fused-moe": "nothing: fused MoE is on by default (-no-fmoe turns it off)",
            "-ooae": "nothing: only-active-experts offload is on by default (-no-ooae turns it off)",
            "-lv": "--verbosity N",
            "-kvo": "nothing (KV offload is the default; -nkvo turns it off)",
            "-kvu": "nothing (ik always uses one KV stream)",
            "--kv-unified": "nothing (ik always uses one KV stream)",
            "-fitt": "--fit-margin / -gfm",
            "--fit-target": "--fit-margin / -gfm",
        }

    def parse(self, args: list[str], env: dict[str, str], parsed: ParsedArgs) -> ParsedArgs:
        from offload_planner.core.cmdline.parse_ik import parse_ik

        return parse_ik(args, env, parsed)

    def effective_overrides(self, parsed: ParsedArgs,
                            moe_layers: Sequence[int] | None) -> list[TensorOverride]:
        """The user's ``-ot`` entries, then the ``--n-cpu-moe`` layers chosen from ``moe_layers``;
        with ``-ngl 0`` ik drops them all."""
        from offload_planner.core.cmdline.moe import ik_cpu_moe_overrides

        args = parsed.args
        if args.n_gpu_layers == 0:
            return []
        generated = ik_cpu_moe_overrides(args.n_cpu_moe, moe_layers) if args.n_cpu_moe and moe_layers else []
        return [*args.overrides, *generated]

    def split_env(self, groups: list[ArgGroup]) -> EnvSplit:
        from offload_planner.core.cmdline.envform import split_ik

        return split_ik(groups)

    def context_errors(self, parsed: ParsedArgs, is_mla: bool, device_names: Sequence[str]) -> list[ArgError]:
        from offload_planner.core.cmdline.semantics import ik_context_errors

        return ik_context_errors(parsed, device_names)

    def exps_regex(self) -> str:
        from offload_planner.core.cmdline.moe import IK_EXPS_BLOCK

        return IK_EXPS_BLOCK

    # --- placement ---
    def default_ngl(self, ngl: Any, has_gpu: bool) -> Any:
        return (999 if has_gpu else 0) if ngl is None else ngl

    def kept_overrides(self, ngl: Any, overrides: tuple[Override, ...]) -> tuple[Override, ...]:
        return () if ngl == 0 else overrides  # -ngl 0 drops all overrides

    def turns_mmap_off(self, args: Any) -> bool:
        # -rtr (run-time repack) turns mmap off: the repacked weights live in a plain buffer
        return bool(getattr(args, "rtr", None))

    # --- context ---
    def mla(self, model: Model, requested: int | None) -> int:
        from offload_planner.core.ik import mla_mode

        return mla_mode(model, requested)

    def amb(self, requested: int | None) -> int:
        return self.default_amb if requested is None else int(requested)

    def takes_mla(self, model: Model) -> bool:
        from offload_planner.core.ik import uses_mla

        return uses_mla(model)

    def own_kv_rows(self, model: Model) -> bool:
        return self.takes_mla(model)

    def kv_rows(self, model: Model, il: int, p: ContextParams, tk: GGMLType,
                tv: GGMLType) -> tuple[int, int, str]:
        from offload_planner.core.ik import kv_row_bytes

        return kv_row_bytes(model, il, p.mla, p.flash_attn, tk, tv)

    # --- projection ---
    def extra_buffers(self, model: Model, devices: DeviceSet, placement: Placement, p: ContextParams,
                      bufs: list[Buffer]) -> list[Buffer]:
        """ik's buffer types; plain CPU buffers (KV, output, weights without mmap) carry ik's extra;
        the MLA tensors computed at load get a buffer each."""
        from offload_planner.core.buffer import IK_CPU_BUFFER_EXTRA
        from offload_planner.core.placement import CPU

        _buffer_names(bufs, devices, mapped=False, kv=p.offload_kqv)
        for b in bufs:
            if b.name == CPU and b.kind in ("model", "kv", "output"):
                b.bytes += IK_CPU_BUFFER_EXTRA
        _buffer_names(bufs, devices, mapped=True)
        return bufs + computed_buffers(model, placement, p)

    def compute_buffers(self, model: Model, devices: DeviceSet, placement: Placement,
                        ctx: ResolvedContext, p: ContextParams) -> list[Buffer] | None:
        """ik's own graph where core.compute_ik has it, else None: mainline's (an estimate)."""
        from offload_planner.core.compute_ik import ik_compute_buffers

        return ik_compute_buffers(model, devices, placement, ctx, p)

    def annotate_compute(self, model: Model, ctx: ResolvedContext, p: ContextParams,
                         bufs: list[Buffer]) -> list[Buffer]:
        from offload_planner.core.compute_ik import IK_SIMULATED

        bufs = [replace(b, why=IK_COMPUTE_NOTE + b.why) if b.kind == "compute"
                and IK_COMPUTE_NOTE not in b.why and not b.why.startswith(IK_SIMULATED) else b for b in bufs]
        # ik's MLA logs of May 2025 match the f16 mask (issue 455: 176.01); the 2025 dialect simulates f32
        if not (self.takes_mla(model) or self.f32_kq_mask):
            _dated_mask_note(bufs, ctx, p, model.summary.has_swa)
        return bufs

    # --- warnings ---
    def model_errors(self, model: Model) -> list[str]:
        from offload_planner.core.ik import model_errors

        return model_errors(model)

    def warnings(self, model: Model, popts: PlacementOptions, devices: DeviceSet) -> list[str]:
        from offload_planner.core.ik import split_mode_warnings

        return split_mode_warnings(model, popts.split_mode, len(devices.gpus))

    # --- command emission ---
    def mla_flags(self, model: Model, p: ContextParams) -> list[str]:
        from offload_planner.core.ik import IK_DEFAULT_MLA

        out = ["-mla", str(p.mla)] if self.takes_mla(model) and p.mla != IK_DEFAULT_MLA else []
        return out + (["-amb", str(p.amb)] if p.amb != self.default_amb else [])

    def kv_cache_types(self) -> tuple[str, ...]:
        return (*super().kv_cache_types(), *IK_EXTRA_KV_CACHE_TYPES)


def _buffer_names(bufs: list[Buffer], devices: DeviceSet, *, mapped: bool, kv: bool = True) -> None:
    """ik_llama.cpp's buffer types (src/llama.cpp): the KV of layers left on the CPU and the output
    buffer take ``llama_default_buffer_type_cpu(true)``, the GPU host buffer (``CUDA_Host``) in a GPU
    build even with -ngl 0 (mainline: plain CPU; ``kv`` False for -nkvo, whose cache stays CPU); with
    ``mapped`` the mmap'd weights are renamed to ik's plain ``CPU`` buffer
    (``ggml_backend_cpu_buffer_from_ptr``: ik has no ``CPU_Mapped`` type)."""
    from offload_planner.core.placement import CPU, CPU_MAPPED

    host = next((g.host_buffer_name for g in devices.gpus if g.host_buffer_name), None)
    for b in bufs:
        if mapped and b.name == CPU_MAPPED:
            b.name = CPU
        elif not mapped and host and b.name == CPU and (b.kind == "output" or (kv and b.kind == "kv")):
            b.name = host


def _dated_mask_note(bufs: list[Buffer], ctx: ResolvedContext, p: ContextParams, swa: bool) -> None:
    """Two rules by build date for ik's host compute buffer with flash attention and standard attention: ik
    builds of 2025 (public CUDA logs of April-June 2025) held the KQ mask(s) in f32, current ik (2026 logs)
    in f16 as simulated."""
    from offload_planner.core.placement import CPU

    if not p.flash_attn:
        return
    extra = (2 if swa else 1) * ctx.n_ctx_seq * ctx.n_ubatch * 2
    for b in bufs:
        if b.kind == "compute" and b.device == CPU:
            b.why += (f"; two rules by build: ik of 2025 held the KQ mask{'s' if swa else ''} in f32, "
                      f"{extra / (1 << 20):.2f} MiB more here (its CUDA logs of April-June 2025); current ik "
                      "builds f16 masks, as simulated")


def computed_buffers(model: Model, placement: Placement, p: ContextParams) -> list[Buffer]:
    """ik_llama.cpp's MLA tensors derived at load, one buffer each on the source tensor's device."""
    from offload_planner.core.buffer import IK_CPU_BUFFER_EXTRA, Buffer
    from offload_planner.core.ik import placed_computed_tensors
    from offload_planner.core.placement import CPU

    per_dev: dict[str, int] = defaultdict(int)
    names: dict[str, list[str]] = defaultdict(list)
    for ct, dev in placed_computed_tensors(model, placement, p.mla):
        per_dev[dev] += ct.nbytes + (IK_CPU_BUFFER_EXTRA if dev == CPU else 0)
        names[dev].append(ct.name.split(".")[-2])
    return [Buffer(d, d, "model", n,
                   f"ik_llama.cpp computes {len(names[d])} {'/'.join(sorted(set(names[d])))} tensors at load "
                   f"for -mla {p.mla} (not in the file), each in its own buffer"
                   + (f" (+{IK_CPU_BUFFER_EXTRA} B each on the CPU)" if d == CPU else ""))
            for d, n in per_dev.items()]


IK = register(IkLlamaCpp("ik_llama.cpp", "ik_llama.cpp"), "IK")
