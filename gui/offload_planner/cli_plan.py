"""``offload-planner plan MODEL [--device ...] [--backend PATH|DIALECT] [--json] -- <server args>``."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from offload_planner.cli_estimate_options import (
    add_device_option,
    add_estimate_options,
    check_microbatches,
    prompt_len,
)
from offload_planner.core.dialects import Dialect, all_dialects
from offload_planner.core.errors import PlannerError
from offload_planner.core.speed.acceptance import Acceptance

if TYPE_CHECKING:
    from offload_planner.core.cmdline import ArgError
    from offload_planner.core.devices import DeviceSet
    from offload_planner.core.memory import Projection
    from offload_planner.core.model import Model
    from offload_planner.core.plan import Plan
    from offload_planner.core.speed.result import SpeedEstimate



def dialect_names() -> list[str]:
    """What ``--backend`` takes besides an executable: every registered dialect's name."""
    return [d.value for d in all_dialects()]


def add_plan_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan",
        help="place every tensor and project each device's memory for a llama-server command line",
        description="Say which device every tensor lands on and how many bytes llama.cpp allocates "
        "on each device, per buffer (weights, KV cache, compute, output), for MODEL and the "
        "llama-server arguments after `--` (and the LLAMA_ARG_* variables of the environment, "
        "as llama-server reads them). Devices, in llama.cpp's order whatever order they are given "
        "in: --rpc servers from the arguments (RPC0, RPC1, ...), then GPUs by backend and index "
        "(CUDA0, CUDA1, ...): NVIDIA GPUs found through NVML and --device declarations (which also "
        "set the capacity of a device of the same name). A command llama-server would refuse prints "
        "only the error; every value it changes silently (-c 32k is read as 32) is a note.",
        epilog="exit status: 0 the plan fits; 2 a refused command, file or option (the message "
        "alone, on stderr); 3 a device is over capacity (a row marked OVER) and the pinned build's "
        "--fit does not make it fit. "
        "example: offload-planner plan model.gguf --device CUDA0=24GiB -- -ngl 999 "
        "-ot exps=CPU -c 32768",
    )
    p.add_argument("model", help="GGUF path or URL (any shard of a split model)")
    add_device_option(p)
    p.add_argument("--backend", default=Dialect.LLAMA_CPP.value, metavar="PATH|DIALECT",
                   help="a llama-server executable to detect the dialect from, or one of: "
                   + ", ".join(dialect_names()) + f" (default: {Dialect.LLAMA_CPP}, the pinned build)")
    p.add_argument("--no-detect", action="store_true", help="do not look for NVIDIA GPUs")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--explain", action="store_true",
                   help="list every buffer with how it was computed, and say what the speed block's graph "
                   "splits are")
    p.add_argument("--prompt", type=prompt_len, default=4096, metavar="N",
                   help="prompt length of the prompt-processing estimate (default 4096)")
    add_estimate_options(p)
    p.set_defaults(func=run_plan, server_args=[])
    from offload_planner.cli_estimate_options import usage_with_server_args

    usage_with_server_args(p)


def _dialect(backend: str) -> Dialect:
    if backend in dialect_names():
        return Dialect(backend)
    exe = shutil.which(backend) or backend
    if not Path(exe).is_file():
        names = ", ".join(dialect_names())
        raise PlannerError(f"--backend {backend!r}: not a dialect ({names}) nor an executable")
    import subprocess

    from offload_planner.backend import child_guard
    from offload_planner.core.cmdline import detect_dialect

    def run(flag: str) -> str:
        try:
            return child_guard.output_of([exe, flag], timeout=30)
        except subprocess.TimeoutExpired as e:  # its text was the guard's own command line
            raise PlannerError(f"--backend {backend!r}: no answer to {flag} within {e.timeout:g} s (a "
                               "llama-server answers at once): give llama-server or a dialect") from None
        except OSError as e:
            raise PlannerError(f"--backend {backend!r}: cannot run it: {e.strerror or e}") from None

    return detect_dialect(run("--version"), run("--help"))


