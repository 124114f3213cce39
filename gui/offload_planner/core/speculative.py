"""Speculative decoding as llama-server loads it: a draft model (``-md``) with its own placement and
context, or an MTP context (``--spec-type draft-mtp``) on the main model's NextN layers.

From the pinned build's ``common/speculative.cpp`` (``common_base_params_to_speculative``,
``common_speculative_init_result``) and ``tools/server/server-context.cpp`` (``load_model``):

* The draft model takes the main command line with its own ``-devd`` (default: the main devices),
  ``-ngld`` (default auto = all), ``-otd``/``-cmoed``/``-ncmoed`` (the main ``-ot`` does not apply);
  a draft pinned to one device uses ``-sm layer``.  Its context holds as many cells as the main
  context (``llama_n_ctx(ctx_tgt)``), K/V types from ``-ctkd``/``-ctvd`` (default f16), and
  ``n_outputs_max = n_parallel``.
* ``draft-mtp`` loads the NextN layers with the main model (``load_mtp``) and creates a second
  context on the main model (``LLAMA_CONTEXT_TYPE_MTP``): KV for the NextN layers only, its own
  output buffer and compute (the MTP graph).
* With a draft-type ``--spec-type`` the main context reserves ``min(n_batch, n_parallel *
  (1 + n_max))`` output rows (``server_output_limits``; n_max = ``--spec-draft-n-max``, default 3).
* Without ``--spec-type``, a ``-md`` file with an MTP head (``blk.{block_count-1}.nextn.eh_proj``)
  makes the type ``draft-mtp`` (common/arg.cpp 566-573, ``common_speculative_types_from_gguf``):
  both models load their NextN layers (common.cpp 1683 ``load_mtp``), the output rows are reserved,
  and the draft's context is an MTP context on the draft model (speculative.cpp 2606-2637: the draft
  loaded with ``ctx_type = LLAMA_CONTEXT_TYPE_MTP``): the draft's weights, KV of its NextN layers
  only, and the MTP graph's compute; it drafts with its MTP head on the target's hidden state.
  ``--spec-type draft-mtp`` with ``-md`` does the same.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from offload_planner.core.buffer import Buffer
from offload_planner.core.cmdline.model import ParsedArgs
from offload_planner.core.devices import DeviceSet
from offload_planner.core.dialects import LLAMA_CPP, Dialect
from offload_planner.core.extra_context import DRAFT, MTP, ExtraContext, tagged
from offload_planner.core.hybrid_indexer import mtp_indexer_buffers
from offload_planner.core.memory import (
    ContextParams,
    ResolvedContext,
    kv_buffers,
    output_buffer,
    project,
    resolve_context,
)
from offload_planner.core.model import Model
from offload_planner.core.placement import Placement, PlacementOptions, place
from offload_planner.core.spec_defaults import DEFAULT_DRAFT_N_MAX, DRAFT_TYPES
from offload_planner.core.summary import short_name


@dataclass(frozen=True)
class DraftSettings:
    """The draft model's own placement and context types, resolved from the command line."""

    model: Model
    devices: DeviceSet
    placement_options: PlacementOptions
    type_k: str = "f16"
    type_v: str = "f16"
    n_ctx: int | None = None  # 2025 builds' -cd; None: the main context's cells
    #: the draft's own settings where the dialect reads its context from them (ik's ``-draft "ARGS"``)
    settings: Any = None


@dataclass(frozen=True)
class SpecSettings:
    """What speculative decoding adds to a plan: a draft model and/or the MTP context."""

    draft: DraftSettings | None = None
    mtp: bool = False
    type_k: str = "f16"  # -ctkd/-ctvd also type the MTP context's cache
    type_v: str = "f16"
    n_max: int = DEFAULT_DRAFT_N_MAX  # --spec-draft-n-max: tokens drafted a step
    #: the draft model drafts (the dialect's rule: :attr:`Dialect.draft_needs_spec_type`); False: loaded only
    draft_speculates: bool = True
    #: what the projection leaves out or approximates of the speculative stages (:meth:`Dialect.spec_notes`)
    notes: tuple[str, ...] = ()
    #: a draft stops early below this probability (:meth:`Dialect.draft_stop`; 0: never), where the
    #: figure comes from, and whether the command gave it
    p_min: float = 0.0
    p_min_from: str = ""
    p_min_given: bool = False
    #: why the server cannot load the draft model as placed (:meth:`Dialect.draft_refusals`)
    refusals: tuple[str, ...] = ()

    @property
    def active(self) -> bool:
        return self.draft is not None or self.mtp

    @property
    def drafting(self) -> bool:
        """A draft model that the server drafts with (not only loads)."""
        return self.draft is not None and self.draft_speculates


