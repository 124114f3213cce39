"""``--device``, ``--depth`` and ``--spec-accept``: options shared by ``plan``, ``fit`` (and, for
``--device``, ``launch`` and ``gui``)."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING, Any

from offload_planner.core.errors import PlannerError
from offload_planner.core.speed.acceptance import Acceptance

if TYPE_CHECKING:
    from offload_planner.core.devices import DeviceSet

DEFAULT_UB, DEFAULT_B = 512, 2048  # llama.cpp's -ub and -b defaults


DEVICE_METAVAR = "NAME=SIZE|CARD[,key=value]"


def add_device_option(p: argparse.ArgumentParser, what: str = "declare a device") -> None:
    """``--device``, the same words in every command that takes it."""
    p.add_argument("--device", action="append", default=[], metavar=DEVICE_METAVAR,
                   help=f"{what} (repeatable), e.g. CUDA0=24GiB, CUDA0=rtx3090 or CPU=256GiB. NAME: "
                   "CPU, CUDA0, ROCm0, Vulkan0, MTL0, RPC0, ... SIZE needs its unit: 24GiB = 24G, "
                   "24GB, 8000MiB, 1TiB, 4096B. CARD: a GPU of the catalogue (rtx3090, rtx4090, "
                   "a100-80gb, ...; a wrong name lists them all), which sets the size and speeds. "
                   "Keys: free=SIZE (unused now, at most the size), margin=SIZE (kept free), "
                   "bw=936GB/s, pcie=4x16, tflops=71; CPU: ram=12xDDR5-4800, threads=N, cores=N "
                   "(physical cores), ghz=3.0 (base clock), isa=avx512_vnni (instruction set: avx2, "
                   "avx512, avx512_vnni, amx; default: this machine's); RPC: link=10Gb/s, threads=N (its "
                   "rpc-server's)")


def usage_with_server_args(p: argparse.ArgumentParser) -> None:
    """The usage line with what goes after ``--``: argparse's own stopped at ``model``, so `fit --help`
    never showed where llama-server's arguments go (the README's usage lines end in
    ``-- <llama-server arguments>``).  Call after every argument is added."""
    if not isinstance(p, argparse.ArgumentParser):  # cli_fastparse's recorder: it prints no usage
        return
    usage = p.format_usage().removeprefix("usage: ").rstrip("\n").replace("%", "%%")
    p.usage = f"{usage} -- <llama-server arguments>"


def detection_note(message: str, devices: DeviceSet) -> str:
    """The GPU detection's message as a note: "no NVIDIA driver found (...); declare GPUs with --device
    CUDA0=24GiB" told a user who had declared them to do so; with declared GPUs it names them instead,
    as the window's Devices pane does ("planning for the declared CUDA0")."""
    declared = [g.name for g in devices.gpus if g.source == "declared"]
    if not message or not declared or "; declare GPUs" not in message:
        return message
    return f"{message.split('; declare GPUs')[0]}: planning for the declared {', '.join(declared)}"


def add_estimate_options(p: argparse.ArgumentParser) -> None:
    """``--depth`` and ``--spec-accept``, shared by ``plan`` and ``fit``."""
    p.add_argument("--depth", type=_depth, default=0, metavar="D",
                   help="also estimate pp of the prompt and tg after D tokens already in the context "
                   "(attention over them, their KV read per micro-batch); default 0: only from an empty "
                   "cache")
    p.add_argument("--spec-accept", type=_accept, default=None, metavar="P",
                   help="with a draft model (-md) or MTP (--spec-type draft-mtp): the share of drafted "
                   "tokens the model accepts, each given all earlier ones were (default 0.806, from a "
                   "public measurement of GLM MTP in llama.cpp; the estimate's assumptions name it); "
                   "or what llama-server printed for your run: ratio=R (its 'draft acceptance', "
                   "accepted / generated) or len=L (its 'mean len', tokens a step)")


#: The longest --prompt taken: 16M tokens, beyond any model's context; the estimate walks the prompt
#: micro-batch by micro-batch, so 10^12 tokens ran for hours.
MAX_PROMPT = 1 << 24


def prompt_len(text: str) -> int:
    """``--prompt N`` of ``plan`` and ``fit``: 1 to :data:`MAX_PROMPT` tokens."""
    if not text.isascii() or not text.isdigit() or len(text) > 12 or not 1 <= int(text) <= MAX_PROMPT:
        raise argparse.ArgumentTypeError(f"--prompt {text!r}: expected a number of tokens from 1 to "
                                         f"{MAX_PROMPT}")
    return int(text)


#: The most micro-batches the estimate walks for --prompt (32768: 16M tokens at the default -ub 512);
#: each is a step of its loop, so `--prompt 1000000 -- -ub 1` took 10 s and 16M tokens minutes.
MAX_MICROBATCHES = 1 << 15


def check_microbatches(prompt: int, args: Any) -> None:
    """Refuse a --prompt that needs more than :data:`MAX_MICROBATCHES` micro-batches of the
    command's -ub (llama.cpp's n_ubatch = min(n_batch, n_ubatch); ``args``: the parsed server args)."""
    ub = min(args.ubatch_size if args.ubatch_size is not None else DEFAULT_UB,
             args.batch_size if args.batch_size is not None else DEFAULT_B)
    batches = -(-prompt // max(1, ub))
    if batches > MAX_MICROBATCHES:
        raise PlannerError(f"--prompt {prompt} in micro-batches of -ub {ub} is {batches} micro-batches, more "
                           f"than the {MAX_MICROBATCHES} the estimate walks: raise -ub or shorten --prompt")


def _depth(text: str) -> int:
    try:  # int() refuses '²' (a digit to isdigit) and 5,000 digits: it was 'invalid _depth value'
        value = int(text) if text.isdigit() else -1
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"--depth {text!r}: expected a number of tokens (0 or more)")
    return value


#: a number as --spec-accept takes it: ASCII digits, a decimal point, an exponent
_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?", re.ASCII)


def _accept(text: str) -> float | Acceptance:
    """``P`` (0 to 1), ``ratio=R`` (0 to 1) or ``len=L`` (at least 1; at most the draft length + 1,
    checked when the draft length is known: a larger one counts as every token accepted)."""
    kind, sep, number = text.rpartition("=")
    kind = kind if not sep or kind else "?"  # '=0.5' names no form
    # ASCII digits only: float() also took '2_5' as 25 and other scripts' digits, which --prompt refuses
    v = float(number) if len(number) < 40 and _DECIMAL.fullmatch(number) else -1.0
    if kind == "len" and 1.0 <= v < 1e6:
        return Acceptance("len", v)
    if kind in ("", "ratio") and 0.0 <= v <= 1.0:
        return Acceptance("ratio", v) if kind else v
    raise argparse.ArgumentTypeError(
        f"--spec-accept {text[:40]!r}: expected a share from 0 to 1 (e.g. 0.7), ratio=R as llama-server "
        "prints 'draft acceptance' (0 to 1), or len=L as it prints 'mean len' (1 or more)")
