"""ik_llama.cpp's speculative-decoding flags (``common/common.cpp: gpt_params_find_arg``), replayed.

Read at ikawrakow/ik_llama.cpp 8337e4cd (2026-08-15):

* ``-md/--model-draft PATH`` only sets ``speculative.model`` (1636-1640); ``-ngld`` (2032, ``std::stoi``,
  no ``auto``/``all``), ``-devd`` (2302, ``parse_device_list``: a blank value or one with ``-`` throws
  "no devices specified"), ``-cd`` (1266), ``-ctkd``/``-ctvd`` (1898-1905, ``argv[++i]`` unchecked) and
  ``-draft/--draft-params "ARGS"`` (2162: a command line parsed onto the draft's copy of the main
  parameters, :func:`draft_server_args`) set the draft's own parameters.
* ``--spec-type SPEC[:k=v,...]`` (1646) appends a stage (``common_speculative_stage_from_arg``,
  1097-1121): the type from ``common_speculative_type_from_name_map`` (common/speculative.cpp 44-57:
  ``none draft dflash dspark mtp eagle3 ngram_simple ngram_map_k ngram_map_k4v ngram_mod ngram_cache
  suffix``, ``-`` read as ``_``), then ``k=v`` keys (928-1010); an unknown type throws "unknown
  speculative stage type: NAME", printed as is by ``gpt_params_parse`` (839-842).
* ``--draft/--draft-max/--draft-n``, ``--draft-min``, ``--draft-p-min``, ``--spec-stage``,
  ``-mtp``/``-no-mtp`` and the ngram/suffix size flags throw "legacy speculative option ... is
  disabled" (:data:`parse_ik._LEGACY_SPEC`).
* After the command line ``common_speculative_validate_chain`` (288-343, called at 790) refuses a
  chain of more than two stages, a repeated type, ``n_min > n_max``, a ``draft``/``dflash``/``dspark``
  stage without ``-md`` or ``-draft`` and a two-stage chain that is not self-speculation then
  ``mtp``/``draft`` (:func:`chain_errors`).
"""

from __future__ import annotations

from offload_planner.core.cmdline.cnum import stof, stoi
from offload_planner.core.cmdline.context import Ctx, HandlerError
from offload_planner.core.cmdline.flags_ik import IK_KV_TYPES
from offload_planner.core.cmdline.handlers_mainline import Handler, string_split
from offload_planner.core.cmdline.model import DraftArgs

#: ``common_speculative_type_from_name_map`` (common/speculative.cpp 44-57)
IK_SPEC_TYPES = ("none", "draft", "dflash", "dspark", "mtp", "eagle3", "ngram_simple", "ngram_map_k",
                 "ngram_map_k4v", "ngram_mod", "ngram_cache", "suffix")
#: stages that need the ``-md`` model (``needs_dft_model``, common.cpp 242-246; ``mtp`` only with ``-md``)
IK_DRAFT_MODEL_TYPES = frozenset({"draft", "dflash", "dspark"})
_SELF_SPEC = frozenset({"ngram_simple", "ngram_map_k", "ngram_map_k4v", "ngram_mod", "ngram_cache", "suffix"})
#: ``common_params_speculative::n_max`` / ``n_min`` / ``p_min`` (common/common.h 223-224, 230)
IK_DEFAULT_N_MAX, IK_DEFAULT_N_MIN, IK_DEFAULT_P_MIN = 16, 0, 0.75

_INT_KEYS = {"n_max": 0, "n_min": 0, "mtp_heads": 0, "heads": 0, "cross_ctx": 1, "dflash_cross_ctx": 1,
             "ngram_size_n": 1, "ngram_size_m": 1, "ngram_min_hits": 1, "suffix_min_match_len": 1,
             "suffix_max_depth": 1}
_KEY_WORDS = {"heads": "mtp_heads", "cross_ctx": "dflash cross_ctx", "dflash_cross_ctx": "dflash cross_ctx"}
_RANGED = frozenset({"ngram_size_n", "ngram_size_m"})  # 1..1024


def h_model_draft(ctx: Ctx) -> None:
    ctx.args.draft.model = ctx.value


def h_gpu_layers_draft(ctx: Ctx) -> None:
    ctx.args.draft.n_gpu_layers = stoi(ctx.value)


def h_device_draft(ctx: Ctx) -> None:
    if ctx.value == " " or "-" in ctx.value:
        raise HandlerError("no devices specified")
    names = string_split(ctx.value)
    ctx.args.draft.devices = ["none"] if names == ["none"] else names


def h_ctx_size_draft(ctx: Ctx) -> None:
    ctx.args.draft.ctx_size = stoi(ctx.value)


def h_cache_type_draft(field: str) -> Handler:
    def handler(ctx: Ctx) -> None:
        # a type ik refuses is reported by the parser when the draft loads; the projection keeps the default
        if ctx.value in IK_KV_TYPES:
            setattr(ctx.args.draft, field, ctx.value)

    return handler