def _draft_args(args: Any) -> Any:
    inner = getattr(args, "args", args)
    return getattr(inner, "draft", None)


def has_mtp_head(model: Model) -> bool:
    """What ``common_speculative_types_from_gguf`` looks for: ``blk.{block_count-1}.nextn.eh_proj``."""
    return model.get(f"blk.{model.summary.n_layer - 1}.nextn.eh_proj.weight") is not None


def spec_types(args: Any, dialect: Dialect | None = None) -> list[str]:
    """The speculative types the server runs with: the ``--spec-type`` list given, else (a dialect
    that infers it, :attr:`Dialect.infers_draft_mtp`) ``draft-mtp`` when the ``-md`` file has an MTP
    head; a draft file that cannot be read infers nothing (opening it reports why)."""
    d = _draft_args(args)
    if d is None:
        return []
    if d.types or not d.model or dialect is None or not Dialect(dialect).infers_draft_mtp:
        return list(d.types)
    return ["draft-mtp"] if _file_has_mtp_head(d.model) else []


def _file_has_mtp_head(location: str) -> bool:
    try:
        st = os.stat(location)
        key = (st.st_mtime_ns, st.st_size)
    except (OSError, ValueError):
        key = (0, 0)  # a URL: read once a process
    return _mtp_head_at(location, *key)


@functools.lru_cache(maxsize=8)
def _mtp_head_at(location: str, mtime_ns: int, size: int) -> bool:
    from offload_planner.core.errors import PlannerError

    try:
        return has_mtp_head(open_draft(location))
    except (PlannerError, OSError, ValueError):
        return False


def uses_mtp(args: Any, dialect: Dialect | None = None) -> bool:
    """``draft-mtp`` among the types (:func:`spec_types`): the models load their NextN layers."""
    mtp = "draft-mtp" if dialect is None else Dialect(dialect).mtp_spec_type
    return mtp is not None and mtp in spec_types(args, dialect)


def draft_len(args: Any, dialect: Dialect | None = None) -> int:
    """``common_speculative_n_max`` over the draft types (:func:`spec_types`; 0 without one)."""
    d = _draft_args(args)
    if d is None or not DRAFT_TYPES.intersection(spec_types(args, dialect)):
        return 0  # ik_llama.cpp's type names are not these: its main context reserves no draft outputs
    return Dialect(dialect or Dialect.LLAMA_CPP).draft_n_max(d)


def rs_snapshots(args: Any, dialect: Dialect | None = None) -> int:
    """``n_rs_seq``: the draft length when a type rolls the recurrent state back
    (:attr:`Dialect.rs_rollback_types`), else 0."""
    d = _draft_args(args)
    dialect = Dialect(dialect or Dialect.LLAMA_CPP)
    if d is None or not dialect.rs_rollback_types.intersection(spec_types(args, dialect)):
        return 0
    return dialect.draft_n_max(d)


def draft_devices(devices: DeviceSet, names: list[str] | None, dialect: Dialect = LLAMA_CPP) -> DeviceSet:
    """``-devd``: the listed offload devices (``none``: the CPU only); absent: all of them.  Names are
    matched as the build matches ``-dev``'s (:meth:`Dialect.selected_gpus`: the pinned build ignores
    case; ik looks them up as written, an RPC device by its buffer type)."""
    if not names:
        return devices
    chosen = Dialect(dialect).selected_gpus(names, devices.gpus) or ()
    # a device named twice is one device (its second mention is the draft's -devd list: the placement)
    gpus = tuple(g for n in dict.fromkeys(chosen) if (g := devices.by_name(n)) is not None)
    return DeviceSet(devices.cpu, gpus, reported_order=True)


#: ``engine.placement_options``: the draft's placement from its own arguments (passed in: the engine
#: imports this module)
PlacementOf = Callable[[Model, DeviceSet, Any, Dialect], PlacementOptions]


