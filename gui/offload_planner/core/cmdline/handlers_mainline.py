"""What each placement-relevant flag does in mainline llama.cpp (``common/arg.cpp`` handlers).

A handler raises :class:`HandlerError` with the exception text the real handler throws; the
engine wraps it as ``error while handling argument "<flag>": <what>``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from offload_planner.core.cmdline.cnum import stof, stoi, stoull
from offload_planner.core.cmdline.context import Ctx, HandlerError
from offload_planner.core.cmdline.model import (
    GPU_LAYERS_ALL,
    GPU_LAYERS_AUTO,
    ArgError,
    ArgWarning,
    TensorOverride,
)
from offload_planner.core.cmdline.moe import cpu_moe_overrides, n_cpu_ffn_overrides, n_cpu_moe_overrides
from offload_planner.core.cmdline.rpc_endpoint import read_rpc_endpoint, rpc_endpoint_problem
from offload_planner.core.kv_override import items_of, parse_item

Handler = Callable[[Ctx], None]

KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")
MAX_DEVICES = 16  # llama_max_devices()
INT_MAX = 2**31 - 1


def truthy(v: str) -> bool:
    return v in ("on", "enabled", "true", "1")


def falsey(v: str) -> bool:
    return v in ("off", "disabled", "false", "0")


def autoy(v: str) -> bool:
    return v in ("auto", "-1")


def int_value(text: str) -> int:
    """``std::stoi``; its :class:`CNumberError` reaches the parser, which names the flag."""
    return stoi(text)


def split_list(text: str) -> list[str]:
    """``std::sregex_token_iterator`` over ``[,/]+`` with -1: pieces between separators; an empty
    piece after the last separator is dropped, but a text without a separator is one piece even when
    empty (libstdc++ yields the whole range as the suffix: ``-ts ""`` fails in std::stof)."""
    parts = re.split(r"[,/]+", text)
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()
    return parts


def string_split(text: str, sep: str = ",") -> list[str]:
    """llama.cpp's ``string_split``: always at least one (possibly empty) piece."""
    return text.split(sep)


# --------------------------------------------------------------------------- placement


def h_model(ctx: Ctx) -> None:
    ctx.args.model = ctx.value


def h_alias(ctx: Ctx) -> None:
    ctx.args.alias = ctx.value


def h_gpu_layers(ctx: Ctx) -> None:
    v = ctx.value
    if ctx.dialect.ngl_keywords and v in ("auto", "all"):
        ctx.args.n_gpu_layers = GPU_LAYERS_AUTO if v == "auto" else GPU_LAYERS_ALL
        return
    ctx.args.n_gpu_layers = int_value(v)


def h_override_tensor(ctx: Ctx) -> None:
    entries: list[TensorOverride] = []
    for item in string_split(ctx.value):
        pattern, eq, buft = item.partition("=")
        if not eq:
            raise HandlerError("invalid value", explanation=f"'{item}' has no '=<buffer type>'")
        entries.append(TensorOverride(pattern, buft, "-ot", ctx.use.index))
    ctx.args.overrides.extend(entries)
    for entry in entries:
        ctx.check_override_pattern(entry.pattern)


def _extend_generated(ctx: Ctx, entries: list[TensorOverride]) -> None:
    """Add the rules a flag stands for, except those equal (pattern and buffer type) to an earlier
    rule: such a rule is never the first match, so it changes no placement, and ``--n-cpu-moe 512``
    given 2,000 times would otherwise be a million rules."""
    have = {(o.pattern, o.buft) for o in ctx.args.overrides}
    ctx.args.overrides.extend(e for e in entries if (e.pattern, e.buft) not in have)


def h_cpu_moe(ctx: Ctx) -> None:
    ctx.args.cpu_moe = True
    _extend_generated(ctx, cpu_moe_overrides(ctx.dialect, ctx.use.index))


def h_n_cpu_moe(ctx: Ctx) -> None:
    n = int_value(ctx.value)
    if n < 0:
        raise HandlerError("invalid value")
    ctx.args.n_cpu_moe = n
    _extend_generated(ctx, n_cpu_moe_overrides(ctx.dialect, n, ctx.use.index))


def h_n_cpu_ffn(ctx: Ctx) -> None:
    n = int_value(ctx.value)
    if n < 0:
        raise HandlerError("invalid value")
    ctx.args.n_cpu_ffn = n
    _extend_generated(ctx, n_cpu_ffn_overrides(n, ctx.use.index))


