"""Refusals that depend on the devices or the model, and silent adjustments worth showing.

Buffer-type names for ``-ot`` (verified with the pinned binary, ``ggml-rpc-server`` and
``llama-server --rpc``): ``CPU`` and each device's own name (``CUDA0``, ``Vulkan0``, ...), except RPC:
a device listed as ``RPC0`` by ``--list-devices`` has the buffer type ``RPC<i>[host:port]``, where
``<i>`` is the device's index *on that server* (``RPC0[127.0.0.1:50052]`` for a one-device server,
whatever its global number).  ``-dev`` takes the global name (``RPC0``, ``RPC1``, ...).  Both only
exist once ``--rpc`` has been read, so on the command line ``--rpc`` must come first.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from offload_planner.core.cmdline.model import (
    ArgError,
    ArgWarning,
    FlagUse,
    ParsedArgs,
    ServerArgs,
    Stage,
    TensorOverride,
)
from offload_planner.core.dialects.base import Dialect

_UNQUANTIZED = ("f32", "f16", "bf16")
_RPC_HINT = "RPC buffer types are named RPC<i>[host:port], e.g. RPC0[127.0.0.1:50052]"


def rpc_buffer_type_names(
    rpc_servers: Sequence[str], devices_per_server: Sequence[int] | None = None
) -> list[str]:
    """``-ot`` names of the devices behind ``--rpc`` servers (one device each unless told)."""
    counts = list(devices_per_server) if devices_per_server is not None else [1] * len(rpc_servers)
    return [f"RPC{i}[{ep}]" for ep, n in zip(rpc_servers, counts, strict=True) for i in range(n)]


def rpc_device_names(
    rpc_servers: Sequence[str], devices_per_server: Sequence[int] | None = None
) -> list[str]:
    """``--list-devices`` / ``-dev`` names of the RPC devices: numbered across all servers."""
    counts = list(devices_per_server) if devices_per_server is not None else [1] * len(rpc_servers)
    return [f"RPC{i}" for i in range(sum(counts))]


@dataclass(frozen=True)
class _Known:
    bufts: frozenset[str]
    rpc_bufts: frozenset[str]
    devices: frozenset[str]
    rpc_devices: frozenset[str]
    rpc_index: int  # argv index of the first --rpc (-1: from the environment or absent)


def _known(parsed: ParsedArgs, device_names: Sequence[str]) -> _Known:
    rpc = parsed.args.rpc_servers or []
    rpc_bufts = set(rpc_buffer_type_names(rpc))
    rpc_devs = set(rpc_device_names(rpc))
    local = {d for d in device_names if not d.startswith("RPC")}
    rpc_bufts |= {d for d in device_names if d.startswith("RPC") and "[" in d}
    rpc_devs |= {d for d in device_names if d.startswith("RPC") and "[" not in d}
    if parsed.dialect.rpc_dev_by_buffer_type:
        rpc_devs = set(rpc_bufts)
    if parsed.dialect.rpc_bufts_by_endpoint:
        rpc_bufts |= {f"RPC[{ep}]" for ep in rpc}
    first_rpc = next((u.index for u in parsed.flags if u.key == "--rpc" and u.env is None), -1)
    return _Known(
        frozenset({"CPU", *local}), frozenset(rpc_bufts), frozenset(local), frozenset(rpc_devs), first_rpc
    )


def _override_error(parsed: ParsedArgs, ov: TensorOverride, explanation: str) -> ArgError:
    env = "LLAMA_ARG_OVERRIDE_TENSOR" if ov.source == "-ot" else "LLAMA_ARG_SPEC_DRAFT_OVERRIDE_TENSOR"
    flag = env if ov.index == -1 else _spelling_at(parsed, ov.index, ov.source)
    value = f"{ov.pattern}={ov.buft}"
    if parsed.dialect.generic_arg_errors:
        message = f"error: invalid parameter for argument: {flag}"
    elif ov.index == -1:
        message = f'error while handling environment variable "{flag}": unknown buffer type'
    else:
        message = f'error while handling argument "{flag}": unknown buffer type'
    return ArgError(flag, value, message, Stage.PARSE, explanation)


def _spelling_at(parsed: ParsedArgs, index: int, default: str) -> str:
    return next((u.spelling for u in parsed.flags if u.index == index), default)


def _check_overrides(parsed: ParsedArgs, known: _Known) -> list[ArgError]:
    errors: list[ArgError] = []
    listing = ", ".join(sorted(known.bufts | known.rpc_bufts))
    for ov in [*parsed.args.overrides, *parsed.args.draft.overrides]:
        if ov.source not in ("-ot", "-otd"):
            continue
        if ov.buft in known.bufts:
            continue
        if ov.buft in known.rpc_bufts:
            before_rpc = known.rpc_index >= 0 and 0 <= ov.index < known.rpc_index
            if parsed.dialect.rpc_before_ot and before_rpc:
                errors.append(
                    _override_error(parsed, ov, "--rpc must come before the -ot that names its device")
                )
            continue
        hint = f"; {_RPC_HINT}" if ov.buft.startswith("RPC") else _metal_hint(parsed, ov.buft, known)
        errors.append(_override_error(parsed, ov, f"available buffer types: {listing}{hint}"))
    return errors


def _device_use(parsed: ParsedArgs, key: str) -> tuple[list[str], FlagUse | None]:
    """The names ``-dev`` (``key="--spec-draft-device"``: the draft model's ``-devd``;
    ``"--mmproj-device"``: ``-mmdev``) gives ([] for none or ``none``) and the flag that gave them."""
    if key == "--mmproj-device":  # read by the server whether or not a projector is given
        use = next((u for u in reversed(parsed.flags) if u.key == key), None)
        names = use.values[0].split(",") if use is not None and use.values else []  # string_split
        return ([], None) if not names or names == ["none"] else (names, use)
    devices = parsed.args.devices if key == "--device" else parsed.args.draft.devices
    if not devices or devices == ["none"]:
        return [], None
    keys = (key,) if key == "--device" else _DRAFT_DEVICE_KEYS
    return list(devices), next((u for u in reversed(parsed.flags) if u.key in keys), None)


#: the draft model's ``-devd`` as the pinned build and ik name it
_DRAFT_DEVICE_KEYS = ("--spec-draft-device", "--device-draft")


def _has_device(parsed: ParsedArgs, known: _Known, name: str, use: FlagUse | None) -> bool:
    """The build has a device of that ``-dev`` name.  An RPC device only exists once ``--rpc`` has been
    read where the names are looked up while parsing (the pinned build); a build that looks them up at
    load (one that skips an unknown name, ik) takes them in any order, among its offload devices only
    (ik: the GPUs' buffer types, src/llama.cpp 7795-7801; the CPU only in a build without a GPU)."""
    if not parsed.dialect.skips_unknown_devices:  # parse_device_list refuses a CPU-type device too
        rpc_ok = name in known.rpc_devices and _after_rpc(use, known)
        return name != "CPU" and (name in known.devices or rpc_ok)
    return name in _load_time_names(known)


def _load_time_names(known: _Known) -> frozenset[str]:
    """ik's offload devices: the CPU only in a build without a GPU (which lists it as its one device)."""
    offload = known.devices - {"CPU"} if len(known.devices) > 1 else known.devices
    return offload | known.rpc_devices


def _check_devices(parsed: ParsedArgs, known: _Known, key: str = "--device") -> list[ArgError]:
    """``-dev`` names (``key="--spec-draft-device"``: the draft model's ``-devd``; ``"--mmproj-device"``:
    ``-mmdev``, one device only) the build refuses while parsing (the pinned build, at the first name
    it cannot use; ik skips them at load: :func:`skipped_devices`)."""
    if parsed.dialect.skips_unknown_devices:
        return _repeated_device(parsed, known, key)
    devices, use = _device_use(parsed, key)
    flag = use.env or use.spelling if use else "-dev"
    for name in devices:
        if _has_device(parsed, known, name, use):
            continue
        hint = "; --rpc must come first" if name in known.rpc_devices else _metal_hint(parsed, name, known)
        listing = sorted((known.devices | known.rpc_devices) - {"CPU"})
        return [_device_error(parsed, use, flag, f"invalid device: {name}", name,
                              f"known devices: {listing}{hint}")]
    if key == "--mmproj-device" and len(devices) > 1:
        return [_device_error(parsed, use, flag, "only one device may be specified for mmproj",
                              ",".join(devices), "-mmdev takes one device")]
    return []


def _repeated_device(parsed: ParsedArgs, known: _Known, key: str) -> list[ArgError]:
    """A ``-dev``/``-devd`` list naming one of ik_llama.cpp's GPU (or RPC) devices twice, refused
    (:func:`~offload_planner.core.ik.repeated_device_refusal`).  The CPU of a build without a GPU, its
    one offload device, is not a backend the context reorders: ``-dev CPU,CPU`` loads as ``-dev CPU``
    (ik's CPU library, same buffers)."""
    from offload_planner.core.ik import repeated_device_refusal, repeated_gpu

    if key == "--mmproj-device" or not parsed.dialect.refuses_repeated_devices:
        return []
    devices, use = _device_use(parsed, key)
    twice = repeated_gpu(devices, _load_time_names(known) - {"CPU"})
    if twice is None:
        return []
    flag = use.env or use.spelling if use else "-dev"
    value = ",".join(devices)
    return [ArgError(flag, value, repeated_device_refusal(flag, value, twice), Stage.LOAD,
                     f"name each device once: {flag} " + ",".join(dict.fromkeys(devices)))]


def _device_error(parsed: ParsedArgs, use: FlagUse | None, flag: str, what: str, value: str,
                  explanation: str) -> ArgError:
    if parsed.dialect.generic_arg_errors:
        message = what
    elif use is not None and use.env is not None:
        message = f'error while handling environment variable "{use.env}": {what}'
    else:
        message = f'error while handling argument "{flag}": {what}'
    return ArgError(flag, value, message, Stage.PARSE, explanation)


def skipped_devices(parsed: ParsedArgs, device_names: Sequence[str]) -> list[ArgWarning]:
    """``-dev``/``-devd`` names a build has no device of and skips at load instead of refusing them
    (ik_llama.cpp: :meth:`Dialect.skipped_devices_note`), one warning per flag in the build's words;
    [] for a build that refuses them (:func:`check_semantics` does)."""
    if not parsed.dialect.skips_unknown_devices:
        return []
    known = _known(parsed, [parsed.dialect.server_device_name(n) for n in device_names])
    out: list[ArgWarning] = []
    for key in ("--device", "--spec-draft-device"):
        devices, use = _device_use(parsed, key)
        skipped = [n for n in devices if not _has_device(parsed, known, n, use)]
        if skipped:
            note = parsed.dialect.skipped_devices_note(skipped, any_left=len(skipped) < len(devices),
                                                       draft=key != "--device")
            flag = (use.env or use.spelling) if use else "-dev"
            value = ",".join(devices)
            hint = next((h for n in skipped if (h := _metal_hint(parsed, n, known))), "")
            out.append(ArgWarning(flag, value, f"{flag} {value}: {note}",
                                  f"its devices: {', '.join(sorted(_load_time_names(known)))}{hint}"))
    return out


_DEVICE_KEYS = ("--device", "--spec-draft-device", "--mmproj-device")


def _canonical_devices(parsed: ParsedArgs, known: _Known) -> None:
    """A build that matches ``-dev`` names ignoring case resolves ``cuda0`` to its ``CUDA0``: the
    parsed names and the flags kept for the command take the device's own spelling (in place)."""
    if not parsed.dialect.device_names_ignore_case:
        return
    names = {n.lower(): n for n in sorted(known.devices | known.rpc_devices)}

    def fix(value: str) -> str:
        return value if value == "none" else ",".join(names.get(v.lower(), v) for v in value.split(","))

    args = parsed.args
    if args.devices:
        args.devices = [fix(n) for n in args.devices]
    if args.draft.devices:
        args.draft.devices = [fix(n) for n in args.draft.devices]
    parsed.flags[:] = [
        replace(f, values=tuple(map(fix, f.values))) if f.key in _DEVICE_KEYS else f for f in parsed.flags
    ]


def _metal_hint(parsed: ParsedArgs, name: str, known: _Known) -> str:
    """A Metal device named as another build names it (``Metal0`` for the pinned build's ``MTL0``,
    ``MTL0`` for a 2025 build's ``Metal``): what this build calls it."""
    if not re.fullmatch(r"(?i)(metal|mtl)\d*", name):
        return ""
    metal = sorted(n for n in known.devices if parsed.dialect.planner_device_name(n).startswith("MTL"))
    return f"; this build names its Metal device {' or '.join(metal)}" if metal else ""


def _after_rpc(use: FlagUse | None, known: _Known) -> bool:
    return use is None or use.index < 0 or known.rpc_index < 0 or use.index > known.rpc_index


def mainline_context_errors(parsed: ParsedArgs, is_mla: bool, device_names: Sequence[str]) -> list[ArgError]:
    args = parsed.args
    errors: list[ArgError] = []
    type_k = args.cache_type_k or "f16"
    type_v = args.cache_type_v or "f16"
    if args.split_mode == "tensor" and args.flash_attn == "off":
        errors.append(
            _load(
                "-sm", "tensor", "llama_init_from_model: SPLIT_MODE_TENSOR requires flash_attn to be enabled"
            )
        )
    if is_mla and type_k != type_v:
        msg = (
            f"llama_init_from_model: model does not support different K ({type_k}) "
            f"and V ({type_v}) cache types"
        )
        errors.append(_load("-ctv", type_v, msg))
    if type_v not in _UNQUANTIZED and args.flash_attn == "off":
        errors.append(
            _load(
                "-ctv", type_v, "llama_init_from_model: quantized V cache requires flash_attn to be enabled"
            )
        )
    max_seq = parsed.dialect.max_seq
    if max_seq and args.n_parallel is not None and args.n_parallel > max_seq:
        use = next((u for u in reversed(parsed.flags) if u.key == "--parallel"), None)
        flag = (use.env or use.spelling) if use else "-np"
        errors.append(ArgError(flag, str(args.n_parallel), "llama_init_from_model: failed to initialize the "
                               f"context: n_seq_max must be <= {max_seq}", Stage.LOAD,
                               f"{flag} {args.n_parallel}: llama.cpp takes at most {max_seq} sequences "
                               "(LLAMA_MAX_SEQ); llama-server exits"))
    cuda = [d for d in device_names if d.startswith("CUDA")]
    if args.split_mode == "row" and cuda and parsed.dialect.refuses_cuda_row_split:
        msg = f"llama_model_load: error loading model: device {cuda[0]} does not support split buffers"
        errors.append(_load("-sm", "row", msg))
    gpus = [d for d in (args.devices or device_names) if d != "none"]
    if args.split_mode == "none" and args.main_gpu is not None and gpus and args.main_gpu >= len(gpus):
        msg = (
            f"llama_prepare_model_devices: invalid value for main_gpu: {args.main_gpu} "
            f"(available devices: {len(gpus)})"
        )
        errors.append(_load("-mg", str(args.main_gpu), msg))
    return errors


def ik_context_errors(parsed: ParsedArgs, device_names: Sequence[str], *,
                      splits: bool = True) -> list[ArgError]:
    """``splits``: the model's architecture is one ik splits by graph (else ik changes ``-sm graph``/
    ``attn`` to ``layer`` and loads: src/llama.cpp 4225-4241 at 8337e4cd).  The model's devices are
    the GPUs (``-dev``'s, else every one), never the CPU: with fewer than two ik throws (4369-4372)."""
    args = parsed.args
    errors: list[ArgError] = []
    gpus = [d for d in (args.devices or device_names) if d not in ("none", "CPU")]
    if args.split_mode in ("graph", "attn") and splits and len(gpus) < 2:
        errors.append(_load("-sm", args.split_mode,
                            "It is not possible to use split mode 'graph' with less than 2 devices"))
    if args.fit and (args.n_cpu_moe is not None or any(o.source == "-ot" for o in args.overrides)):
        errors.append(_load("--fit", None, "Manual tensor overrides cannot be used with --fit"))
    type_v = args.cache_type_v or "f16"
    if type_v not in _UNQUANTIZED and args.flash_attn == "off":
        errors.append(_load("-ctv", type_v, "V cache quantization requires flash_attn"))
    from offload_planner.core.cmdline.ik_draft_params import draft_params_errors

    params = draft_params_errors(parsed)
    return errors + (params or _ik_draft_v_cache(parsed))


def _ik_draft_v_cache(parsed: ParsedArgs) -> list[ArgError]:
    """ik's ``common_model_params_to_llama(params_dft)`` throws for a quantized V cache without flash
    attention (common/common.cpp 4303-4305) while the server loads the draft (common/speculative.cpp
    1989): the draft's V type is ``-ctvd``, else the main ``-ctv`` (1953), and its ``-fa`` the main one,
    each then set again by the environment and ``-draft "ARGS"`` (1957-1966: ``draft_server_args``).
    The main context's own refusal of the same pair is the main command's."""
    from offload_planner.core.cmdline.ik_draft_params import draft_params_flag, loaded_draft_model

    args = parsed.args
    if not (loaded_draft_model(parsed) and set(args.draft.types) & parsed.dialect.draft_model_types):
        return []
    dargs = parsed.dialect.draft_server_args(args, args.draft, False)
    draft_v = dargs.cache_type_v or "f16"
    if draft_v in _UNQUANTIZED or dargs.flash_attn != "off":
        return []
    message = "Quantized V cache cannot be used without flash attention"
    if args.draft.cache_type_v == draft_v and args.flash_attn == "off":
        return [_load("-ctvd", draft_v, message)]
    if (args.cache_type_v or "f16") == draft_v and args.flash_attn == "off":
        return []  # refused for the main context already ("V cache quantization requires flash_attn")
    flag = draft_params_flag(parsed)  # the V type or -fa off came from the environment or ARGS
    return [ArgError(flag, args.draft.params, message, Stage.LOAD,
                     f"the draft's V cache {draft_v} with -fa off, as {flag} \"{args.draft.params}\" leaves "
                     "them (-ctvd, else -ctv, then the LLAMA_ARG_* variables and ARGS): ik_llama.cpp stops "
                     "while it loads the draft model")]


def _tensor_split_errors(parsed: ParsedArgs, device_names: Sequence[str]) -> list[ArgError]:
    """``-ts``: llama.cpp reads the proportions with std::stof, which accepts ``nan``, ``inf`` and
    negatives, and checks nothing. It takes one per device, divides each running sum by the total
    and picks a layer's device with ``upper_bound`` (``llama-model.cpp``): a NaN or infinite value
    makes the split points NaN, no point is above the layer's fraction, the index is one past the
    last device and ``devices.at()`` throws, so the model does not load; a negative one breaks the
    increasing order ``upper_bound`` needs (layers go to unintended devices, or loading fails).
    With ``-ngl 0`` no layer looks at the split points, and nothing fails."""
    split = parsed.args.tensor_split
    gpus = [d for d in (parsed.args.devices or device_names) if d not in ("none", "CPU")]
    if not split or not gpus or parsed.args.n_gpu_layers == 0:  # -ngl 0: no layer asks for a device
        return []
    used = split[: len(gpus)]
    use = next((u for u in reversed(parsed.flags) if u.key == "--tensor-split"), None)
    flag = (use.env or use.spelling) if use else "-ts"
    value = use.values[0] if use and use.values else ",".join(map(str, split))
    n = len(gpus)
    if any(math.isnan(v) or math.isinf(v) for v in used):
        # the pinned build's words, checked with one and two RPC devices
        message = (f"llama_model_load: error loading model: vector::_M_range_check: __n (which is {n}) >= "
                   f"this->size() (which is {n})")
        message = parsed.dialect.bad_split_message or message
        return [ArgError(flag, value, message, Stage.LOAD,
                         f"{flag} {value}: a NaN or infinite proportion: llama.cpp accepts it, every split "
                         "point becomes NaN and no layer finds a device; give finite proportions, e.g. 3,1")]
    if any(v < 0 for v in used):
        return [ArgError(flag, value, f"{flag} {value}: a negative proportion", Stage.LOAD,
                         "llama.cpp does not check it: the split points stop increasing or are divided by a "
                         "sum of 0, so layers skip a device (-ts -1,2 puts every layer on the second) or the "
                         "model fails to load (-ts 1,-1); give proportions >= 0 such as 3,1")]
    return []


def _zero_batch_errors(parsed: ParsedArgs) -> list[ArgError]:
    """``-b 0``: with ``-ub 0`` every build refuses the context (``llama_init_from_model``); alone, a
    build that raises a small batch to its KQ mask padding (:attr:`Dialect.batch_floor`: ik, 2025
    mainline) runs it, and the pinned build makes ``n_ubatch = min(n_batch, -ub)`` 0 and aborts while it
    creates the context (seen on the real server, ``tests/integration/test_batch_zero.py``)."""
    args = parsed.args
    if args.batch_size != 0:
        return []
    use = next((u for u in reversed(parsed.flags) if u.key == "--batch-size"), None)
    flag = (use.env or use.spelling) if use else "-b"
    if args.ubatch_size == 0:
        return [ArgError(flag, "0", "llama_init_from_model: n_batch and n_ubatch cannot both be zero",
                         Stage.LOAD, f"{flag} 0 with -ub 0: llama-server exits without a context")]
    if parsed.dialect.batch_floor:
        return []
    return [ArgError(flag, "0", "GGML_ASSERT(n_outputs >= 1) failed", Stage.LOAD,
                     f"{flag} 0: n_batch and n_ubatch = min(n_batch, -ub) are 0 tokens and llama-server "
                     "aborts while it creates the context; give -b 1 or more")]


def _load(flag: str, value: str | None, message: str) -> ArgError:
    return ArgError(flag, value, message, Stage.LOAD)


def check_semantics(
    parsed: ParsedArgs | ServerArgs,
    device_names: Sequence[str],
    *,
    is_mla: bool = False,
    dialect: Dialect | None = None,
    arch: str | None = None,
) -> list[ArgError]:
    """Refusals that need the device list (``CUDA0``, ``Vulkan0``, ``RPC0``...; RPC devices from
    ``--rpc`` are added automatically) or the model (``is_mla``: the model uses MLA attention).

    A build that matches ``-dev`` names ignoring case (``Dialect.device_names_ignore_case``) gets
    them rewritten, in ``parsed``, to the device's own spelling first.

    Takes a :class:`ParsedArgs` (best: it knows flag spellings and argv order, needed for the
    ``--rpc``-before-``-ot`` check) or a bare :class:`ServerArgs` with ``dialect``.
    Covers: ``-ot`` buffer types and ``-dev`` names (refused while parsing), quantized V with
    ``-fa off``, MLA with ``-ctk != -ctv``, ``-sm row`` on CUDA (pinned build), ``-sm tensor`` with
    ``-fa off``, ``-mg`` out of range with ``-sm none``; ik: ``-sm graph`` on one device (``arch``: the
    model's architecture; one ik splits that way, or unknown), ``--fit``
    with manual overrides.  Wording is the binary's (pinned build: verified for the buffer type,
    quantized V and ``-dev`` errors; the others are format strings from the sources).
    """
    if isinstance(parsed, ServerArgs):
        parsed = ParsedArgs(dialect=Dialect(dialect or Dialect.LLAMA_CPP), args=parsed)
    device_names = [parsed.dialect.server_device_name(n) for n in device_names]  # MTL0: Metal in ik
    known = _known(parsed, device_names)
    _canonical_devices(parsed, known)
    errors = _check_overrides(parsed, known) + _check_devices(parsed, known)
    errors += _check_devices(parsed, known, "--spec-draft-device")
    errors += _check_devices(parsed, known, "--mmproj-device")
    errors += _tensor_split_errors(parsed, device_names) + _zero_batch_errors(parsed)
    return errors + parsed.dialect.context_errors(parsed, is_mla, device_names, arch)


def ignored_draft_devices(parsed: ParsedArgs) -> list[ArgWarning]:
    """``-devd`` with no draft model loaded: the devices are checked while parsing and then never read.
    The pinned build reads them only with a draft model (``has_dft()``: ``-md`` or ``-hfd``, common/
    common.h 391-393; ``common_base_params_to_speculative``, common/speculative.cpp 2537-2541: an MTP
    context lives on the main model); ik only while it loads the draft (``has_dft()`` and a stage that
    ``needs_dft_model()``, common/speculative.cpp 1942-1950 and 2110-2122 at 8337e4cd)."""
    args = parsed.args
    use = next((u for u in reversed(parsed.flags) if u.key in _DRAFT_DEVICE_KEYS), None)
    if use is None or any(u.key == "--spec-draft-hf" for u in parsed.flags):
        return []
    dialect = parsed.dialect
    stages = set(args.draft.types)
    # ik's has_dft(): -md or -draft "ARGS" (whose own -m may name the draft: common/common.h 265-267)
    has_dft = bool(args.draft.model or args.draft.params)
    loads = has_dft and (dialect.loads_idle_draft or bool(stages & dialect.draft_model_types)
                         or dialect.mtp_spec_type in stages)
    if loads:
        return []
    flag = use.env or use.spelling
    value = use.values[0] if use.values else ""
    why = ("the command has no draft model (-md)" if not args.draft.model else
           "no --spec-type stage loads the draft model")
    return [ArgWarning(flag, value, f"{flag} {value} is ignored: {why}, and llama-server reads the draft's "
                       "devices only when it loads one")]


def semantic_notes(parsed: ParsedArgs) -> list[ArgWarning]:
    """Values llama.cpp adjusts silently (no message): shown so an exported command is not misread."""
    args = parsed.args
    from offload_planner.core.cmdline.ik_draft_params import draft_params_notes

    notes: list[ArgWarning] = ignored_draft_devices(parsed) + draft_params_notes(parsed)
    batch = args.batch_size if args.batch_size is not None else 2048
    if args.ubatch_size is not None and args.ubatch_size > batch:
        notes.append(
            ArgWarning(
                "-ub",
                str(args.ubatch_size),
                f"-ub {args.ubatch_size} is larger than -b {batch}: llama.cpp silently uses "
                f"n_ubatch = {batch} (n_ubatch = min(n_batch, n_ubatch))",
            )
        )
    split = args.tensor_split
    if split and not any(split):
        notes.append(
            ArgWarning(
                "-ts",
                ",".join(f"{v:g}" for v in split),
                "-ts: every proportion is 0, which llama.cpp reads as no split given: layers are "
                "split by each device's free memory (its default)",
            )
        )
    return notes