EXIT_OK, EXIT_OVER = 0, 3  # refused: 2 (cli_server_args.print_errors)


def _open_model(path: str) -> Model:
    """The GGUF at ``path``; a plan file saved by the window is named as one, with how to open it."""
    from offload_planner.core.loadable import open_loadable

    try:
        return open_loadable(path)  # a model llama.cpp refuses is refused here, by name
    except PlannerError:
        if _is_json(path):
            raise PlannerError(
                f"{path} is a plan file (JSON), not a GGUF model: open it in the window with "
                f"`offload-planner {path}`, or plan its model with `offload-planner plan MODEL.gguf -- ...`"
            ) from None
        raise


def _is_json(path: str) -> bool:
    p = Path(path)
    if not p.is_file():  # never open a FIFO or a device here
        return False
    if path.endswith(".json"):
        return True
    with p.open("rb") as f:
        return f.read(64).lstrip().startswith(b"{")


def _devices(args: argparse.Namespace, rpc: list[str]) -> tuple[DeviceSet, str]:
    from offload_planner.backend.system import cpu_device, detect_gpus
    from offload_planner.core.devices import build_device_set, parse_device_decls

    declared = parse_device_decls(args.device)
    detection = detect_gpus() if not args.no_detect else None
    devices = build_device_set(cpu=cpu_device(declared), detected=detection.gpus if detection else [],
                               rpc_endpoints=rpc, declared=declared)
    from offload_planner.cli_estimate_options import detection_note

    return devices, detection_note(detection.message, devices) if detection is not None else ""


def _fit_gave_up(summary: dict[str, object] | None, over: list[str], devices: DeviceSet) -> list[str]:
    """A GPU over capacity while the build's --fit, on by default, left the command as written: it
    gives up when the user set what it would adapt (``n_gpu_layers already set by user to 99,
    abort``), so the server runs out of memory at load. Said with llama.cpp's own words."""
    gpus = [n for n in over if n != devices.cpu.name]
    if not gpus or not summary or summary.get("changed") or not summary.get("message"):
        return []
    return [f"--fit is on but leaves this command as it is (llama.cpp: \"{summary['message']}\"), so "
            f"{', '.join(gpus)} stays over: drop what it names, or run offload-planner fit for a plan "
            "that fits"]


def _room_for_the_cpus_experts(over: list[str], plan: Plan, projection: Projection) -> list[str]:
    """RAM over capacity while GPUs have room for the routed experts it holds: said with the command
    that moves them (the note named the CPU over and nothing else, 36 GiB free on two GPUs beside it)."""
    from offload_planner.core.device_figures import DeviceFigures
    from offload_planner.core.speed.advice import expert_room, held_on_cpu, held_text
    from offload_planner.core.units import fmt_bytes

    cpu = plan.devices.cpu.name
    room = expert_room(plan, projection) if cpu in over else ()
    short = DeviceFigures.of(projection.device(cpu)).over
    if not room or sum(b for _, b in room) < short:  # the GPUs cannot take the excess: nothing to point at
        return []
    gpus = " and ".join(f"{n}'s {fmt_bytes(b)}" for n, b in room)
    their = "its margin" if len(room) == 1 else "their margins"
    held = held_on_cpu(plan)
    return [f"{cpu} is over while {gpus} free beyond {their} (1 GiB unless given) can take routed experts "
            "from it: `offload-planner fit` with the same options and arguments moves them there"
            + (held_text(held) if held else "") + " (by hand: "
            f"-ot 'blk\\.N\\.ffn_.*_exps={room[0][0]}' for a layer N, ahead of --cpu-moe or your exps=CPU "
            "rule)"]