def h_tensor_split(ctx: Ctx) -> None:
    parts = split_list(ctx.value)
    if len(parts) >= MAX_DEVICES:
        raise HandlerError(f"got {len(parts)} input configs, but system only has {MAX_DEVICES} devices")
    ctx.args.tensor_split = [stof(p) for p in parts]


def h_split_mode(ctx: Ctx) -> None:
    if ctx.value not in ctx.dialect.split_modes:
        raise HandlerError("invalid value")
    ctx.args.split_mode = ctx.value


def h_main_gpu(ctx: Ctx) -> None:
    ctx.args.main_gpu = int_value(ctx.value)


def h_device(ctx: Ctx) -> None:
    names = string_split(ctx.value)
    ctx.args.devices = ["none"] if names == ["none"] else names


def h_rpc(ctx: Ctx) -> None:
    servers = string_split(ctx.value)
    for ep in servers:
        problem, server = rpc_endpoint_problem(ep)
        if problem:  # the server stops at the first such entry
            flag = ctx.use.env or ctx.use.spelling
            where = f"{flag}={ctx.value}" if ctx.use.env else f"{flag} {_entry_text(ep)}"
            server = ctx.dialect.rpc_entry_reaction(problem, server)
            ctx.parsed.errors.append(ArgError(flag, ep, f"{where}: {problem}", explanation=server))
            return
    for ep in servers:
        _note_ignored_port_tail(ctx, ep)
    ctx.args.rpc_servers = [*(ctx.args.rpc_servers or []), *servers]


def _entry_text(entry: str) -> str:
    """An ``--rpc`` entry as a message names it: quoted when empty or with blanks at its ends."""
    return entry if entry and entry == entry.strip() else repr(entry)


def _note_ignored_port_tail(ctx: Ctx, entry: str) -> None:
    """``--rpc 127.0.0.1:50052x``: std::stoi reads port 50052 and ignores ``x``; llama-server says
    nothing and connects to 50052, we say so (as for ``-c 32k``)."""
    ep = read_rpc_endpoint(entry)
    if ep is None or not ep.ignored:
        return
    flag = ctx.use.env or ctx.use.spelling
    where = f"{flag}={ctx.value}" if ctx.use.env else f"{flag} {_entry_text(entry)}"
    message = (f"{where}: llama-server reads port {ep.port} of {ep.host} and ignores {ep.ignored!r} "
               "(std::stoi stops at the first character that is not part of a number)")
    ctx.parsed.warnings.append(ArgWarning(flag, entry, message))


# --------------------------------------------------------------------------- context / KV


def h_ctx_size(ctx: Ctx) -> None:
    ctx.args.ctx_size = int_value(ctx.value)


def h_batch(ctx: Ctx) -> None:
    ctx.args.batch_size = int_value(ctx.value)


def h_ubatch(ctx: Ctx) -> None:
    ctx.args.ubatch_size = int_value(ctx.value)


def h_parallel(ctx: Ctx) -> None:
    n = int_value(ctx.value)
    if n == 0 and ctx.dialect.auto_parallel:  # 0 is not "auto" (-1)
        raise HandlerError("error: invalid value for n_parallel")
    ctx.args.n_parallel = n


def h_kv_unified(ctx: Ctx) -> None:
    ctx.args.kv_unified = ctx.use.positive


def h_flash_attn(ctx: Ctx) -> None:
    v = ctx.value
    if truthy(v):
        ctx.args.flash_attn = "on"
    elif falsey(v):
        ctx.args.flash_attn = "off"
    elif autoy(v):
        ctx.args.flash_attn = "auto"
    else:
        raise HandlerError(f"error: unknown value for --flash-attn: '{v}'")


def _cache_type(ctx: Ctx) -> str:
    if ctx.value not in KV_CACHE_TYPES:
        raise HandlerError(f"Unsupported cache type: {ctx.value}")
    return ctx.value


def h_cache_type_k(ctx: Ctx) -> None:
    ctx.args.cache_type_k = _cache_type(ctx)


def h_cache_type_v(ctx: Ctx) -> None:
    ctx.args.cache_type_v = _cache_type(ctx)


def h_kv_offload(ctx: Ctx) -> None:
    ctx.args.no_kv_offload = not ctx.use.positive


