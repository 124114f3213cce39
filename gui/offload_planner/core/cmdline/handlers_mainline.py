"""What each placement-relevant flag does in mainline llama.cpp (``common/arg.cpp`` handlers).

A handler raises :class:`HandlerError` with the exception text the real handler throws; the
engine wraps it as ``error while handling argument "<flag>": <what>``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from offload_planner.core.cmdline.cnum import CNumberError, stof, stoi, stoull
from offload_planner.core.cmdline.context import Ctx, HandlerError
from offload_planner.core.cmdline.model import GPU_LAYERS_ALL, GPU_LAYERS_AUTO, ArgError, TensorOverride
from offload_planner.core.cmdline.moe import cpu_moe_overrides, n_cpu_ffn_overrides, n_cpu_moe_overrides

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
    """``std::sregex_token_iterator`` over ``[,/]+`` with -1: pieces between separators."""
    parts = re.split(r"[,/]+", text)
    if parts and parts[-1] == "":
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


def rpc_endpoint_problem(endpoint: str) -> tuple[str, str]:
    """(what is wrong, what the pinned llama-server does) for one ``--rpc`` entry; ``("", "")`` when
    its text is a usable HOST:PORT. ggml-rpc's ``parse_endpoint`` splits at the first ``:`` and reads
    the rest with ``std::stoi`` (else it aborts: ``Failed to parse endpoint``); ``socket_t::connect``
    resolves the host and connects to ``htons(port)``, the port modulo 65536 (``:99999`` is port
    34463), and ggml-rpc-server listens on ports 1-65535 only."""
    host, sep, tail = endpoint.partition(":")
    parse_failed = f"llama-server stops: Failed to parse endpoint: {endpoint}"
    if not endpoint:
        return "an empty entry; expected HOST:PORT", parse_failed
    if not sep:
        return "no port; expected HOST:PORT", parse_failed
    try:
        port = stoi(tail)
    except CNumberError as exc:
        return f"port '{tail}': {exc.reason}", parse_failed
    if not host:
        return "no host before ':'; expected HOST:PORT", "llama-server stops: Cannot resolve host ''"
    if not 1 <= port <= 65535:
        return (f"port {port} is outside 1-65535",
                f"llama-server would connect to port {port % 65536}; ggml-rpc-server listens on 1-65535 only")
    return "", ""


def h_rpc(ctx: Ctx) -> None:
    servers = string_split(ctx.value)
    for ep in servers:
        problem, server = rpc_endpoint_problem(ep)
        if problem:  # the server stops at the first such entry
            flag = ctx.use.env or ctx.use.spelling
            where = f"{flag}={ctx.value}" if ctx.use.env else f"{flag} {ep or repr(ep)}"
            server = ctx.dialect.rpc_entry_reaction(problem, server)
            ctx.parsed.errors.append(ArgError(flag, ep, f"{where}: {problem}", explanation=server))
            return
    ctx.args.rpc_servers = [*(ctx.args.rpc_servers or []), *servers]


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
