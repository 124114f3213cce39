"""What each placement-relevant flag does in ik_llama.cpp (``gpt_params_find_arg``).

ik refuses a value in two ways: ``invalid_param = true`` (printed as ``error: invalid parameter
for argument: <flag>``, sometimes after a line of its own) or an uncaught ``std::stoi``-style
exception (printed as its ``what()``: ``stoi``).  :class:`HandlerError` carries which one.
"""

from __future__ import annotations

import re

from offload_planner.core.cmdline.cnum import stof, stoi
from offload_planner.core.cmdline.context import Ctx, HandlerError
from offload_planner.core.cmdline.flags_ik import IK_KV_TYPES
from offload_planner.core.cmdline.handlers_mainline import (
    MAX_DEVICES,
    Handler,
    h_alias,
    h_host,
    h_main_gpu,
    h_model,
    h_rpc,
    split_list,
    string_split,
)
from offload_planner.core.cmdline.model import TensorOverride
from offload_planner.core.cmdline.moe import IK_CPU_MOE_COUNT
from offload_planner.core.kv_override import parse_item


def _invalid(stderr: str = "", explanation: str = "") -> HandlerError:
    return HandlerError("", invalid_param=True, stderr=stderr, explanation=explanation)


def _int(text: str) -> int:
    """``std::stoi``; its :class:`CNumberError` reaches the parser, which names the flag."""
    return stoi(text)


def _pairs(text: str, second: type[int] | type[float]) -> list[tuple[int, float]]:
    """``string_split_pairs<int, T>(value, ',')``: alternate items, each read with ``operator>>``."""
    out: list[tuple[int, float]] = []
    items = text.split(",")
    for k in range(0, len(items) - 1, 2):
        a = re.match(r"\s*[+-]?[0-9]+", items[k], re.ASCII)
        b = re.match(
            r"\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?" if second is float else r"\s*[+-]?[0-9]+",
            items[k + 1],
            re.ASCII,
        )
        out.append((int(a.group(0)) if a else 0, second(b.group(0)) if b else 0))
    return out


def h_gpu_layers(ctx: Ctx) -> None:
    ctx.args.n_gpu_layers = _int(ctx.value)


def h_flash_attn(ctx: Ctx) -> None:
    v = ctx.value.lower()
    if v in ("auto", "1", "on"):
        ctx.args.flash_attn = "on"  # ik has no auto: it means on
    elif v in ("off", "0"):
        ctx.args.flash_attn = "off"
    else:
        raise _invalid()


def h_no_flash_attn(ctx: Ctx) -> None:
    ctx.args.flash_attn = "off"


def h_split_mode(ctx: Ctx) -> None:
    if ctx.value not in ctx.dialect.split_modes:
        raise _invalid(explanation="ik_llama.cpp split modes: none, layer, attn, graph (no row)")
    ctx.args.split_mode = ctx.value


def h_tensor_split(ctx: Ctx) -> None:
    parts = split_list(ctx.value)  # the same regex split as mainline's (common/common.cpp)
    if len(parts) >= MAX_DEVICES:
        raise _invalid()
    ctx.args.tensor_split = [stof(p) for p in parts]


def h_override_tensor(ctx: Ctx) -> None:
    entries: list[TensorOverride] = []
    for item in string_split(ctx.value):
        pattern, eq, buft = item.partition("=")
        if not eq:
            raise _invalid(f"Invalid buft override argument {ctx.value}")
        entries.append(TensorOverride(pattern, buft, "-ot", ctx.use.index))
    ctx.args.overrides.extend(entries)
    for entry in entries:
        ctx.check_override_pattern(entry.pattern)


def h_cpu_moe(ctx: Ctx) -> None:
    ctx.args.cpu_moe = True
    ctx.args.n_cpu_moe = IK_CPU_MOE_COUNT


def h_n_cpu_moe(ctx: Ctx) -> None:
    n = _int(ctx.value)
    if n < 0:
        raise _invalid(f"error: Invalid value for --n-cpu-moe: {n} (must be >= 0)")
    ctx.args.n_cpu_moe = n


