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
    from offload_planner.core.cmdline.model import ArgError, DraftArgs, ParsedArgs, ServerArgs, TensorOverride
    from offload_planner.core.devices import Device, DeviceSet
    from offload_planner.core.ggml_types import GGMLType
    from offload_planner.core.memory import ContextParams, ResolvedContext
    from offload_planner.core.model import Model
    from offload_planner.core.placement import Override, Placement, PlacementOptions
    from offload_planner.core.speculative import DraftSettings

IK_COMPUTE_NOTE = ("estimate for ik_llama.cpp: mainline's graph simulated; ik builds its own (fused MoE "
                   "and up/gate ops, its MLA paths), measured on CPU it needs less; ")
#: the stages whose draft takes the main ``-ngl`` when its own is negative (common/speculative.cpp
#: 1981-1983, ``has_dflash_family_stage``)
_DFLASH_FAMILY = frozenset({"dflash", "dspark"})
#: ik_llama.cpp's cache types (``kv_cache_type_from_str``): mainline's and q6_0, q8_KV.
IK_EXTRA_KV_CACHE_TYPES = ("q6_0", "q8_KV")


class IkLlamaCpp(Dialect):
    #: ik's old backend API: one Metal backend registered as ``Metal`` (ggml/src/ggml-backend.cpp:497),
    #: its buffer type ``Metal`` (ggml-metal.m ``ggml_backend_metal_buffer_type_get_name``), which is also
    #: the device's ``-dev`` name (src/llama.cpp ``llama_load_model_from_file``: devices are the offload
    #: buffer types' names); a mmap'd Metal buffer is logged ``Metal`` too
    #: (``ggml_backend_metal_buffer_get_name``)
    metal_device = "Metal"
    has_cpu_repack = False
    mainline_moe_rules = False
    split_modes = ("none", "layer", "attn", "graph")
    single_kv_stream = True
    recurrent_state_in_kv = True  # cache_s_l in the layer's KV context (src/llama.cpp llama_kv_cache_init)
    has_mla_settings = True
    detect_rank = 10
    batch_floor = 16  # GGML_KQ_MASK_PAD (src/llama.cpp llama_init_from_model)

    def dev_name(self, device: Device) -> str:
        """ik names an RPC device in ``-dev`` by its buffer type, ``RPC<d>[host:port]`` (``d``: the
        device's number on its server; src/llama.cpp ``create_rpc_name`` and 7790-7823 at 8337e4cd:
        ``-dev`` names are looked up among the buffer types' names, from PR 1024 of 2025-11-30); a
        mainline ``RPC1`` is "backend not available" there and skipped."""
        from offload_planner.core.devices import DeviceKind

        if device.kind is DeviceKind.RPC and device.endpoint:
            return device.buffer_type
        return super().dev_name(device)

    #: ``-dev``/``-devd`` names are not checked while parsing (common/common.cpp 573-578
    #: ``parse_device_list`` refuses only a blank or a ``-``) but looked up when the model loads
    #: (:meth:`skipped_devices_note`)
    skips_unknown_devices = True
    refuses_repeated_devices = True

    def skipped_devices_note(self, skipped: Sequence[str], *, any_left: bool, draft: bool) -> str:
        """ik looks each ``-dev`` name up among its devices' buffer-type names, exactly as written, and
        logs and skips one it has not (src/llama.cpp 7821-7828 at 8337e4cd, ``LLAMA_LOG_ERROR("%s backend
        not available.\n")``); with none left it loads the model on the CPU (7831-7833: ``n_gpu_layers =
        0``, "CPU: using device CPU").  ``-devd`` names go through the same loader for the draft
        (common/speculative.cpp 1950: ``params_dft.devices``)."""
        logged = ", ".join(f'"{n} backend not available."' for n in skipped)
        it = "it" if len(skipped) == 1 else "them"
        what = "the draft model" if draft else "the model"
        left = "" if any_left else (f"; no device is left, so {what} loads on the CPU only "
                                    "(n_gpu_layers = 0: \"CPU: using device CPU\")")
        return (f"ik_llama.cpp logs {logged} and skips {it} (it looks -dev names up exactly as written "
                f"among its devices when it loads {what}){left}")

    @property
    def graph_split_archs(self) -> frozenset[str]:
        """The architectures ``-sm graph``/``attn`` splits (``is_model_split_supported``)."""
        from offload_planner.core.ik import GRAPH_SPLIT_ARCHS

        return GRAPH_SPLIT_ARCHS
    help_markers: tuple[str, ...] = (
        r"--mla-use", r"--attention-max-batch", r"--smart-expert-reduction", r"--run-time-repack",
        r"--merge-up-gate-experts", r"--k-cache-hadamard", r"--graph-reduce-type", r"-no-fmoe")
    version_markers: tuple[str, ...] = (r"(?i)ik_llama",)
    copies_whole_experts = True
    fast_cpu_kernels = True
    #: ik_llama.cpp issues 263 and 1051: -ub 4096 and 2048 ran faster per FLOP than -ub 512
    #: (core.speed.efficiency.GPU_ROWS_MAX_GAIN)
    cuda_gains_past_512_rows = True
    rpc_bufts_by_endpoint = True
    rpc_dev_by_buffer_type = True
    generic_arg_errors = True
    rpc_before_ot = False
    bad_split_message = "ik_llama.cpp fails while loading the model (a layer's device index is out of range)"
    pads_transposed_v = False
    mla_k_only_cache = False
    dsa_indexer_cache = False  # ik's own indexer cache: core.dsa.ik_indexer_kv (extra_buffers)
    host_overrides_turn_mmap_off = True
    kv_override_csv = False  # common.cpp: one string_parse_kv_override a flag
    #: ``-ser`` drops experts: from PR 840 (2025-10-19, "Various fused ops around expert selection")
    #: ``llm_build_moe_ffn`` calls ``ggml_top_k`` and its ``ggml_top_k_thresh`` call is commented out
    #: (src/llama-build-context.cpp), so ``min_experts``/``thresh_experts`` reach no op
    applies_ser = False
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
    #: before PR 645 (the 2025 ik dialects) llama-server had no speculative decoding.
    draft_needs_spec_type = True
    loads_idle_draft = False
    #: ``needs_dft_model`` (common.cpp 242-246): ``draft``, ``dflash``, ``dspark`` (and ``mtp`` with ``-md``:
    #: an MTP companion file, whose context is not modelled, see :attr:`mtp_spec_type`)
    draft_model_types = frozenset({"draft", "dflash", "dspark"})
    draft_inherits_main_args = True
    # ik's server builds the draft's context from the target's command line (common/speculative.cpp:1946
    # ``params_dft = params_base``); -td/-tbd set ``speculative.n_threads*``, read by llama-imatrix alone
    applies_draft_threads = False
    #: no ``-otd``: the draft takes the main ``-ot`` list, and ``-draft "-ot ..."`` entries land after its
    #: terminator (common.cpp 771-773), which the loader never reads past
    moves_draft_tensors = False
    #: ik's ``mtp`` stage: the main model loaded with its NextN layers (``mparams.mtp``, common.cpp 4287)
    #: and an MTP context on it (:meth:`mtp_buffers`); on a ``-md`` companion it is not projected
    #: (:meth:`spec_notes`)
    mtp_spec_type = "mtp"

    # --- flags ---

    def rpc_entry_reaction(self, problem: str, mainline: str) -> str:
        """ik's ggml-rpc (``ggml/src/ggml-rpc.cpp`` 452-460): ``std::stoi`` of the port unchecked (a
        non-number throws "stoi" out of the argument parser), the same ``htons``; an entry it cannot
        parse or reach gives no device (``add_rpc_devices``: ``ggml_backend_rpc_get_device_count`` is
        0) instead of aborting the server as mainline does."""
        if problem.startswith("port '"):
            return "ik_llama.cpp stops: stoi"
        if mainline.startswith("llama-server would connect"):
            return mainline.replace("llama-server", "ik_llama.cpp", 1)
        return "ik_llama.cpp gets no RPC device from it"
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

    def context_errors(self, parsed: ParsedArgs, is_mla: bool, device_names: Sequence[str],
                       arch: str | None = None) -> list[ArgError]:
        from offload_planner.core.cmdline.semantics import ik_context_errors

        return ik_context_errors(parsed, device_names, splits=arch is None or arch in self.graph_split_archs)

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
        bufs = _with_indexer_cache(model, devices, placement, p, bufs)
        return _ik_buffers(model, devices, placement, p, bufs) + computed_buffers(model, placement, p)

    def mtp_cache_types(self, main: ContextParams, type_k: str, type_v: str) -> tuple[str, str]:
        """The main -ctk/-ctv: ik's MTP context is a copy of the main parameters (common/speculative.cpp
        ``common_speculative_prepare_mtp_runtime``), -ctkd/-ctvd are the draft model's only."""
        return main.type_k, main.type_v

    def main_kv_layers(self, model: Model, placement: Placement) -> range | None:
        """A model loaded with its NextN layers (``model.mtp``) gets them in every context's cache
        (ik 55d3c05 src/llama.cpp 737-738 ``n_layer = model.mtp ? hparams.n_layer : ...``)."""
        from offload_planner.core.compute_ik import loads_nextn

        return range(model.summary.n_layer) if loads_nextn(model, placement) else None

    def mtp_buffers(self, model: Model, devices: DeviceSet, placement: Placement, main: ContextParams,
                    ctx: ResolvedContext, type_k: str, type_v: str) -> list[Buffer] | None:
        """ik's MTP context (common/speculative.cpp ``common_speculative_prepare_mtp_runtime``): the
        main context's parameters (its -c, -b, -ub, -fa, -ctk/-ctv: not -ctkd) with ``mtp``,
        ``MTP_OP_WARMUP`` and embeddings on; its cache holds the NextN layers only (src/llama.cpp
        853-856: the layers before them are skipped with an MTP op), its outputs logits and
        embeddings (3625-3630), its graph ik's MTP graph (:func:`compute_ik.ik_mtp_compute_buffers`)."""
        from offload_planner.core.compute_ik import ik_mtp_compute_buffers
        from offload_planner.core.memory import kv_buffers, output_buffer

        s = model.summary
        bufs = kv_buffers(model, placement, ctx, main, devices, cached=range(s.n_layer_trunk, s.n_layer))
        bufs.append(output_buffer(model, placement, main, devices))
        bufs = _ik_buffers(model, devices, placement, main, bufs)
        return bufs + (ik_mtp_compute_buffers(model, devices, placement, ctx, main) or [])

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
        from offload_planner.core.compute_ik import IK_MTP_GRAPHS
        from offload_planner.core.ik import repeated_device_refusal, repeated_gpu, split_mode_warnings
        from offload_planner.core.placement import selected_gpus

        out = split_mode_warnings(model, popts.split_mode, len(selected_gpus(devices, popts)),  # -dev's GPUs
                                  self.graph_split_archs)
        twice = repeated_gpu(popts.selected or ())
        if twice is not None:  # a plan switched to ik (a command line naming it twice is refused)
            out.append(repeated_device_refusal("-dev", ",".join(popts.selected or ()), twice))
        if model.arch == "glm-dsa":
            out.append("glm-dsa on ik_llama.cpp: its MLA cache and indexer key cache are projected from ik's "
                       "source (8337e4cd), not measured (no ik server here); the indexer cache is taken f16 "
                       "(-ictk is not read), -sm graph's per-device cache replicas are not modelled, and the "
                       "compute buffers are mainline's DSA graph (ik runs dense MLA unless --dsa)")
        if popts.load_mtp and model.summary.n_nextn and model.arch not in IK_MTP_GRAPHS:
            out.append(f"--spec-type mtp: ik_llama.cpp's MTP graph for {model.arch} is not simulated "
                       "(checked against ik's library for GLM-4.x MoE only): the MTP context's compute "
                       "buffer is missing from these figures"
                       + ("; at 8337e4cd ik builds the deepseek2 MTP tail for GLM_DSA files only and aborts "
                          "otherwise (src/graphs/build_deepseek2.cpp 1305-1307)" if model.arch == "deepseek2"
                          else ""))
        return out

    # --- command emission ---
    def mla_flags(self, model: Model, p: ContextParams) -> list[str]:
        from offload_planner.core.ik import IK_DEFAULT_MLA

        out = ["-mla", str(p.mla)] if self.takes_mla(model) and p.mla != IK_DEFAULT_MLA else []
        return out + (["-amb", str(p.amb)] if p.amb != self.default_amb else [])

    def kv_cache_types(self) -> tuple[str, ...]:
        return (*super().kv_cache_types(), *IK_EXTRA_KV_CACHE_TYPES)

    # --- speculative decoding: common_speculative_load_draft_model (common/speculative.cpp 1939-1999) ---
    def spec_notes(self, types: Sequence[str], draft_model: str | None) -> list[str]:
        out = []
        if "mtp" in types and draft_model:
            out.append(f"--spec-type mtp: ik_llama.cpp's MTP context on the -md companion {draft_model} "
                       "is not projected: its KV, output and compute buffers are missing from these "
                       "figures, and so are the companion's weights")
        # Not a plain draft (ik 8337e4cd): common/speculative.cpp 1311-1340 shares the target's IO tensors
        # with a dflash-arch draft (src/llama-spec-features-dflash.cpp 227 ff.: token_embd/output taken
        # from the target when the file has none, cloned into the draft's buffer types when they live
        # elsewhere) and sets the draft context's n_ctx to max(cross_ctx) (--spec-type dflash:cross_ctx=N,
        # default 512: common/common.h 227) + the file's dflash.block_size; at its first draft
        # src/llama-dflash.cpp 60-159 allocates a K and a V cross cache per layer (n_embd_head x
        # pad(cross_ctx + max(block_size, n_ubatch)) x n_head_kv, f16 with -fa else f32, one buffer each
        # on the layer's buffer type) and 487-521 a second scheduler for the cache update graph.  Only
        # the -ngl the draft takes (1981-1983) is modelled (draft_server_args).
        for kind in ("dflash", "dspark"):
            if kind in types and draft_model:
                out.append(f"--spec-type {kind}: the draft context is projected as a plain draft's, which it "
                           "is not: ik sizes it to cross_ctx (512 unless given) + the draft's block size, "
                           "shares or clones the target's token embedding and output, and at the first draft "
                           "allocates a K and a V cross-attention cache per draft layer and a scheduler for "
                           "their update graph (not modelled)")
        return out

    def draft_kept_args(self, kept: list[str], draft: DraftSettings | None) -> list[str]:
        """A draft with its own context (``-cd``, or its trained length, both only without a main ``-c``)
        gets it as ``-draft "-c N"``: the exported command pins the main ``-c``, which the draft would
        take instead (common/speculative.cpp 1978-1985); appended to a ``-draft`` already given (its
        last ``-c`` wins)."""
        if draft is None or draft.n_ctx is None:
            return kept
        text = f"-c {draft.n_ctx or draft.model.summary.n_ctx_train}"
        out = list(kept)
        at = next((i for i in range(len(out) - 1, -1, -1) if out[i] in ("-draft", "--draft-params")), None)
        if at is None or at + 1 >= len(out):
            return [*out, "-draft", text]
        out[at + 1] = f"{out[at + 1]} {text}"
        return out

    def _drafting_stage(self, draft: DraftArgs) -> str:
        """The stage that drafts with a model: a draft-model stage, else the ``mtp`` stage (a chain
        holds at most one of them: :func:`chain_errors`), else ``draft``; its overrides apply
        (``common_speculative_get_runtime_params``)."""
        return next((t for t in draft.types if t in self.draft_model_types or t == self.mtp_spec_type),
                    "draft")

    def draft_n_max(self, draft: DraftArgs) -> int:
        """The drafting stage's ``n_max`` (``--spec-type draft:n_max=N``, ``mtp:n_max=N``), else 16
        (common.h 223)."""
        from offload_planner.core.cmdline.handlers_ik_spec import stage_n_max

        return stage_n_max(draft, self._drafting_stage(draft))

    def draft_stop(self, draft: DraftArgs) -> tuple[float, str, bool]:
        """The drafting stage's ``p_min`` (``--spec-type draft:p_min=P``), else 0.75 (common.h 230):
        ``common_speculative_get_runtime_params``; a draft stops below it (speculative.cpp 602)."""
        from offload_planner.core.cmdline.handlers_ik_spec import IK_DEFAULT_N_MAX, IK_DEFAULT_P_MIN

        kind = self._drafting_stage(draft)
        given = draft.stage_p_min.get(kind)
        if given is not None:
            return given, f"--spec-type {kind}:p_min={given:g}", True
        n_given = any(k == kind and n >= 0 for k, n, _ in draft.stages)
        what = (f"ik_llama.cpp's default p_min {IK_DEFAULT_P_MIN:g}" if n_given else
                f"ik_llama.cpp's defaults n_max {IK_DEFAULT_N_MAX} and p_min {IK_DEFAULT_P_MIN:g}")
        return IK_DEFAULT_P_MIN, what + " (common/common.h)", False

    def draft_server_args(self, args: ServerArgs, draft: DraftArgs, pinned_to_one_gpu: bool) -> ServerArgs:
        """``params_dft = params_base`` (1946): the main command line, ``-ot`` and ``--n-cpu-moe`` and
        ``-sm`` included, with ``-devd`` else the main ``-dev`` (1950), ``-ngld`` (1952; -1 or absent:
        the library default, every layer with a GPU), one sequence (1985), then the ``-draft "ARGS"``
        command line parsed onto it (1957-1966: its ``-dev`` and ``-ngl`` win); a ``dflash``/``dspark``
        stage's draft with a negative ``-ngl`` then takes the main ``-ngl`` (1981-1983)."""
        import copy

        out = copy.deepcopy(args)
        out.n_gpu_layers = draft.n_gpu_layers if draft.n_gpu_layers not in (None, -1) else None
        out.cache_type_k = draft.cache_type_k or args.cache_type_k
        out.cache_type_v = draft.cache_type_v or args.cache_type_v
        out.devices = draft.devices or args.devices  # common/speculative.cpp 1950
        if draft.params:
            out = _parsed_onto(out, draft.params, self)
        if _DFLASH_FAMILY.intersection(draft.types) and (out.n_gpu_layers is None or out.n_gpu_layers < 0):
            out.n_gpu_layers = args.n_gpu_layers
        out.n_parallel = 1
        return out

    def draft_refusals(self, draft: DraftSettings) -> list[str]:
        """``-sm graph``/``attn`` on fewer than two model devices: ik's loader throws (src/llama.cpp
        4369-4372) for an architecture it splits that way (4225-4241: others change to ``layer``).  The
        draft inherits ``-sm`` (``params_dft = params_base``, common/speculative.cpp 1946; ``-draft
        "-sm ..."`` may change it) and loads on ``-devd``'s devices, else ``-dev``'s (1950), so a draft
        pinned to one GPU fails to load and the server stops (``common_speculative_finalize_startup``
        returns false, 2121-2123)."""
        from offload_planner.core.ik import splits_by_graph
        from offload_planner.core.placement import selected_gpus

        popts = draft.placement_options
        splits = splits_by_graph(draft.model, self.graph_split_archs)
        if popts.split_mode not in ("graph", "attn") or not splits:
            return []
        n = len(selected_gpus(draft.devices, popts))
        if n >= 2:
            return []
        name = draft.model.path.rsplit("/", 1)[-1]
        return [f"ik_llama.cpp stops loading the draft model {name}: \"It is not possible to use split mode "
                f"'graph' with less than 2 devices\" (it inherits -sm {popts.split_mode} and loads on "
                f"{n} GPU{'' if n == 1 else 's'}: -devd, else -dev); give the draft -draft \"-sm layer\" "
                "or a second device"]

    def draft_cache_types(self, args: ServerArgs, draft: DraftArgs) -> tuple[str, str]:
        """``-ctkd``/``-ctvd``, else the main ``-ctk``/``-ctv`` (1952-1953; ``args``: the draft's)."""
        return args.cache_type_k or "f16", args.cache_type_v or "f16"

    def draft_n_ctx(self, args: ServerArgs, draft_args: ServerArgs, draft: DraftArgs) -> int | None:
        """None (the main ``-c`` as given: :meth:`draft_context_params` follows the plan's) when the main
        ``-c`` is not 0 and no ``-draft "-c N"`` changed it, else that ``-c``, else ``-cd``, else 0: the
        draft's trained length (1978-1985: ``params_dft`` starts as a copy of the main parameters, so
        ``-cd`` counts only without ``-c``; the main context's padded cells are never used)."""
        if draft_args.ctx_size and draft_args.ctx_size == args.ctx_size:
            return None
        return (draft_args.ctx_size or 0) or (draft.ctx_size or 0)

    def draft_context_params(self, main: ContextParams, main_cells: int,
                             draft: DraftSettings) -> ContextParams:
        """The main context's parameters (``common_context_params_to_llama(params_dft)``) with the draft's
        size, cache types and one sequence."""
        from dataclasses import replace

        n_ctx = main.n_ctx if draft.n_ctx is None else draft.n_ctx  # the main -c as requested, not padded
        p = replace(main, n_ctx=n_ctx, type_k=draft.type_k, type_v=draft.type_v, n_seq_max=1,
                    n_outputs_max=None if main.n_outputs_max is None else 1)
        own = draft.settings  # -draft "ARGS": its -b/-ub/-fa
        if own is None:
            return p
        fa = own.flash_attn != "off" if own.flash_attn is not None else p.flash_attn
        # as the main context's (engine.context_params): -b 0 raised to the KQ mask padding (src/llama.cpp
        # 8169-8171), -ub 0 resolved to n_batch (8174); negative sizes are refused (ik_draft_params)
        n_batch = p.n_batch if own.batch_size is None else max(own.batch_size, self.batch_floor)
        n_ubatch = p.n_ubatch if own.ubatch_size is None else own.ubatch_size
        return replace(p, n_batch=n_batch, n_ubatch=n_ubatch, flash_attn=fa)