def _legacy_name_notes(declared: list[str], dialect: Dialect) -> list[str]:
    """``--device Metal0=...``: the planner's old name, kept working; say what it is now."""
    from offload_planner.core.devices import canonical_device_name, legacy_names

    return [f"--device {n}: read as {(c := canonical_device_name(n))}, as the pinned llama.cpp names its "
            f"Metal device (MTL<i>); this build's commands name it {dialect.server_device_name(c)}"
            for n in legacy_names(declared)]


def run_plan(args: argparse.Namespace) -> int:
    """Errors first and alone (stderr, exit 2); then the plan, with every silent change as a note;
    exit 3 when a device is over capacity and llama.cpp's --fit will not make it fit.

    The cycle collector is off throughout (as during a simulation: ``no_cyclic_gc``): a plan's
    objects (the model's ~1,000 tensors, the placement's items, the projection) are acyclic and freed
    by reference counting, and the collections their allocations would trigger walk them for nothing
    (DeepSeek-V3: about ten a plan, 1-3 ms); what cyclic garbage there is waits for the next one."""
    from offload_planner.core.compute.simulate import no_cyclic_gc

    with no_cyclic_gc():
        return _plan(args)


def _mac_ram_over(projection: Projection) -> bool:
    """A Mac's CPU and Metal GPUs together take more than its RAM (the unified-memory note says by how
    much); False without a Metal GPU."""
    from offload_planner.core.mapped_span import unified_over

    return unified_over(projection) > 0


def _prompt_past_context(depth: int, prompt: int, n_ctx: int) -> str:
    """The estimate's request is longer than a sequence's context. Without --depth it named "--depth 0 +
    --prompt 4096 tokens" to a user who had given neither (-c 32k read as 32, the default prompt)."""
    tail = (f"the context of {n_ctx} cells a sequence: llama-server would refuse such a request (the "
            "estimate is computed anyway")
    if depth:
        return f"--depth {depth} + --prompt {prompt} tokens exceed {tail})"
    return f"the speed estimate's {prompt}-token prompt (--prompt) exceeds {tail}; --prompt N sets another)"


def _if_it_fit(lines: list[str], over: list[str], fitted: list[str] | None = None) -> list[str]:
    """The speed block of a plan with a device over capacity: its first line says the figures are for
    the plan as if it fit, as the window's speed line does ("if it fit: est. tg ..."). It read
    "speed estimate (uncalibrated): tg 16.2 t/s" for DeepSeek-V3 354 GiB over one 24 GiB GPU, a plan
    llama-server does not load, the OVER mark and the warning far from the figure. ``fitted``: GPUs over
    capacity that the build's --fit makes fit by changing the command: the figures are of the command as
    written, not of the one the server runs (Qwen3-30B on a 12 GiB card read "tg 110 t/s" for a command
    whose --fit runs -c 4096 with 19 layers' experts on the CPU)."""
    if not (over or fitted) or not lines:
        return lines
    head, colon, tail = lines[0].partition(": ")
    if over:
        return [f"{head} if it fit ({', '.join(over)} over capacity){colon}{tail}", *lines[1:]]
    gpus = ", ".join(fitted or [])
    return [f"{head} of the command as written ({gpus} over capacity: llama-server's --fit runs the command "
            f"in the note instead: plan that one for its speed){colon}{tail}", *lines[1:]]


def _with_faster(lines: list[str], plan: Plan, projection: Projection, speed: SpeedEstimate) -> list[str]:
    """The speed block with what would make the plan faster before its assumptions
    (core.speed.advice): the bottleneck lines named the slow part and no change to make."""
    from offload_planner.core.speed.advice import faster_hints, faster_lines

    hints = faster_lines(faster_hints(plan, projection, speed))
    at = lines.index("  assumptions:") if "  assumptions:" in lines else len(lines)
    return [*lines[:at], *hints, *lines[at:]]