def h_device(ctx: Ctx) -> None:
    if ctx.value == " " or "-" in ctx.value:
        raise HandlerError("no devices specified")
    names = string_split(ctx.value)
    ctx.args.devices = ["none"] if names == ["none"] else names


def _set_int(field: str) -> Handler:
    def handler(ctx: Ctx) -> None:
        setattr(ctx.args, field, _int(ctx.value))

    return handler


def _set_true(field: str, value: bool = True) -> Handler:
    def handler(ctx: Ctx) -> None:
        setattr(ctx.args, field, value)

    return handler


def h_amb(ctx: Ctx) -> None:
    n = _int(ctx.value)
    if 0 < n < 128:
        ctx.warn(f"XXXXXXXXXXXXXXXXXXXXXXXXXXXXXX amb = {n} is too low. Changing to 128", ctx.value)
        n = 128
    ctx.args.amb = n


def h_ser(ctx: Ctx) -> None:
    pairs = _pairs(ctx.value, float)
    if len(pairs) != 1:
        raise _invalid()
    ctx.args.ser = (pairs[0][0], float(pairs[0][1]))
    flag = f"{ctx.use.spelling} {ctx.value}"
    if not getattr(ctx.dialect, "applies_ser", True):
        ctx.warn(f"{flag} does nothing in ik_llama.cpp builds since PR 840 (October 2025): the expert "
                 "selection no longer reads it (ggml_top_k; its ggml_top_k_thresh call is commented out), "
                 "so every token runs the model's experts, as the plan and the speed estimate count them",
                 ctx.value)
    else:
        ctx.warn(f"{flag}: this build drops the experts whose router weight is under the threshold x the "
                 "top one's, down to the minimum, token by token; the speed estimate does not model it (it "
                 "counts every expert a token may run)", ctx.value)


def c_override_kv(ctx: Ctx) -> None:
    """``-okv``/``--override-kv``: one ``KEY=TYPE:VALUE`` (common.cpp); an item it refuses prints two lines
    and sets ``invalid_param``; the flag stays in the command as given."""
    override, printed = parse_item(ctx.value)
    if override is None:
        raise _invalid(stderr=f"{printed}\nerror: Invalid type for KV override: {ctx.value}")


#: flags whose value is checked as ik checks it, but kept verbatim (no ServerArgs field)
IK_CHECKS: dict[str, Handler] = {"--override-kv": c_override_kv}


def h_cache_type(field: str) -> Handler:
    def handler(ctx: Ctx) -> None:
        # A type ik refuses is reported by the parser (a load error); the projection keeps f16.
        if ctx.value in IK_KV_TYPES:
            setattr(ctx.args, field, ctx.value)

    return handler


def h_layer_cache_type(field: str) -> Handler:
    def handler(ctx: Ctx) -> None:
        parts = ctx.value.split(",")
        if len(parts) != 2:
            raise _invalid()
        setattr(ctx.args, field, (parts[0], _int(parts[1])))

    return handler


def h_no_mmap(ctx: Ctx) -> None:
    ctx.mmap_flags.mmap = False


def h_mlock(ctx: Ctx) -> None:
    ctx.mmap_flags.mlock = True


def h_rtr(ctx: Ctx) -> None:
    ctx.args.rtr = True
    ctx.mmap_flags.mmap = False


def h_fit_margin(ctx: Ctx) -> None:
    n = _int(ctx.value)
    if n < 0:
        raise _invalid(f"error: Invalid value for --fit-margin: {n} (must be >= 0)")
    ctx.args.fit_margin = n


def h_gpu_fit_margin(ctx: Ctx) -> None:
    pairs = _pairs(ctx.value, int)
    if not pairs:
        raise _invalid(f"error: invalid GPU split margin argument: {ctx.value}")
    ctx.args.gpu_fit_margin = [*(ctx.args.gpu_fit_margin or []), *((a, int(b)) for a, b in pairs)]


