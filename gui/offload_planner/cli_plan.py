"""``offload-planner plan MODEL [--device ...] [--backend PATH|DIALECT] [--json] -- <server args>``."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from offload_planner.core.errors import PlannerError

DIALECTS = ("llama.cpp", "llama.cpp-2025", "ik_llama.cpp")


def add_plan_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan",
        help="place every tensor and project each device's memory for a llama-server command line",
        description="Say which device every tensor lands on and how many bytes llama.cpp allocates "
        "on each device, per buffer (weights, KV cache, compute, output), for MODEL and the "
        "llama-server arguments after `--`. Devices: --rpc servers from the arguments (RPC0, RPC1, "
        "... first, as llama.cpp orders them), NVIDIA GPUs found through NVML, and --device "
        "declarations (which also set the capacity of a device of the same name).",
        epilog="example: offload-planner plan model.gguf --device CUDA0=24GiB -- -ngl 999 "
        "-ot exps=CPU -c 32768",
    )
    p.add_argument("model", help="GGUF path or URL (any shard of a split model)")
    p.add_argument("--device", action="append", default=[], metavar="NAME=SIZE[,free=SIZE]",
                   help="declare a device, e.g. CUDA0=24GiB or CPU=256GiB (repeatable)")
    p.add_argument("--backend", default="llama.cpp", metavar="PATH|DIALECT",
                   help="a llama-server executable to detect the dialect from, or one of: "
                   + ", ".join(DIALECTS) + " (default: llama.cpp, the pinned build)")
    p.add_argument("--no-detect", action="store_true", help="do not look for NVIDIA GPUs")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--explain", action="store_true", help="list every buffer with how it was computed")
    p.add_argument("--prompt", type=_prompt_len, default=4096, metavar="N",
                   help="prompt length of the prompt-processing estimate (default 4096)")
    p.set_defaults(func=run_plan, server_args=[])


def _prompt_len(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--prompt {text!r}: expected a positive number of tokens")
    return int(text)


def _dialect(backend: str) -> str:
    if backend in DIALECTS:
        return backend
    exe = shutil.which(backend) or backend
    if not Path(exe).is_file():
        raise PlannerError(f"--backend {backend!r}: not a dialect ({', '.join(DIALECTS)}) nor an executable")
    from offload_planner.core.cmdline import detect_dialect

    def run(flag: str) -> str:
        try:
            r = subprocess.run([exe, flag], capture_output=True, text=True, timeout=30)
        except OSError as e:
            raise PlannerError(f"--backend {backend!r}: cannot run it: {e}") from None
        return r.stdout + r.stderr

    return str(detect_dialect(run("--version"), run("--help")))


def run_plan(args: argparse.Namespace) -> int:
    from offload_planner.backend.system import cpu_device, detect_gpus
    from offload_planner.core.cmdline import format_command, parse_server_args
    from offload_planner.core.devices import build_device_set, parse_device_decl
    from offload_planner.core.gguf_reader import open_model
    from offload_planner.core.plan import plan_command
    from offload_planner.core.plan_report import plan_json, plan_text

    server_args = list(args.server_args)
    dialect = _dialect(args.backend)
    parsed = parse_server_args(server_args, dialect=dialect)
    model = open_model(args.model)
    declared = [parse_device_decl(d) for d in args.device]
    detection = detect_gpus() if not args.no_detect else None
    rpc = list(parsed.args.rpc_servers or [])
    devices = build_device_set(cpu=cpu_device(), detected=detection.gpus if detection else [],
                               rpc_endpoints=rpc, declared=declared)
    errors = [str(e) for e in parsed.errors]
    from offload_planner.core.cmdline import check_semantics

    errors += [str(e) for e in check_semantics(parsed.args, [d.name for d in devices],
                                               is_mla=model.summary.is_mla, dialect=dialect)]
    if dialect == "ik_llama.cpp":
        from offload_planner.core.ik import model_errors

        errors += model_errors(model)
    from offload_planner.core.engine import run_engine
    from offload_planner.core.plan import plan_from_args

    result = run_engine(model, devices, parsed.args, dialect)
    plan = plan_from_args(model, devices, parsed, dialect)
    command = plan_command(plan)
    notes = list(result.notes)
    if detection is not None and detection.message:
        notes.append(detection.message)
    fit: dict[str, object] | None = None
    if dialect == "llama.cpp" and not errors:
        from offload_planner.core.fit import fit_note, fit_summary, fitted_command, server_fit

        fitted = server_fit(model, devices, parsed, result.placement_options, result.context)
        unknown = [g.name for g in devices.gpus if g.capacity is None]
        if fitted is None and unknown and parsed.args.fit is not False:
            notes.append(f"--fit is on (this build's default): at start it adapts -c, -ngl and expert "
                         f"overrides to each GPU's free memory; declare {', '.join(unknown)} with "
                         "--device NAME=SIZE to see what it will do")
        if fitted is not None:
            fcmd = fitted_command(fitted, model, devices, plan.placement_options, plan.context) \
                if fitted.changed else []
            fit = fit_summary(fitted, devices, fcmd)
            note = fit_note(fitted, fcmd)
            if note:
                notes.append(note)
    from offload_planner.backend.speed_store import plan_speed
    from offload_planner.core.speed.report import speed_json, speed_lines

    speed = plan_speed(plan, parsed, prompt=args.prompt)
    if args.json:
        out = plan_json(result.projection, warnings=result.warnings, errors=errors, command=command,
                        notes=notes, fit=fit)
        out["speed"] = speed_json(speed)
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        text = plan_text(result.projection, warnings=result.warnings, errors=errors,
                         command=format_command(["llama-server", *command], "bash"), notes=notes,
                         explain=args.explain)
        table, sep, rest = text.partition("\ncontext: ")
        print("\n".join([table, *speed_lines(speed)]) + sep + rest)
    return 2 if errors else 0