def spec_settings(devices: DeviceSet, args: Any, dialect: Dialect, placement_options: PlacementOf,
                  draft_model: Model | None = None) -> SpecSettings:
    """Resolve the speculative flags; ``draft_model`` is the opened ``-md`` file (None: no draft)."""
    d = _draft_args(args)
    if d is None:
        return SpecSettings()
    dialect = Dialect(dialect)
    ddev = draft_devices(devices, d.devices, dialect)
    inner = getattr(args, "args", args)
    dargs = dialect.draft_server_args(inner, d, bool(d.devices) and len(ddev.gpus) == 1)
    type_k, type_v = dialect.draft_cache_types(dargs, d)
    draft = None
    if draft_model is not None:  # -md, or ik's -draft "-m FILE" (load_spec)
        # as parsed arguments: the dialect's effective -ot list (ik's --n-cpu-moe, from the draft's layers)
        popts = placement_options(draft_model, ddev, ParsedArgs(dialect, args=dargs), dialect)
        draft = DraftSettings(draft_model, ddev, popts, type_k, type_v, dialect.draft_n_ctx(inner, dargs, d),
                              dargs if d.params else None)
    types = spec_types(args, dialect)
    drafts = (draft is None or not dialect.draft_needs_spec_type
              or bool(dialect.draft_model_types.intersection(types)))  # draft-mtp: its MTP head drafts
    if not drafts and not dialect.loads_idle_draft:  # dropped before it is loaded
        draft, drafts = None, True
    mtp = dialect.mtp_spec_type is not None and dialect.mtp_spec_type in types
    p_min, p_from, p_given = dialect.draft_stop(d)
    return SpecSettings(draft, mtp, type_k, type_v, dialect.draft_n_max(d), drafts,
                        tuple(dialect.spec_notes(types, d.model)), p_min, p_from, p_given,
                        tuple(dialect.draft_refusals(draft)) if draft is not None else ())


def draft_mtp_context(spec: SpecSettings, main: ContextParams, ctx: ResolvedContext) -> ExtraContext:
    """``-md`` with ``draft-mtp`` (given or inferred): the draft model's weights (its NextN layers
    loaded) and an MTP context on it, its KV of the NextN layers, output and MTP graph."""
    from offload_planner.core.memory import weight_buffers

    d = spec.draft
    assert d is not None
    placement = place(d.model, d.devices, d.placement_options)
    mtp = mtp_context(d.model, d.devices, placement, main, ctx, spec)
    name = d.model.path.rsplit("/", 1)[-1]
    return ExtraContext(DRAFT, f"draft model {name}, its {mtp.label}",
                        tagged(DRAFT, [*weight_buffers(d.model, placement, d.devices), *mtp.buffers]))


def draft_context(spec: DraftSettings, main: ContextParams, ctx: ResolvedContext) -> ExtraContext:
    """The draft model's weights, KV, output and compute buffers, as its own projection."""
    cparams = main.dialect.draft_context_params(main, ctx.n_ctx, spec)
    name = spec.model.path.rsplit("/", 1)[-1]
    return ExtraContext(DRAFT, f"draft model {name}",
                        draft_buffers(spec.model, spec.devices, spec.placement_options, cparams))


@functools.lru_cache(maxsize=8)
def draft_buffers(model: Model, devices: DeviceSet, popts: PlacementOptions,
                  cparams: ContextParams) -> tuple[Buffer, ...]:
    """The draft model's own projection, tagged: a function of its own placement (``-devd``, ``-ngld``,
    ``-otd``) and context only, never of the main model's placement, so the plans of a search (the
    ``fit`` command's candidates differ in the main model's experts) share one (``Model`` hashes by
    identity; :func:`load_spec` opens a draft file once while it is unchanged)."""
    proj = project(model, devices, place(model, devices, popts), cparams)
    return tagged(DRAFT, proj.buffers())


