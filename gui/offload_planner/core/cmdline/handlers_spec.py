"""What the speculative-decoding flags do (``common/arg.cpp`` of the pinned build, lines ~3990-4300):
the draft model and its own placement, the draft length, ``--spec-type``.

Refusals carry the handler's exception text (the parser prefixes ``error while handling argument``).
2025 builds spelled some of them differently (``--draft-max`` set the draft length; ``-cd`` sized the
draft context); the pinned build refuses ``--draft``/``--draft-min`` with ``arg_removed``.
"""

from __future__ import annotations

from offload_planner.core.cmdline.cnum import stof
from offload_planner.core.cmdline.context import Ctx, HandlerError
from offload_planner.core.cmdline.handlers_mainline import Handler, int_value, string_split
from offload_planner.core.cmdline.handlers_mainline import _cache_type as cache_type
from offload_planner.core.cmdline.model import GPU_LAYERS_ALL, GPU_LAYERS_AUTO, TensorOverride
from offload_planner.core.cmdline.moe import cpu_moe_overrides, n_cpu_moe_overrides

#: ``common_speculative_type_from_name_map`` (common/speculative.cpp).
SPEC_TYPES = (
    "none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "ngram-simple",
    "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
)


def h_draft_model(ctx: Ctx) -> None:
    ctx.args.draft.model = ctx.value


def h_draft_ngl(ctx: Ctx) -> None:
    v = ctx.value
    if v in ("auto", "all"):
        ctx.args.draft.n_gpu_layers = GPU_LAYERS_AUTO if v == "auto" else GPU_LAYERS_ALL
        return
    ctx.args.draft.n_gpu_layers = int_value(v)


def h_draft_device(ctx: Ctx) -> None:
    names = string_split(ctx.value)
    ctx.args.draft.devices = ["none"] if names == ["none"] else names


def h_draft_override(ctx: Ctx) -> None:
    entries: list[TensorOverride] = []
    for item in string_split(ctx.value):
        pattern, eq, buft = item.partition("=")
        if not eq:
            raise HandlerError("invalid value", explanation=f"'{item}' has no '=<buffer type>'")
        entries.append(TensorOverride(pattern, buft, "-otd", ctx.use.index))
    ctx.args.draft.overrides.extend(entries)
    for entry in entries:
        ctx.check_override_pattern(entry.pattern)


def _as_draft(entries: list[TensorOverride], source: str) -> list[TensorOverride]:
    return [TensorOverride(o.pattern, o.buft, source, o.index) for o in entries]


def h_draft_cpu_moe(ctx: Ctx) -> None:
    ctx.args.draft.overrides.extend(_as_draft(cpu_moe_overrides(ctx.dialect, ctx.use.index), "-cmoed"))


def h_draft_n_cpu_moe(ctx: Ctx) -> None:
    n = int_value(ctx.value)
    if n < 0:
        raise HandlerError("invalid value")
    ctx.args.draft.overrides.extend(
        _as_draft(n_cpu_moe_overrides(ctx.dialect, n, ctx.use.index), "-ncmoed"))


def h_draft_type_k(ctx: Ctx) -> None:
    ctx.args.draft.cache_type_k = cache_type(ctx)


def h_draft_type_v(ctx: Ctx) -> None:
    ctx.args.draft.cache_type_v = cache_type(ctx)


def h_draft_n_max(ctx: Ctx) -> None:
    n = int_value(ctx.value)
    if n < 0 and ctx.dialect.spec_flags_2026:
        raise HandlerError("invalid value")
    ctx.args.draft.n_max = n


def h_draft_p_min(ctx: Ctx) -> None:
    ctx.args.draft.p_min = stof(ctx.value)


def h_spec_type(ctx: Ctx) -> None:
    for name in string_split(ctx.value):
        if name not in SPEC_TYPES:
            raise HandlerError(f"unknown speculative type: {name}",
                               explanation=f"known types: {', '.join(SPEC_TYPES)}")
        ctx.args.draft.types.append(name)


def h_draft_removed(ctx: Ctx) -> None:
    """Pinned build: ``--draft``/``--draft-min`` read an int, then ``arg_removed``; 2025 builds:
    ``--draft-max`` set the draft length."""
    n = int_value(ctx.value)
    if ctx.dialect.spec_flags_2026:
        new = "--spec-draft-n-max or --spec-ngram-mod-n-max" if ctx.use.key == "--draft" else (
            "--spec-draft-n-min or --spec-ngram-mod-n-min")
        raise HandlerError(f"the argument has been removed. use {new}")
    if ctx.use.key == "--draft":
        ctx.args.draft.n_max = n


def h_ctx_size_draft(ctx: Ctx) -> None:
    ctx.args.draft.ctx_size = int_value(ctx.value)


SPEC_HANDLERS: dict[str, Handler] = {
    "--spec-draft-model": h_draft_model,
    "--spec-draft-ngl": h_draft_ngl,
    "--spec-draft-device": h_draft_device,
    "--spec-draft-override-tensor": h_draft_override,
    "--spec-draft-cpu-moe": h_draft_cpu_moe,
    "--spec-draft-n-cpu-moe": h_draft_n_cpu_moe,
    "--spec-draft-type-k": h_draft_type_k,
    "--spec-draft-type-v": h_draft_type_v,
    "--spec-draft-n-max": h_draft_n_max,
    "--spec-draft-p-min": h_draft_p_min,
    "--spec-type": h_spec_type,
    "--draft": h_draft_removed,
    "--draft-min": h_draft_removed,
    "--ctx-size-draft": h_ctx_size_draft,
}
