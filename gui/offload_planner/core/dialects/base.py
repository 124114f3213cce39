"""What a backend dialect is: its name (as plan files and ``--dialect`` spell it) and its behaviour.

A :class:`Dialect` *is* its name (a ``str`` subclass: it compares, hashes and serialises as the
name) and carries everything that differs between llama-server builds, so the rest of the planner
asks it instead of testing names.  The defaults here are mainline llama.cpp's; each dialect module
overrides what its build does differently and registers one instance.

This module imports nothing of the planner at module level but the constants of
:mod:`~offload_planner.core.spec_defaults` (a module that imports nothing): the memory model and the
command-line parser receive dialect objects, and the heavy parts of a dialect (ik's compute simulator)
are imported by the dialect module's methods.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from offload_planner.core.spec_defaults import DEFAULT_DRAFT_N_MAX

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

_REGISTRY: dict[str, Dialect] = {}


class _DialectType(type):
    """``for d in Dialect`` lists the registered dialects, in registration order (as the enum did)."""

    def __iter__(cls) -> Iterator[Dialect]:
        return iter(list(_REGISTRY.values()))

    def __len__(cls) -> int:
        return len(_REGISTRY)


class Dialect(str, metaclass=_DialectType):
    """One llama-server build family.  ``Dialect("ik_llama.cpp")`` returns the registered object
    (``ValueError`` for an unknown name); subclasses construct new ones."""

    # The built-in dialects, set by their modules when they register (core.dialects imports them).
    LLAMA_CPP: ClassVar[Dialect]
    LLAMA_CPP_2025: ClassVar[Dialect]
    IK: ClassVar[Dialect]
    IK_2025: ClassVar[Dialect]
    LLAMA_CPP_2025_EARLY: ClassVar[Dialect]
    IK_AMB256: ClassVar[Dialect]
    IK_2025_05: ClassVar[Dialect]

    label: str = ""

    # --- reading and checking a command line ---
    #: ``-ngl auto`` / ``-ngl all``
    ngl_keywords: bool = False
    #: split modes ``-sm`` accepts
    split_modes: tuple[str, ...] = ("none", "layer", "row")
    #: -fa takes no value in some builds of this family (a bare -fa before September 2025)
    bare_flash_attn: bool = False
    #: takes ik's -mla / -amb settings
    has_mla_settings: bool = False
    #: -ot may name RPC buffers as ``RPC[host:port]`` (ik's help shows it; not verified on a build)
    rpc_bufts_by_endpoint: bool = False
    #: ``-dev`` names an RPC device by its buffer type, ``RPC<d>[host:port]`` (:meth:`dev_name`), not
    #: ``RPC<i>`` numbered over the servers
    rpc_dev_by_buffer_type: bool = False
    #: ``-dev``/``-devd``/``-mmdev`` match device names ignoring case (``ggml_backend_dev_by_name``
    #: compares with ``striequals``), so ``cuda0`` is ``CUDA0``; else the name must match exactly
    device_names_ignore_case: bool = False
    #: a ``-dev``/``-devd`` name the build has no device of is skipped when the model loads
    #: (:meth:`skipped_devices_note`), not refused while parsing as the pinned build's
    #: ``parse_device_list`` does ("invalid device: NAME", common/arg.cpp 1133-1135)
    skips_unknown_devices: bool = False
    #: a GPU named twice in ``-dev``/``-devd`` is refused (ik_llama.cpp would free its backend twice:
    #: :func:`~offload_planner.core.ik.repeated_device_refusal`); else it is two model devices
    refuses_repeated_devices: bool = False
    #: a refused value is reported as "invalid parameter for argument" (no buffer type / device named)
    generic_arg_errors: bool = False
    #: an -ot naming an RPC device must come after --rpc
    rpc_before_ot: bool = True
    #: CUDA devices refuse -sm row ("does not support split buffers")
    refuses_cuda_row_split: bool = False
    #: how a NaN or infinite -ts proportion fails (None: mainline's vector range check)
    bad_split_message: str | None = None

    # --- placement ---
    #: the output layer is offloaded first (-ngl N puts the output on the GPU for N >= 1)
    output_first: bool = False
    #: the CPU backend has CPU_REPACK buffers (and the ``-nr`` flag turns them off)
    has_cpu_repack: bool = True
    #: ``-ot ...=CPU`` takes the plain CPU buffer type, not the GPU's host buffer (mainline before b6050,
    #: ik_llama.cpp before PR 1508 of March 2026): with a GPU the token embedding alone is ``CUDA_Host``
    plain_cpu_overrides: bool = False
    #: ``--override-kv`` splits its value at commas (``parse_csv_row``: mainline from PR 18056 of December
    #: 2025); older mainline builds and ik_llama.cpp read one ``KEY=TYPE:VALUE`` a flag
    kv_override_csv: bool = True
    #: ik's KQ mask is an f32 input cast to f16 for flash attention, rows padded to 32 (ik before PR 825
    #: of October 2025; later ik builds it in f16, padded to 16)
    f32_kq_mask: bool = False
    #: ``llama_context`` raises an ``n_batch`` below ``GGML_KQ_MASK_PAD`` to it ("n_batch is less than
    #: GGML_KQ_MASK_PAD - increasing to N"): 2025 mainline 64, ik 16 (32 before July 2025); 0: no
    #: raise (the pinned build: ``-b 0`` makes ``n_ubatch`` 0 and the server aborts)
    batch_floor: int = 0
    #: ``LLAMA_MAX_SEQ``: a context of more sequences (``-np``) is refused ("n_seq_max must be <= 256",
    #: src/llama-context.cpp of the pinned build); 0: not checked (ik: one KV stream, no such limit)
    max_seq: int = 0
    #: ik's -mla 2/3 flash-attention prompt path adds each head group's output to the graph as it is made
    #: (``ggml_build_forward_expand(gf, cur)`` in the loop, commit b85a2a50d of 2026-01-31 "Reduce compute
    #: buffer size for mla=3"); before, the outputs and their concatenation came at the layer's end
    mla_fa_steps_expanded: bool = True
    #: ik's CUDA backend multiplies the ``IQ*_K_R4`` family (``core.ik_repack.CUDA_R4_TYPES``; PRs 461/462 of
    #: 2025-05-26/27 and later); before, no row-interleaved type: such host weights' ops stay on the CPU
    cuda_multiplies_r4: bool = True
    #: K/V stored with ``ggml_cpy`` into cache views, no index inputs (mainline before set_rows, August 2025)
    copies_kv_into_views: bool = False
    #: a weight placed by ``-ot ...=CPU`` / ``--cpu-moe`` turns mmap off for the whole model (ik_llama.cpp
    #: from PR 1510, 2026-03-26: ``use_mmap_buffer &= !has_buft_overrides``, pinned host buffers instead)
    host_overrides_turn_mmap_off: bool = False
    #: ``--cpu-moe``/``--n-cpu-moe N`` expand to mainline's ``-ot`` entries at their position
    mainline_moe_rules: bool = True

    # --- device names ---
    #: The name this build gives Metal device ``{i}`` in ``-dev`` and as the ``-ot`` buffer type (the
    #: device's default buffer type: shared on Apple silicon).  The planner's own names are the pinned
    #: build's, ``MTL<i>`` (ggml/src/ggml-metal/ggml-metal-device.m:1301, ``"%s%d", "MTL", device``;
    #: ggml-metal.cpp:307 the buffer type ``GGML_METAL_NAME + std::to_string(i)``), from llama.cpp
    #: PR 18919 ("metal : support virtual devices", January 2026); earlier builds have one device,
    #: ``Metal`` (:mod:`mainline_2025`, :mod:`ik`)
    metal_device: str = "MTL{i}"

    # --- server defaults and context ---
    #: ``-np`` unset means 4 slots sharing one unified KV cache
    auto_parallel: bool = False
    #: ``--fit on`` is the default (an exported command pins ``-fit off``)
    fits_by_default: bool = False
    #: the 2026 speculative flags: ``--draft``/``--draft-min`` removed, ``--spec-draft-n-max`` checked
    spec_flags_2026: bool = False
    #: a draft model (``-md``) speculates only with a ``--spec-type`` that names a draft type: without
    #: one the server generates without it (the pinned build's speculative types default to none);
    #: earlier builds speculate whenever ``-md`` is given
    draft_needs_spec_type: bool = False
    #: with :attr:`draft_needs_spec_type`, a ``-md`` that no type drafts with is still loaded (its
    #: memory projected); False: the server drops it before loading
    loads_idle_draft: bool = True
    #: no ``--spec-type`` and a ``-md`` file with an MTP head: the speculative type is ``draft-mtp``
    #: (:func:`core.speculative.spec_types`)
    infers_draft_mtp: bool = False
    #: ik_llama.cpp from PR 645 (2025-08-15): speculative stages, its legacy ``--draft N`` etc. refused;
    #: False: earlier ik builds, whose ``--draft N`` set the speculative example's draft length
    spec_stages: bool = True
    #: the ``--spec-type`` names that draft with the ``-md`` model (as the parser stores them)
    draft_model_types: frozenset[str] = frozenset(
        {"draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark"})
    #: a hybrid model's recurrent state lives in the KV cache's buffers (ik_llama.cpp's ``cache_s_l``),
    #: not in RS buffers of its own (core.recurrent_state)
    recurrent_state_in_kv: bool = False
    #: the ``--spec-type`` names whose draft rolls a recurrent state back: the main context keeps
    #: ``--spec-draft-n-max`` snapshots of it per sequence (core.recurrent_state ``n_rs_seq``)
    rs_rollback_types: frozenset[str] = frozenset()
    #: the ``--spec-type`` name of the MTP context the planner projects (None: not modelled)
    mtp_spec_type: str | None = "draft-mtp"
    #: the draft model is loaded with a copy of the main command line (ik_llama.cpp): a saved plan's
    #: draft is read again from its whole command, not from its kept arguments alone
    draft_inherits_main_args: bool = False
    #: ``-td``/``-tbd`` set a ``-md`` draft model's threads (core.speed.hardware ``_draft``)
    applies_draft_threads: bool = True
    #: a draft tensor can be moved on its own (an ``-otd`` rule: :mod:`core.draft_moves`)
    moves_draft_tensors: bool = True
    #: the ``--mmproj`` projector's buffers are projected (clip.cpp of this build is modelled)
    projects_mmproj: bool = False
    #: logits reserved for every token of the ubatch (llama-context.cpp before n_outputs_max)
    reserves_ubatch_outputs: bool = False
    #: the graph's inputs as 2025 builds laid them out (core.compute.graph)
    legacy_graph_inputs: bool = False
    #: one KV stream shared by the slots, n_ctx padded to 256 (32 without flash attention)
    single_kv_stream: bool = False
    #: without flash attention V is stored transposed, padded to the widest layer
    pads_transposed_v: bool = True
    #: an MLA model's cache holds K only (mainline's MLA cache)
    mla_k_only_cache: bool = True
    #: a DSA model (deepseek32, glm-dsa) caches its lightning indexer's keys beside the MLA cache
    #: (``llama_kv_cache_dsa``, :mod:`core.dsa`)
    dsa_indexer_cache: bool = True
    #: DeepSeek V4's compressed caches and compressor states as ``llama_kv_cache_dsv4`` allocates them
    #: (core.compressed_kv); off: that layout is not modelled for the build, which a plan note says
    compressed_kv_cache: bool = False
    #: the server logs its buffer sizes only at -lv 4 (the launcher adds it to compare them)
    logs_buffers_at_verbosity_4: bool = False
    #: offloading a CPU expert matmul copies the whole expert tensor, and only for batches that
    #: route to enough experts (mainline copies just the experts the batch routes to)
    copies_whole_experts: bool = False
    #: CPU matrix kernels faster than mainline's (the speed estimate's default CPU efficiency)
    fast_cpu_kernels: bool = False
    #: a CUDA GPU's quantized matrix products run faster per FLOP with more tokens than 512 a matrix
    #: (core.speed.efficiency.gpu_rows_max_gain): ik_llama.cpp's measurements; mainline's MMQ tiles are at
    #: most 128 tokens wide, so past them a matrix only has more tiles
    cuda_gains_past_512_rows: bool = False
    #: ggml-cpu's tiled matmul (``ggml-cpu/tiled/``, llama.cpp PR 27851, opened 2026-08-28): on x86 with
    #: AVX2 or better, a K-quant or i-quant weight outside a repack buffer is multiplied by a batch of 8
    #: or more rows (``mul_mat``; ``mul_mat_id``: rows routed to the expert) through 256x256 int8 tiles,
    #: where builds without it run ``vec_dot`` row by row (core.speed.efficiency.TILED_TYPES)
    cpu_tiled_matmul: bool = False
    #: ggml-cpu multiplies a batch through a GEMM for some weight types (llamafile's tinyBLAS,
    #: ``llamafile/sgemm.cpp``, llama.cpp PR 6414, merged 2024-04-16 as 8cc91dc; later the repacked
    #: GEMMs): builds before it ran every CPU matrix product through ``vec_dot`` row by row
    #: (core.speed.efficiency.PRE_SGEMM_COSTS)
    cpu_gemm: bool = True
    #: how an exported command turns mmap off
    no_mmap_flags: tuple[str, ...] = ("--no-mmap",)

    # --- recognising a server (core.cmdline.dialect.detect_dialect) ---
    #: checked in this order (lowest first): a dialect whose markers are more specific goes first
    detect_rank: int = 100
    #: regexes only this dialect's ``--help`` prints, strongest first
    help_markers: tuple[str, ...] = ()
    #: regexes of its ``--version`` output
    version_markers: tuple[str, ...] = ()

    def rpc_entry_reaction(self, problem: str, mainline: str) -> str:
        """What the server does with an ``--rpc`` entry it cannot use (``problem``: what is wrong with
        it; ``mainline``: what the pinned llama-server does, which this family does too)."""
        return mainline

    def __new__(cls, name: str, label: str = "") -> Dialect:
        if cls is Dialect:
            return dialect_named(name)
        obj = super().__new__(cls, name)
        obj.label = label or name
        return obj

    @property
    def value(self) -> str:
        """The plain name (what the enum's ``.value`` was)."""
        return str.__str__(self)

    def __copy__(self) -> Dialect:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Dialect:
        return self

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return dialect_named, (self.value,)

    # --- device names ---
    def before_tiled_cpu(self) -> Dialect:
        """This dialect's rules with the CPU kernels of builds before the tiled matmul
        (``cpu_tiled_matmul`` off): a measurement of an older build read with this dialect's parser."""
        return self

    def before_cpu_gemm(self) -> Dialect:
        """This dialect's rules with the CPU kernels of builds before llamafile's sgemm (``cpu_gemm``
        off, and so no tiled matmul either): a measurement of a build before 2024-04-16 read with this
        dialect's parser."""
        return self

    def server_device_name(self, name: str) -> str:
        """A device (or its ``-ot`` buffer type) as this build spells it: the planner's ``MTL0`` is
        :attr:`metal_device`; every other name is the same in all builds."""
        m = re.fullmatch(r"MTL(\d+)", name)
        return self.metal_device.format(i=int(m[1])) if m else name

    def planner_device_name(self, name: str) -> str:
        """The planner's name of a device (or ``-ot`` buffer type) this build spells ``name``: the
        inverse of :meth:`server_device_name` (``Metal`` in a 2025 build is MTL0)."""
        head, sep, tail = self.metal_device.partition("{i}")
        if not sep:
            return "MTL0" if name == head else name
        m = re.fullmatch(re.escape(head) + r"(\d+)" + re.escape(tail), name)
        return f"MTL{m[1]}" if m else name

    def planner_buffer_name(self, name: str) -> str:
        """A device or buffer (type) name this build logs, as the planner names it: a 2025 build's
        ``Metal_Mapped`` is MTL0_Mapped and its ``Metal`` MTL0 (ik's mapped Metal weights are logged
        ``Metal`` too); every other name as logged."""
        dev = self.planner_device_name(name)
        if dev != name:
            return dev
        head, sep, tail = name.rpartition("_")
        dev = self.planner_device_name(head) if sep else head
        return f"{dev}_{tail}" if dev != head else name

    def dev_name(self, device: Device) -> str:
        """The name ``-dev`` takes for ``device`` in this build (pinned: ``RPC<i>`` numbered over the
        servers, ``MTL<i>``; :meth:`server_device_name`)."""
        return self.server_device_name(device.name)

    def selected_gpus(self, names: Sequence[str] | None, gpus: Sequence[Device]) -> tuple[str, ...] | None:
        """The model's devices a ``-dev`` list selects, in its order, as the planner names them
        (pinned mainline: ``llama_prepare_model_devices`` takes ``params.devices`` as given; ik:
        ``model->devices`` from the names in order). None: no ``-dev`` (every GPU, the build's own
        order); ``()`` for ``-dev none``. Names are matched as this build matches them
        (:attr:`device_names_ignore_case`); a name no GPU has is left out (the pinned build's parser
        refuses it; ik skips it: :attr:`skips_unknown_devices`)."""
        if not names:
            return None
        if list(names) == ["none"]:
            return ()
        fold = str.lower if self.device_names_ignore_case else str
        own = {fold(self.dev_name(g)): g.name for g in gpus}
        got = (own.get(fold(n)) for n in names)
        return tuple(g for g in got if g is not None)

    def skipped_devices_note(self, skipped: Sequence[str], *, any_left: bool, draft: bool) -> str:
        """What the build says and does of ``-dev`` (``draft``: ``-devd``) names it has no device of
        (``skipped``, in the order given) when it skips them (:attr:`skips_unknown_devices`);
        ``any_left``: some other name of the list selects a device."""
        raise NotImplementedError(f"{self} refuses an unknown -dev name while parsing")

    # --- flags ---
    def flag_table(self) -> FlagTable:
        raise NotImplementedError

    def moved_flags(self) -> Mapping[str, str]:
        """Spellings this dialect rejects although a neighbour takes them: what to write instead."""
        return {}

    def parse(self, args: list[str], env: dict[str, str], parsed: ParsedArgs) -> ParsedArgs:
        """Read the command line (without the program) into ``parsed``."""
        raise NotImplementedError

    def effective_overrides(self, parsed: ParsedArgs,
                            moe_layers: Sequence[int] | None) -> list[TensorOverride]:
        """The -ot list the server ends up with (mainline: as parsed)."""
        return list(parsed.args.overrides)

    def split_env(self, groups: list[ArgGroup]) -> EnvSplit:
        """Which grouped arguments this build reads from ``LLAMA_ARG_*`` variables."""
        raise NotImplementedError

    def context_errors(self, parsed: ParsedArgs, is_mla: bool, device_names: Sequence[str],
                       arch: str | None = None) -> list[ArgError]:
        """Refusals when the server builds its context (``-sm``, cache types, ``-mg`` ...); ``arch``: the
        model's architecture when known."""
        raise NotImplementedError

    def exps_regex(self) -> str:
        """The routed-experts pattern ``--cpu-moe`` expands to."""
        raise NotImplementedError

    # --- placement ---
    def default_ngl(self, ngl: Any, has_gpu: bool) -> Any:
        """-ngl as the server reads an unset value (mainline: resolved by ``resolve_ngl``)."""
        return ngl

    def kept_overrides(self, ngl: Any, overrides: tuple[Override, ...]) -> tuple[Override, ...]:
        return overrides

    def turns_mmap_off(self, args: Any) -> bool:
        """Flags besides the load mode that make the server read weights without mmap."""
        return False

    # --- context ---
    def mla(self, model: Model, requested: int | None) -> int:
        """-mla mode the server uses (0: the dialect has no MLA modes)."""
        return 0

    def amb(self, requested: int | None) -> int:
        return 0

    def takes_mla(self, model: Model) -> bool:
        """The -mla setting applies to this model."""
        return False

    def nkvo_attention_on_gpu(self, flash_attn: bool) -> bool:
        """With -nkvo, whether a GPU layer's attention op runs on that GPU (the host cache's K/V views
        copied to it every token and micro-batch) instead of on the CPU.  Mainline pins the attention
        output to the CPU only on the path without flash attention (llama-graph.cpp
        ``build_attn_mha``, the ``else`` branch: ``ggml_backend_sched_set_tensor_backend(..., backend_cpu)``);
        the flash-attention op is left unassigned by the scheduler's pass 1 (``FLASH_ATTN_EXT`` skips
        the weights rule), and "expand gpu up" from the output projection gives it the layer's GPU
        (ggml-backend.cpp); the K/V views of the host buffer become split inputs, copied.  The
        auto flash-attention probe checks the op's device against ``model.dev_layer`` and so keeps it
        on ("still wrong for cases like --no-kv-offload", llama-context.cpp).  ik_llama.cpp: the same
        (it pins only ``kqv_merged_cont``, the non-flash path's output)."""
        return flash_attn

    def own_kv_rows(self, model: Model) -> bool:
        """The KV cache of this model follows :meth:`kv_rows` instead of mainline's layout."""
        return False

    def kv_rows(self, model: Model, il: int, p: ContextParams, tk: GGMLType,
                tv: GGMLType) -> tuple[int, int, str]:
        """Bytes per cell of K and V of layer ``il``, and what the cache holds (see :meth:`own_kv_rows`)."""
        raise NotImplementedError

    # --- projection ---
    def extra_buffers(self, model: Model, devices: DeviceSet, placement: Placement, p: ContextParams,
                      bufs: list[Buffer]) -> list[Buffer]:
        """The weight/KV/output buffers as this build allocates them (mainline: unchanged)."""
        return bufs

    def main_kv_layers(self, model: Model, placement: Placement) -> range | None:
        """The layers the main context caches; None: the trunk (mainline never caches the NextN layers
        in the main context)."""
        return None

    def mtp_cache_types(self, main: ContextParams, type_k: str, type_v: str) -> tuple[str, str]:
        """The MTP context's cache types, given the draft's (``-ctkd``/``-ctvd``, :meth:`draft_cache_types`):
        mainline's MTP context takes those."""
        return type_k, type_v

    def mtp_buffers(self, model: Model, devices: DeviceSet, placement: Placement, main: ContextParams,
                    ctx: ResolvedContext, type_k: str, type_v: str) -> list[Buffer] | None:
        """The MTP context's KV, output and compute buffers as this build creates it; None: mainline's
        (:func:`offload_planner.core.speculative.mtp_context`)."""
        return None

    def compute_buffers(self, model: Model, devices: DeviceSet, placement: Placement,
                        ctx: ResolvedContext, p: ContextParams) -> list[Buffer] | None:
        """The compute buffers of the graph reservation from this build's own simulator; None:
        mainline's graph (:mod:`offload_planner.core.compute`, the reference simulation)."""
        return None

    def annotate_compute(self, model: Model, ctx: ResolvedContext, p: ContextParams,
                         bufs: list[Buffer]) -> list[Buffer]:
        """Every buffer, the compute buffers' explanations completed where this build's differ."""
        return bufs

    # --- warnings and notes ---
    def model_errors(self, model: Model) -> list[str]:
        """Why this build refuses to load the model (none known: empty)."""
        return []

    def warnings(self, model: Model, popts: PlacementOptions, devices: DeviceSet) -> list[str]:
        return []

    def notes(self, popts: PlacementOptions, devices: DeviceSet) -> list[str]:
        return []

    def trained_context_note(self) -> str:
        return ""

    # --- command emission ---
    def mla_flags(self, model: Model, p: ContextParams) -> list[str]:
        """ik's -mla/-amb when they differ from the server's defaults (mainline: none)."""
        return []

    def kv_cache_types(self) -> tuple[str, ...]:
        from offload_planner.core.ggml_types import KV_CACHE_TYPES

        return KV_CACHE_TYPES

    # --- speculative decoding (core.speculative) ---
    def spec_notes(self, types: Sequence[str], draft_model: str | None) -> list[str]:
        """What the projection leaves out of these speculative stages (none: every type is modelled)."""
        return []

    def draft_kept_args(self, kept: list[str], draft: DraftSettings | None) -> list[str]:
        """The kept arguments (``Plan.extra_args``) such that the exported command, which pins ``-c``,
        gives the draft the context it was projected with (mainline: as given)."""
        return kept

    def draft_n_max(self, draft: DraftArgs) -> int:
        """Tokens drafted a step (``--spec-draft-n-max``, default ``common_params_speculative_draft::n_max``:
        :data:`~offload_planner.core.spec_defaults.DEFAULT_DRAFT_N_MAX`)."""
        return DEFAULT_DRAFT_N_MAX if draft.n_max is None else max(0, draft.n_max)

    def draft_stop(self, draft: DraftArgs) -> tuple[float, str, bool]:
        """(p_min, where it comes from, given): a draft stops early when the draft's probability falls
        below p_min (``--spec-draft-p-min``, default 0: never; common/speculative.cpp
        ``cur_p->data[0].p < params.p_min``)."""
        p = draft.p_min or 0.0
        return p, (f"--spec-draft-p-min {p:g}" if draft.p_min is not None else ""), draft.p_min is not None

    def draft_server_args(self, args: ServerArgs, draft: DraftArgs, pinned_to_one_gpu: bool) -> ServerArgs:
        """The settings the draft model is loaded with (common/speculative.cpp
        ``common_base_params_to_speculative``): the main command line with its own ``-ngld`` and ``-otd``
        (the main ``-ot`` does not apply); a draft pinned to one device by ``-devd`` uses ``-sm layer``;
        its devices are ``-devd``'s, else the main ``-dev``'s ("default to global devices value")."""
        from dataclasses import replace

        split = "layer" if pinned_to_one_gpu else args.split_mode
        return replace(args, n_gpu_layers=draft.n_gpu_layers, overrides=list(draft.overrides),
                       split_mode=split, devices=draft.devices or args.devices)

    def draft_refusals(self, draft: DraftSettings) -> list[str]:
        """Why the server cannot load the draft model as it is placed (none: it loads)."""
        return []

    def draft_cache_types(self, args: ServerArgs, draft: DraftArgs) -> tuple[str, str]:
        """The draft cache's K and V types: ``-ctkd``/``-ctvd``, default f16 (also the MTP context's)."""
        return draft.cache_type_k or "f16", draft.cache_type_v or "f16"

    def draft_n_ctx(self, args: ServerArgs, draft_args: ServerArgs, draft: DraftArgs) -> int | None:
        """The draft context's requested size: None for the main context's cells
        (``llama_n_ctx(ctx_tgt)``), else ``-cd`` as 2025 builds read it (0: the draft's trained length)."""
        return draft.ctx_size or None

    def draft_context_params(self, main: ContextParams, main_cells: int,
                             draft: DraftSettings) -> ContextParams:
        """The draft context: the main context's parameters, its own size and cache types, and the
        pinned server's ``n_outputs_max = min(n_batch, n_seq_max)``."""
        from dataclasses import replace

        return replace(main, n_ctx=main_cells if draft.n_ctx is None else draft.n_ctx, type_k=draft.type_k,
                       type_v=draft.type_v, n_outputs_max=min(main.n_batch, main.n_seq_max))


def register(dialect: Dialect, attribute: str | None = None) -> Dialect:
    """Make ``dialect`` known by name (and as ``Dialect.<attribute>``); returns it."""
    _REGISTRY[dialect.value] = dialect
    if attribute:
        setattr(Dialect, attribute, dialect)
    return dialect


def unregister(dialect: Dialect) -> None:
    """Forget a dialect (tests that register a temporary one)."""
    if _REGISTRY.get(dialect.value) is dialect:
        del _REGISTRY[dialect.value]


def dialect_named(name: str) -> Dialect:
    """The registered dialect of that name; ``ValueError`` naming the known ones otherwise."""
    found = _REGISTRY.get(str(name))
    if found is None:
        raise ValueError(f"{name!r} is not a known dialect ({', '.join(_REGISTRY)})")
    return found


def all_dialects() -> list[Dialect]:
    return list(_REGISTRY.values())