def mtp_context(model: Model, devices: DeviceSet, placement: Placement, main: ContextParams,
                ctx: ResolvedContext, spec: SpecSettings) -> ExtraContext:
    """The MTP context on the main model: KV of the NextN layers, output, and the MTP graph's compute."""
    from offload_planner.core.compute.mtp import MTP_GRAPHS, mtp_compute_buffers

    s = model.summary
    nextn = range(s.n_layer_trunk, s.n_layer)
    own = main.dialect.mtp_buffers(model, devices, placement, main, ctx, spec.type_k, spec.type_v)
    if own is None:
        cparams = replace(main, n_ctx=ctx.n_ctx, type_k=spec.type_k, type_v=spec.type_v,
                          n_outputs_max=min(main.n_batch, main.n_seq_max))
        mctx = resolve_context(cparams, s.n_ctx_train, s.n_swa)
        bufs = kv_buffers(model, placement, mctx, cparams, devices, cached=nextn)
        bufs += mtp_indexer_buffers(model, placement, cparams, mctx, devices)  # qwen4exp's (hybrid_idx)
        bufs.append(output_buffer(model, placement, cparams, devices))
        bufs += mtp_compute_buffers(model, devices, placement, mctx, cparams)
    else:
        bufs = own
    label = f"MTP context ({len(nextn)} NextN layer{'s' if len(nextn) != 1 else ''})"
    if (model.arch not in MTP_GRAPHS) if own is None else not any(b.kind == "compute" for b in bufs):
        label += f"; compute not projected (no MTP graph for {model.arch})"
    return ExtraContext(MTP, label, tagged(MTP, bufs), shares_model=True)


def load_spec(devices: DeviceSet, args: Any, dialect: Dialect,
              placement_options: PlacementOf) -> SpecSettings:
    """:func:`spec_settings` with the ``-md`` file opened (a :class:`GGUFError` names a bad one)."""
    location = draft_location(args, dialect)
    draft = open_draft(location) if location else None
    return spec_settings(devices, args, dialect, placement_options, draft)


def draft_location(args: Any, dialect: Dialect) -> str | None:
    """The draft model file the server loads: ``-md``, or ik's ``-draft "-m FILE"`` over it
    (:func:`~offload_planner.core.cmdline.ik_draft_params.loaded_draft_model`)."""
    from offload_planner.core.cmdline.ik_draft_params import loaded_draft_model

    d = _draft_args(args)
    if d is None or not d.params:
        return d.model if d is not None else None
    return loaded_draft_model(ParsedArgs(Dialect(dialect), args=getattr(args, "args", args)))


def open_draft(location: str) -> Model:
    """The ``-md`` file opened, the same :class:`Model` again while the file's modification time and
    size are unchanged (a search parses its command line once per candidate; opening reads the
    vocabulary's strings); unreadable paths are opened every time (errors name them); a URL is
    refused without a request (llama-server does not download -md)."""
    from offload_planner.core.byte_source import is_url
    from offload_planner.core.errors import PlannerError
    from offload_planner.core.loadable import open_loadable

    if is_url(location):  # llama-server opens it as a file name; a plan file's -md fetched it unasked
        raise PlannerError(f"draft model {location[:200]}: llama-server opens a draft model (-md, ik's "
                           "-draft \"-m FILE\") as a local file, not a URL (it fails to load it): download "
                           "it and give its path")
    try:
        st = os.stat(location)
    except (OSError, ValueError):
        return open_loadable(location)
    return _open_draft(location, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=2)
def _open_draft(location: str, mtime_ns: int, size: int) -> Model:
    from offload_planner.core.loadable import open_loadable

    return open_loadable(location)  # llama.cpp loads the draft as it loads the model


def spec_from_argv(devices: DeviceSet, argv: list[str], dialect: Dialect,
                   placement_options: PlacementOf) -> tuple[SpecSettings | None, list[str]]:
    """The speculative settings of kept flags (a saved plan's), and a note when the draft model cannot
    be read (the plan then projects the main model only)."""
    from offload_planner.core.cmdline import parse_server_args
    from offload_planner.core.errors import PlannerError

    parsed = parse_server_args(argv, dialect=Dialect(dialect))
    try:
        return load_spec(devices, parsed, dialect, placement_options), []
    except PlannerError as e:
        return None, [f"draft model not projected: {e}"]


#: common/speculative.cpp: a draft whose vocabulary is more tokens larger or smaller is not used
SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128