def h_draft_params(ctx: Ctx) -> None:
    ctx.args.draft.params = ctx.value


def _split_kvs(text: str) -> list[str]:
    """``common_speculative_stage_split_kvs``: commas split, except inside a quoted value or escaped."""
    out, cur, quote, escaped = [], "", "", False
    for ch in text:
        if escaped:
            cur, escaped = cur + ch, False
        elif ch == "\\":
            cur, escaped = cur + ch, True
        elif quote:
            cur, quote = cur + ch, ("" if ch == quote else quote)
        elif ch in "'\"" and cur.endswith("="):
            cur, quote = cur + ch, ch
        elif ch == ",":
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if quote:
        raise HandlerError("invalid speculative stage option list: unterminated quote")
    return [*out, cur]


def _apply_kv(stage: dict[str, int | float | str], key_raw: str, value: str) -> None:
    key = key_raw.lstrip("-").replace("-", "_")
    if key in _INT_KEYS:
        n = stoi(value)
        if key in _RANGED and not 1 <= n <= 1024:
            raise HandlerError(f"speculative stage {key} must be between 1 and 1024 inclusive")
        if n < _INT_KEYS[key]:
            word = _KEY_WORDS.get(key, key)
            rule = ">= 0" if _INT_KEYS[key] == 0 else "at least 1"
            raise HandlerError(f"speculative stage {word} must be {rule}")
        stage[{"heads": "mtp_heads", "cross_ctx": "dflash_cross_ctx"}.get(key, key)] = n
    elif key == "p_min":
        p = stof(value)
        if p < 0:
            raise HandlerError("speculative stage p_min must be >= 0")
        stage["p_min"] = p
    elif key == "suffix_corpus":
        if not value:
            raise HandlerError("speculative stage suffix_corpus must not be empty")
    else:
        raise HandlerError(f"unknown speculative stage parameter: {key_raw}")


def h_spec_type(ctx: Ctx) -> None:
    """One ``--spec-type`` stage; ``draft.types`` keeps the non-``none`` types in order,
    ``draft.stages`` every stage's overrides (``n_max``/``n_min``)."""
    name, colon, rest = ctx.value.partition(":")
    kind = name.replace("-", "_")
    if kind not in IK_SPEC_TYPES:
        raise HandlerError(f"unknown speculative stage type: {name}",
                           explanation=f"ik_llama.cpp's types: {', '.join(IK_SPEC_TYPES)}")
    stage: dict[str, int | float | str] = {}
    for kv in _split_kvs(rest) if colon else []:
        key, eq, value = kv.partition("=")
        if not eq:
            raise HandlerError(f"invalid speculative stage option: {kv}")
        _apply_kv(stage, key, value)
    if kind != "none":
        d = ctx.args.draft
        d.types.append(kind)
        d.stages.append((kind, int(stage.get("n_max", -1)), int(stage.get("n_min", -1))))
        if "p_min" in stage:
            d.stage_p_min[kind] = float(stage["p_min"])


def stage_n_max(d: DraftArgs, kind: str) -> int:
    return next((n if n >= 0 else IK_DEFAULT_N_MAX for k, n, _ in d.stages if k == kind), IK_DEFAULT_N_MAX)


def chain_errors(d: DraftArgs) -> list[str]:
    """``common_speculative_validate_chain``'s refusals (each printed after "error: invalid
    speculative stage configuration: ")."""
    stages = d.stages
    if len(stages) > 2:
        return ["at most two speculative stages are supported in this PR"]
    seen: set[str] = set()
    for kind, n_max, n_min in stages:
        if kind in seen:
            return [f"duplicate speculative stage type in chain: {kind}"]
        seen.add(kind)
        hi = n_max if n_max >= 0 else IK_DEFAULT_N_MAX
        lo = n_min if n_min >= 0 else IK_DEFAULT_N_MIN
        if lo > hi:
            return ["speculative stage has n_min greater than n_max"]
        if kind in IK_DRAFT_MODEL_TYPES and not (d.model or d.params):
            return [f"{kind} speculative stage requires a draft model or draft params"]
    if len(stages) == 2:
        if stages[0][0] not in _SELF_SPEC:
            return ["two-stage speculative mode currently requires a self-spec stage first"]
        if stages[1][0] not in ("mtp", "draft"):
            return ["two-stage speculative mode currently supports only MTP or draft-model fallback after "
                    "self-spec"]
    return []


IK_SPEC_HANDLERS: dict[str, Handler] = {
    "--model-draft": h_model_draft,
    "--gpu-layers-draft": h_gpu_layers_draft,
    "--device-draft": h_device_draft,
    "--ctx-size-draft": h_ctx_size_draft,
    "--cache-type-k-draft": h_cache_type_draft("cache_type_k"),
    "--cache-type-v-draft": h_cache_type_draft("cache_type_v"),
    "--draft-params": h_draft_params,
    "--spec-type": h_spec_type,
}