def _plan(args: argparse.Namespace) -> int:
    from offload_planner.cli_server_args import model_flag_note, print_errors, read_server_argv
    from offload_planner.core.cmdline import check_semantics, format_command
    from offload_planner.core.device_figures import over_capacity
    from offload_planner.core.plan_report import plan_json, plan_text

    dialect = _dialect(args.backend)
    server = read_server_argv(args.server_args, dialect)
    parsed = server.parsed
    model = _open_model(args.model)
    devices, detected = _devices(args, list(parsed.args.rpc_servers or []))
    errors: list[ArgError | str] = [*parsed.errors]
    errors += check_semantics(parsed, devices.names, is_mla=model.summary.is_mla, dialect=dialect,
                              arch=model.arch)
    errors += dialect.model_errors(model)
    from offload_planner.core.loadable import context_error

    errors += [e for e in [context_error(model, parsed.args.ctx_size)] if e]
    if errors:
        return print_errors(errors)
    check_microbatches(args.prompt, parsed.args)
    from offload_planner.core.analysis import analyse_command, fit_simulates
    from offload_planner.core.compute import one_shot

    with one_shot(not fit_simulates(dialect, devices, parsed)):  # else the fit re-places its graphs
        analysis = analyse_command(model, devices, parsed, dialect, command=True, fit=True)
    projection, plan, fit = analysis.projection, analysis.plan, analysis.fit
    assert projection is not None and fit is not None  # analyse_command raises instead
    notes = [*server.notes, *analysis.command_notes, *([detected] if detected else []), *fit.notes]
    notes += _legacy_name_notes(args.device, dialect)
    from offload_planner.core.cmdline.secrets import secret_note

    notes += [n for n in [secret_note(analysis.command)] if n]
    other_model = model_flag_note(parsed, model)
    if other_model:
        notes.insert(0, other_model)
    over = [n for n in over_capacity(projection) if n == devices.cpu.name or not fit.fixes_gpus]
    over += [devices.cpu.name] if devices.cpu.name not in over and _mac_ram_over(projection) else []
    if over:
        notes.append(f"over capacity: {', '.join(over)} (exit status {EXIT_OVER})")
        notes += _fit_gave_up(fit.summary, over, devices)
        notes += _room_for_the_cpus_experts(over, plan, projection)
    from offload_planner.backend.speed_store import plan_speed, probe_speed_note
    from offload_planner.core.speed.report import speed_json, speed_lines

    try:
        speed = plan_speed(plan, parsed, prompt=args.prompt, probe_rpc=True, accept=args.spec_accept,
                           depth=args.depth)
    except (KeyError, ValueError, ArithmeticError) as e:  # the memory plan stands without it
        speed = None
        notes.append(f"speed estimate unavailable: {type(e).__name__}: {e}")
    if args.spec_accept is not None and speed is not None and speed.spec is None:
        given = args.spec_accept
        given = given.text() if isinstance(given, Acceptance) else f"--spec-accept {given:g}"
        notes.append(f"{given} unused: the command has no draft model (-md) "
                     "or MTP (--spec-type draft-mtp on a model with NextN layers)")
    if speed is not None and args.depth + args.prompt > speed.n_ctx:
        notes.append(_prompt_past_context(args.depth, args.prompt, speed.n_ctx))
    if speed is not None:
        notes += [n for n in [probe_speed_note(devices)] if n]
    if args.json:
        out = plan_json(projection, warnings=analysis.warnings, errors=[], command=analysis.command,
                        notes=notes, fit=fit.summary)
        out["speed"] = speed_json(speed) if speed is not None else None
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        text = plan_text(projection, warnings=analysis.warnings, errors=[],
                         command=format_command(["llama-server", *analysis.command], "bash"), notes=notes,
                         explain=args.explain)
        table, sep, rest = text.partition("\ncontext: ")
        fitted = [n for n in over_capacity(projection) if n not in over]  # the build's --fit fixes them
        lines = speed_lines(speed, explain=args.explain) if speed is not None else []
        lines = _if_it_fit(lines, over, fitted)
        if speed is not None and not over and not fitted:
            lines = _with_faster(lines, plan, projection, speed)
        print("\n".join([table, *lines]) + sep + rest)
    return EXIT_OVER if over else EXIT_OK