def draft_mismatch(model: Model, spec: SpecSettings | None) -> str | None:
    """Why llama-server does not use the ``-md`` draft with this model (None: it may), the checks of
    ``common_speculative_are_compatible`` that the files' metadata decide: the tokenizer's kind, the
    vocabulary's size within 128 tokens, BOS and EOS (whether added, and their ids where added). Its
    comparison of every token's text is not made (the reader skips the token strings). The server
    logs "failed to initialize speculative decoding context" and generates without the draft, which
    it still loads."""
    draft = spec.draft.model if spec is not None and spec.draft is not None else None
    if draft is None:
        return None
    a, b = model.metadata, draft.metadata
    kind_a, kind_b = a.get("tokenizer.ggml.model"), b.get("tokenizer.ggml.model")
    if kind_a is not None and kind_b is not None and kind_a != kind_b:  # a file's 2 MB name: cut
        return (f"the tokenizers differ ({short_name(kind_a, 80)} in the model, {short_name(kind_b, 80)} "
                "in the draft)")
    na, nb = model.summary.n_vocab, draft.summary.n_vocab
    if na and nb and abs(na - nb) > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        return (f"the vocabularies differ by {abs(na - nb)} tokens ({na} and {nb}; at most "
                f"{SPEC_VOCAB_MAX_SIZE_DIFFERENCE})")
    for tok in ("bos", "eos"):
        add_a, add_b = a.get(f"tokenizer.ggml.add_{tok}_token"), b.get(f"tokenizer.ggml.add_{tok}_token")
        id_a, id_b = a.get(f"tokenizer.ggml.{tok}_token_id"), b.get(f"tokenizer.ggml.{tok}_token_id")
        if add_a is not None and add_b is not None and add_a != add_b:
            return f"one adds a {tok.upper()} token and the other does not"
        if add_a and add_b and id_a is not None and id_b is not None and id_a != id_b:
            return f"their {tok.upper()} tokens differ (ids {id_a} and {id_b})"
    return None


def draft_warning(model: Model, spec: SpecSettings | None) -> str | None:
    """The line that says so (:func:`draft_mismatch`, or no draft type given), naming the draft file."""
    if spec is not None and spec.draft is not None and not spec.drafting:
        return (f"-md {spec.draft.model.path}: llama-server loads this draft model but does not draft "
                f"with it: no --spec-type names a draft type (this build's speculative types default "
                f"to none: \"no implementations specified for speculative decoding\"); add --spec-type "
                f"draft-simple; the speed estimate is without speculative decoding")
    why = draft_mismatch(model, spec)
    if why is None or spec is None or spec.draft is None:
        return None
    return (f"-md {spec.draft.model.path}: llama-server does not use this draft model: failed to initialize "
            f"speculative decoding context: draft model vocab type must match target model to use "
            f"speculation ({why}); it still loads it; the speed estimate is without speculative decoding")


def spec_refusals(model: Model, spec: SpecSettings | None) -> list[str]:
    """What llama-server refuses at load about speculative decoding on this model (its log lines), and
    what the projection leaves out of it (:attr:`SpecSettings.notes`)."""
    if spec is not None and spec.refusals:
        return [*spec.refusals, *spec_refusals(model, replace(spec, refusals=()))]
    if spec is not None and spec.notes:
        return [*spec.notes, *spec_refusals(model, replace(spec, notes=()))]
    if spec is not None and spec.mtp and spec.draft is None and not model.summary.n_nextn:
        return ["llama-server exits at load: llama_init_from_model: context type MTP requested but model "
                "doesn't contain MTP layers; failed to create MTP context (--spec-type draft-mtp needs "
                "NextN layers, nextn_predict_layers = 0 in this file)"]
    if spec is not None and spec.mtp and spec.draft is not None and not spec.draft.model.summary.n_nextn:
        return [f"llama-server exits at load: -md {spec.draft.model.path} with --spec-type draft-mtp: "
                "llama_init_from_model: context type MTP requested but model doesn't contain MTP layers; "
                "failed to create MTP context (the draft model has no NextN layers)"]
    return []


def spec_stops(model: Model, spec: SpecSettings | None) -> list[str]:
    """What of :func:`spec_refusals` stops llama-server at load (not what the projection leaves out)."""
    if spec is None:
        return []
    return [*spec.refusals, *spec_refusals(model, replace(spec, refusals=(), notes=()))]


def extra_contexts(model: Model, devices: DeviceSet, placement: Placement, main: ContextParams,
                   ctx: ResolvedContext, spec: SpecSettings | None) -> list[ExtraContext]:
    """The contexts speculative decoding adds, in the order the server creates them."""
    if spec is None or not spec.active:
        return []
    if spec.draft is not None:
        return [draft_mtp_context(spec, main, ctx) if spec.mtp else draft_context(spec.draft, main, ctx)]
    if spec.mtp and model.summary.n_nextn:
        return [mtp_context(model, devices, placement, main, ctx, spec)]
    return []