def _parsed_onto(args: ServerArgs, text: str, dialect: Dialect) -> ServerArgs:
    """``-draft "ARGS"``: ``gpt_params_parse("llama-server " + ARGS)`` onto the draft's parameters."""
    from offload_planner.core.cmdline.ik_draft_params import parse_onto

    kept = len(args.overrides)
    out = parse_onto(args, dialect, text).args
    if kept:  # appended after the main list's terminator (common.cpp 771-773): the loader never reads them
        out.overrides = out.overrides[:kept]
    return out


def _with_indexer_cache(model: Model, devices: DeviceSet, placement: Placement, p: ContextParams,
                        bufs: list[Buffer]) -> list[Buffer]:
    """glm-dsa: the indexer key cache ik allocates beside the MLA cache, in each device's KV buffer."""
    from offload_planner.core.dsa import IK_INDEXER_TYPE, ik_indexer_kv
    from offload_planner.core.memory import resolve_context

    if not p.mla:  # allocated in the MLA branch of llama_kv_cache_init only (src/llama.cpp 1420-1436)
        return bufs
    s = model.summary
    per_dev = ik_indexer_kv(model, placement, resolve_context(p, s.n_ctx_train, s.n_swa).n_ctx,
                            p.offload_kqv, devices)
    for b in bufs:
        n = per_dev.pop(b.device, 0) if b.kind == "kv" and not b.owner else 0
        if n:
            b.bytes += n
            b.why += (f"; + the DSA indexer's keys ({n / 2**20:.2f} MiB, {IK_INDEXER_TYPE}: -ictk is not "
                      "read; ik's full-indexer layers 0, 1 and every 4th from 2)")
    return bufs