def h_swa_full(ctx: Ctx) -> None:
    ctx.args.swa_full = True


# --------------------------------------------------------------------------- loading / fit


def h_load_mode(ctx: Ctx) -> None:
    if ctx.value not in LOAD_MODES:
        raise HandlerError("invalid value")
    ctx.args.load_mode = ctx.value


def h_mmap(ctx: Ctx) -> None:
    ctx.mmap_flags.mmap = ctx.use.positive


def h_mlock(ctx: Ctx) -> None:
    ctx.mmap_flags.mlock = True


def h_direct_io(ctx: Ctx) -> None:
    ctx.mmap_flags.direct_io = ctx.use.positive


def h_fit(ctx: Ctx) -> None:
    if truthy(ctx.value):
        ctx.args.fit = True
    elif falsey(ctx.value):
        ctx.args.fit = False
    else:
        raise HandlerError(f"error: unknown value for --fit: '{ctx.value}'")


def h_fit_target(ctx: Ctx) -> None:
    parts = split_list(ctx.value)
    if len(parts) >= MAX_DEVICES:
        raise HandlerError(f"got {len(parts)} input configs, but system only has {MAX_DEVICES} devices")
    ctx.args.fit_target = [stoull(p) for p in parts]


def h_fit_ctx(ctx: Ctx) -> None:
    ctx.args.fit_ctx = int_value(ctx.value)


def h_op_offload(ctx: Ctx) -> None:
    ctx.args.no_op_offload = not ctx.use.positive


def h_no_host(ctx: Ctx) -> None:
    ctx.args.no_host = True


def h_repack(ctx: Ctx) -> None:
    ctx.args.no_repack = not ctx.use.positive


def h_verbosity(ctx: Ctx) -> None:
    ctx.args.verbosity = int_value(ctx.value)


def h_verbose(ctx: Ctx) -> None:
    ctx.args.verbosity = INT_MAX


def h_host(ctx: Ctx) -> None:
    ctx.args.host = ctx.value


def h_port(ctx: Ctx) -> None:
    ctx.args.port = int_value(ctx.value)


def c_override_kv(ctx: Ctx) -> None:
    """``--override-kv``: an item ``string_parse_kv_override`` refuses fails the flag (the line it prints
    is the explanation); the flag stays in the command as given (:mod:`core.kv_override` reads it)."""
    for item in items_of(ctx.value, ctx.dialect.kv_override_csv):
        override, printed = parse_item(item)
        if override is None:
            raise HandlerError(f"error: Invalid type for KV override: {item}", explanation=printed)


#: flags whose value is checked as the handler checks it, but kept verbatim (no ServerArgs field)
MAINLINE_CHECKS: dict[str, Handler] = {"--override-kv": c_override_kv}


MAINLINE_HANDLERS: dict[str, Handler] = {
    "--model": h_model,
    "--alias": h_alias,
    "--gpu-layers": h_gpu_layers,
    "--override-tensor": h_override_tensor,
    "--cpu-moe": h_cpu_moe,
    "--n-cpu-moe": h_n_cpu_moe,
    "--n-cpu-ffn": h_n_cpu_ffn,
    "--tensor-split": h_tensor_split,
    "--split-mode": h_split_mode,
    "--main-gpu": h_main_gpu,
    "--device": h_device,
    "--rpc": h_rpc,
    "--ctx-size": h_ctx_size,
    "--batch-size": h_batch,
    "--ubatch-size": h_ubatch,
    "--parallel": h_parallel,
    "--kv-unified": h_kv_unified,
    "--flash-attn": h_flash_attn,
    "--cache-type-k": h_cache_type_k,
    "--cache-type-v": h_cache_type_v,
    "--kv-offload": h_kv_offload,
    "--swa-full": h_swa_full,
    "--load-mode": h_load_mode,
    "--mmap": h_mmap,
    "--mlock": h_mlock,
    "--direct-io": h_direct_io,
    "--fit": h_fit,
    "--fit-target": h_fit_target,
    "--fit-ctx": h_fit_ctx,
    "--op-offload": h_op_offload,
    "--no-host": h_no_host,
    "--repack": h_repack,
    "--verbosity": h_verbosity,
    "--verbose": h_verbose,
    "--host": h_host,
    "--port": h_port,
}