def h_offload_policy(ctx: Ctx) -> None:
    pairs = _pairs(ctx.value, int)
    if not pairs:
        raise _invalid(f"error: Invalid offload policy argument: {ctx.value}")
    ctx.args.offload_policy = [*(ctx.args.offload_policy or []), *((a, int(b)) for a, b in pairs)]


def h_cuda(ctx: Ctx) -> None:
    ctx.args.cuda_params = ctx.value


def h_reduce_type(value: str | None) -> Handler:
    def handler(ctx: Ctx) -> None:
        ctx.args.reduce_type = value if value is not None else ctx.value

    return handler


def h_verbose(ctx: Ctx) -> None:
    ctx.args.verbosity = 1


def h_port(ctx: Ctx) -> None:
    ctx.args.port = _int(ctx.value)


#: Flags whose value ik reads with std::stoi (the rest of the value is ignored, as in ``-c 32k``).
IK_INT_FLAGS = frozenset({
    "--gpu-layers", "--n-cpu-moe", "--main-gpu", "--ctx-size", "--batch-size", "--ubatch-size",
    "--parallel", "--fit-margin", "--mla-use", "--attention-max-batch", "--max-gpu",
    "--worst-graph-tokens", "--verbosity", "--port", "--gpu-layers-draft", "--ctx-size-draft",
})

IK_HANDLERS: dict[str, Handler] = {
    "--model": h_model,
    "--alias": h_alias,
    "--gpu-layers": h_gpu_layers,
    "--override-tensor": h_override_tensor,
    "--cpu-moe": h_cpu_moe,
    "--n-cpu-moe": h_n_cpu_moe,
    "--tensor-split": h_tensor_split,
    "--split-mode": h_split_mode,
    "--main-gpu": h_main_gpu,
    "--device": h_device,
    "--rpc": h_rpc,
    "--ctx-size": _set_int("ctx_size"),
    "--batch-size": _set_int("batch_size"),
    "--ubatch-size": _set_int("ubatch_size"),
    "--parallel": _set_int("n_parallel"),
    "--flash-attn": h_flash_attn,
    "--no-flash-attn": h_no_flash_attn,
    "--cache-type-k": h_cache_type("cache_type_k"),
    "--cache-type-v": h_cache_type("cache_type_v"),
    "--cache-type-k-first": h_layer_cache_type("cache_type_k_first"),
    "--cache-type-k-last": h_layer_cache_type("cache_type_k_last"),
    "--cache-type-v-first": h_layer_cache_type("cache_type_v_first"),
    "--cache-type-v-last": h_layer_cache_type("cache_type_v_last"),
    "--no-kv-offload": _set_true("no_kv_offload"),
    "--no-mmap": h_no_mmap,
    "--mlock": h_mlock,
    "--run-time-repack": h_rtr,
    "--fit": _set_true("fit"),
    "--fit-margin": h_fit_margin,
    "--gpu-fit-margin": h_gpu_fit_margin,
    "--mla-use": _set_int("mla"),
    "--attention-max-batch": h_amb,
    "--smart-expert-reduction": h_ser,
    "--no-fused-moe": _set_true("fused_moe", False),
    "--merge-qkv": _set_true("merge_qkv"),
    "--merge-up-gate-experts": _set_true("merge_up_gate_exps"),
    "--k-cache-hadamard": _set_true("k_cache_hadamard"),
    "--v-cache-hadamard": _set_true("v_cache_hadamard"),
    "--no-offload-only-active-experts": _set_true("only_active_experts", False),
    "--offload-policy": h_offload_policy,
    "--cuda-params": h_cuda,
    "--max-gpu": _set_int("max_gpu"),
    "--graph-reduce-type": h_reduce_type(None),
    "--split-mode-f16": h_reduce_type("f16"),
    "--split-mode-f32": h_reduce_type("f32"),
    "--worst-graph-tokens": _set_int("worst_graph_tokens"),
    "--verbosity": _set_int("verbosity"),
    "--verbose": h_verbose,
    "--host": h_host,
    "--port": h_port,
}