def _ik_buffers(model: Model, devices: DeviceSet, placement: Placement, p: ContextParams,
                bufs: list[Buffer]) -> list[Buffer]:
    """ik's buffer types; plain CPU buffers (KV, output, weights without mmap) carry ik's extra; a
    model loaded with its NextN layers (``cparams.mtp``) has embeddings beside the logits."""
    from offload_planner.core.buffer import IK_CPU_BUFFER_EXTRA
    from offload_planner.core.compute_ik import loads_nextn
    from offload_planner.core.placement import CPU

    _buffer_names(bufs, devices, mapped=False, kv=p.offload_kqv)
    embd = 4 * model.summary.n_embd * p.n_seq_max if loads_nextn(model, placement) else 0
    for b in bufs:
        if b.kind == "output" and embd:  # llama.cpp 3625-3630 (ik 55d3c05): logits and embeddings
            b.bytes += embd
            b.why += f" + embeddings ({model.summary.n_embd} x 4 B each: the MTP stage's hidden state)"
        if b.name == CPU and b.kind in ("model", "kv", "output"):
            b.bytes += IK_CPU_BUFFER_EXTRA
    _buffer_names(bufs, devices, mapped=True)
    return bufs


def _buffer_names(bufs: list[Buffer], devices: DeviceSet, *, mapped: bool, kv: bool = True) -> None:
    """ik_llama.cpp's buffer types (src/llama.cpp): the KV of layers left on the CPU and the output
    buffer take ``llama_default_buffer_type_cpu(true)``, the GPU host buffer (``CUDA_Host``) in a GPU
    build even with -ngl 0 (mainline: plain CPU; ``kv`` False for -nkvo, whose cache stays CPU); with
    ``mapped`` the mmap'd weights are renamed to their device's plain buffer, as ik names them: ``CPU``
    (``ggml_backend_cpu_buffer_from_ptr``: ik has no ``CPU_Mapped`` type) and Metal's (src/llama.cpp
    4758-4770 at 8337e4cd: ``ggml_backend_metal_buffer_from_ptr`` of the same file span, a buffer of the
    one Metal buffer type, logged ``Metal``: ggml-metal.m 4164, 4423)."""
    from offload_planner.core.devices import is_mapped_buffer
    from offload_planner.core.placement import CPU

    host = next((g.host_buffer_name for g in devices.gpus if g.host_buffer_name), None)
    for b in bufs:
        if mapped and is_mapped_buffer(b.name):
            b.name = b.device
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
