"""``offload-planner fit MODEL --device ... [--goal tg|pp|balanced] [--prompt N] -- <base args>``."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import TYPE_CHECKING

from offload_planner.cli_estimate_options import (
    add_device_option,
    add_estimate_options,
    check_microbatches,
    prompt_len,
)
from offload_planner.core.dialects import Dialect
from offload_planner.core.errors import PlannerError

if TYPE_CHECKING:
    from offload_planner.backend.system import Detection
    from offload_planner.core.cmdline.model import ParsedArgs
    from offload_planner.core.devices import DeviceSet
    from offload_planner.core.memory import Projection
    from offload_planner.core.model import Model
    from offload_planner.core.plan import Plan
    from offload_planner.core.speed.hardware import Hardware
    from offload_planner.core.speed.result import SpeedEstimate


def add_fit_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "fit",
        help="find the fastest placement that fits the devices, beside --cpu-moe, --n-cpu-moe and --fit",
        description="Keep the llama-server arguments after `--` (your -ot rules, -c, ...), move routed "
        "experts onto the GPUs layer by layer as far as each device's memory allows (minus its "
        "margin, 1 GiB by default), try larger -ub for prompt processing, and print the command, "
        "its memory table and its speed estimate beside the baselines.",
        epilog="exit status: 0 a plan that fits was found (its command is the last line); 1 nothing fits "
        "the devices (the closest plan's excess is said); 2 a refused command, file or option (the "
        "message alone, on stderr). "
        "example: offload-planner fit model.gguf --device CUDA0=rtx3090 --device CPU=128GiB "
        "--goal balanced -- -c 32768",
    )
    p.add_argument("model", help="GGUF path or URL (any shard of a split model)")
    add_device_option(p)
    p.add_argument("--goal", choices=("tg", "pp", "balanced"), default="balanced",
                   help="what to make fast: generation, prompt processing, or a request of both "
                   "(the prompt and a 512-token answer; default)")
    p.add_argument("--prompt", type=prompt_len, default=4096, metavar="N",
                   help="prompt length (default 4096)")
    p.add_argument("--allow-kv-quant", action="store_true",
                   help="let the search make an f16 KV cache q8_0 (-ctk/-ctv; a quantized V cache only "
                   "with flash attention, as llama.cpp requires); without it your KV types are kept")
    p.add_argument("--allow-nkvo", action="store_true",
                   help="let the search keep the KV cache on the CPU (-nkvo: its GPU memory left to "
                   "experts, the attention's round trips to the host counted in the estimate); "
                   "without it the KV cache stays where your command puts it")
    p.add_argument("--backend", default=Dialect.LLAMA_CPP.value,
                   choices=(Dialect.LLAMA_CPP.value, Dialect.IK.value),
                   help=f"dialect of the command (default {Dialect.LLAMA_CPP})")
    p.add_argument("--no-detect", action="store_true", help="do not look for NVIDIA GPUs")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_estimate_options(p)
    p.set_defaults(func=run_fit, server_args=[])
    from offload_planner.cli_estimate_options import usage_with_server_args

    usage_with_server_args(p)


def run_fit(args: argparse.Namespace) -> int:
    """The command, with the cycle collector off: a one-shot run whose objects reference counting
    frees (the model's, the search's ~20 placements and projections); its collections, walking the
    open model's objects again and again, were ~15% of the command's CPU time on DeepSeek-V3."""
    from offload_planner.core.compute.simulate import no_cyclic_gc

    with no_cyclic_gc():
        return _run_fit(args)


def _fit_devices(args: argparse.Namespace, parsed: ParsedArgs, model: Model,
                 dialect: Dialect) -> tuple[DeviceSet, Detection | None]:
    """The devices ``fit`` places on (declared, detected, RPC), refused without a GPU or with a GPU of
    unknown size, and the command's flags checked against them as ``plan`` checks them."""
    from offload_planner.backend.system import cpu_device, detect_gpus
    from offload_planner.core.cmdline import check_semantics
    from offload_planner.core.devices import build_device_set, parse_device_decls

    declared = parse_device_decls(args.device)
    detection = detect_gpus() if not args.no_detect else None
    devices = build_device_set(cpu=cpu_device(declared), detected=detection.gpus if detection else [],
                               rpc_endpoints=list(parsed.args.rpc_servers or []), declared=declared)
    unknown = [g.name for g in devices.gpus if g.capacity is None]
    if not devices.gpus:  # "every GPU's size" read oddly with no GPU at all
        raise PlannerError("fit places tensors on GPUs and there is none: declare one with --device, e.g. "
                           "--device CUDA0=rtx3090 or --device CUDA0=24GiB"
                           + ("" if detection is None else f" ({detection.message.split(';')[0]})"))
    if unknown:
        raise PlannerError("fit needs every GPU's size: declare them with --device, e.g. CUDA0=rtx3090"
                           f" ({', '.join(unknown)} unknown)")
    from offload_planner.core.loadable import context_error

    semantics = check_semantics(parsed, devices.names, is_mla=model.summary.is_mla, dialect=dialect,
                                arch=model.arch)
    refusals: list[object] = [*semantics, *dialect.model_errors(model)]
    refusals += [e for e in [context_error(model, parsed.args.ctx_size)] if e]
    if refusals:  # as plan refuses them: the candidates keep these flags (-ts nan,1 broke the -nkvo search)
        raise PlannerError("; ".join(str(e) for e in refusals))
    return devices, detection


def _run_fit(args: argparse.Namespace) -> int:
    from offload_planner.backend.speed_store import (
        efficiencies_for,
        parsed_hardware,
        probe_speed_note,
    )
    from offload_planner.core.cmdline import parse_server_args, skipped_devices
    from offload_planner.core.loadable import open_loadable
    from offload_planner.core.plan import plan_command
    from offload_planner.core.plan_report import plan_json
    from offload_planner.core.speculative import draft_warning, spec_refusals, spec_stops
    from offload_planner.core.speed.candidate import over_by
    from offload_planner.core.speed.estimate import estimate
    from offload_planner.core.speed.fastest import fastest_plan
    from offload_planner.core.speed.ranking import score
    from offload_planner.core.speed.report import speed_json
    from offload_planner.core.speed.speculation import with_speculation
    from offload_planner.core.speed.tps import tps_json

    dialect = Dialect(args.backend)
    parsed = parse_server_args(list(args.server_args), dialect=dialect)
    if parsed.errors:
        raise PlannerError("; ".join(str(e) for e in parsed.errors))
    check_microbatches(args.prompt, parsed.args)
    model = open_loadable(args.model)
    devices, detection = _fit_devices(args, parsed, model, dialect)
    eff = efficiencies_for(args.backend, devices)
    hw = parsed_hardware(devices, parsed, dialect, probe_rpc=True)
    result = fastest_plan(model, devices, list(args.server_args), hw, dialect=dialect, goal=args.goal,
                          prompt=args.prompt, eff=eff, allow_kv_quant=args.allow_kv_quant,
                          accept=args.spec_accept, allow_nkvo=args.allow_nkvo,
                          concurrent=True)  # llama.cpp's --fit on a second core beside the search
    if detection is not None and detection.message:  # e.g. no driver: the catalogue's figures are used
        from offload_planner.cli_estimate_options import detection_note

        note = detection_note(detection.message, devices)
        result.notes.insert(0, f"{note} ({_gpu_figures_said(devices, hw)})")
    result.notes[:0] = [str(w) for w in skipped_devices(parsed, devices.names)]  # ik: -dev names it skips
    result.notes[:0] = _override_notes(model, parsed, dialect)  # --override-kv: what the plans follow
    from offload_planner.cli_server_args import model_flag_note

    other_model = model_flag_note(parsed, model)
    if other_model:
        result.notes.insert(0, other_model)
    spec = result.candidates[0].plan.spec if result.candidates else None
    refused = spec_stops(model, spec)
    if refused and spec is not None:  # every candidate keeps the user's --spec-type: none would start
        raise PlannerError(f"{'--spec-type draft-mtp on ' if spec.mtp else ''}{args.model}: {refused[0]}")
    result.notes += [n for n in spec_refusals(model, spec) if n not in refused]  # what is left out
    unused = draft_warning(model, result.candidates[0].plan.spec) if result.candidates else None
    if unused:  # every candidate keeps the user's -md: none uses it, all load it
        result.notes.append(unused)
    result.notes += [n for n in [probe_speed_note(devices)] if n]  # another machine at this one's RAM speed
    best = result.best
    # a layout made again after a full projection found it over keeps its label: rows told apart
    labels = distinct_labels([c.label for c in result.candidates])
    best_label = next((lb for lb, c in zip(labels, result.candidates, strict=True) if c is best),
                      best.label if best else None)
    rows = [{"label": lb, "fits": c.fits, "verified": c.verified,
             "over": [n for n, _ in over_by(c, devices)],
             "tg_tps": tps_json(c.estimate.tg_tps),
             "pp_tps": tps_json(c.estimate.pp_tps), "score": score(c.estimate, args.goal)}
            for lb, c in zip(labels, result.candidates, strict=True)]
    command = plan_command(best.plan) if best else []
    best_est = None
    if best is not None:  # the chosen plan's estimate, with --depth and speculative decoding
        best_est = estimate(best.plan, hw, prompt=args.prompt, eff=eff, placement=best.projection.placement,
                            depth=args.depth)
        best_est = with_speculation(best_est, best.plan, hw, eff, placement=best.projection.placement,
                                    accept=args.spec_accept)
    if best is not None:  # the window's Fastest plan says the same
        from offload_planner.core.presets import held_by_rules_text

        held = held_by_rules_text(best.plan)
        result.notes += [held] if held else []
    if args.json:
        out: dict[str, object] = {"goal": args.goal, "candidates": rows, "notes": result.notes,
                                  "best": best_label}
        if best is None:
            out["why"] = result.why
        if best:
            out["plan"] = plan_json(best.projection, warnings=[], errors=[], command=command)
            out["speed"] = speed_json(best_est or best.estimate)
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0 if best else 1
    print_candidates(args, rows, best_label, result.notes)
    if best is None:
        print("nothing fits these devices" + (f": {result.why}" if result.why else ""))
        # the RAM over beside a GPU ("CUDA0 over by 15.1 MiB (...); CPU (RAM) over by 87.4 GiB") too
        if "CPU (RAM) over" in result.why and not any(d.partition("=")[0] == "CPU" for d in args.device):
            print(ram_hint(devices.cpu.capacity))
        return 1
    _print_answer(best.plan, best.projection, best_est or best.estimate, command)
    return 0


def _print_answer(plan: Plan, projection: Projection, est: SpeedEstimate, command: list[str]) -> None:
    """The chosen plan: its memory table, its speed estimate with every figure it rests on (as plan
    prints them: the table's tg and pp came without a word on the RAM probe or the default GPU they
    were computed with), which GPU holds which layers' routed experts (the command says it as an -ot
    regex), and its command."""
    from offload_planner.core.cmdline import format_command
    from offload_planner.core.plan_report import plan_text
    from offload_planner.core.speed.advice import experts_text
    from offload_planner.core.speed.report import speed_lines

    print()
    table = plan_text(projection, warnings=[], errors=[], command="")
    print(table.split("\ncontext: ")[0])
    layout = experts_text(plan, projection.placement)
    if layout:
        print(layout)
    print("\n".join(speed_lines(est)))
    print()
    print(format_command(["llama-server", *command], "bash"))
    from offload_planner.core.cmdline.secrets import secret_note

    note = secret_note(command)
    if note:
        print(f"note: {note}")


def _override_notes(model: Model, parsed: ParsedArgs, dialect: Dialect) -> list[str]:
    """What the command's ``--override-kv`` items do to every candidate (they all keep them); an item
    llama.cpp aborts on refuses the fit, as it would refuse every command."""
    from offload_planner.core.kv_override import command_overrides, notes, refusal

    ovs = command_overrides(parsed, dialect.kv_override_csv)
    said = refusal(model, ovs) if ovs else ""
    if said:
        raise PlannerError(f"llama-server aborts while loading {model.path}: {said}")
    return notes(model, ovs)


def _gpu_figures_said(devices: DeviceSet, hw: Hardware) -> str:
    """Where the GPUs' speed figures come from without a driver: a GPU declared by its size alone
    (CUDA0=24GiB) gets default figures, which "declared or from the catalogue" did not say."""
    from offload_planner.core.speed.hardware import Source

    plain = [g.name for g in devices.gpus if g.name in hw.devices
             and hw[g.name].bandwidth.source is Source.DEFAULT]
    if not plain:
        return "GPU speed figures: declared or from the catalogue"
    return (f"{', '.join(plain)}: default speed figures, no card given: name it, e.g. {plain[0]}=rtx3090, "
            "or give bw= and tflops=")


def ram_hint(capacity: int | None) -> str:
    """Where nothing fits the RAM of this machine: a newcomer planning a server from a laptop was told
    "CPU (RAM) over by 335.3 GiB (... > 23.5 GiB)" and not that the RAM can be declared."""
    size = "" if capacity is None else f" ({capacity / 1024**3:.1f} GiB)"
    return (f"note: the RAM is this machine's{size}; to plan for another machine declare its RAM and its "
            "speed, e.g. --device CPU=512GiB,ram=8xDDR5-4800 (channels x MT/s; else this machine's speed)")


def print_candidates(args: argparse.Namespace, rows: list[dict[str, object]], best_label: str | None,
                     notes: list[str]) -> None:
    """The goal, the candidate table (the answer starred), what its marks and words mean, the notes."""
    from offload_planner.core.speed.tps import tps_fixed

    goal = {"tg": "tokens/s generated", "pp": "tokens/s of the prompt"}.get(
        args.goal, f"a {args.prompt}-token prompt and a 512-token answer")
    print(f"goal: {args.goal} ({goal})")
    width = max([35] + [len(str(r["label"])) for r in rows])  # "fastest (-ub 4096, own -ts, split layers)"
    # the JSON's figures (three decimals from 0.1 t/s, three significant figures below), as before
    cells = [(tps_fixed(float(r["tg_tps"]), 2), tps_fixed(float(r["pp_tps"]), 1)) for r in rows]  # type: ignore[arg-type]
    w = max([8] + [len(t) for cell in cells for t in cell])  # "< 0.000001": wider than 8
    print(f"{'candidate':{width + 1}} {'fits':5} {'tg t/s':>{w}} {'pp t/s':>{w}}")
    for r, (tg, pp) in zip(rows, cells, strict=True):
        mark = "*" if best_label is not None and r["label"] == best_label else " "
        fits = ("" if r["verified"] else "~") + ("yes" if r["fits"] else "no")
        print(f"{mark}{r['label']:{width}} {fits:5} {tg:>{w}} {pp:>{w}}"
              + (f"   over: {', '.join(r['over'])}" if r["over"] else ""))  # type: ignore[arg-type]
    if args.goal == "balanced":
        print(balanced_line(rows, best_label, args.prompt))
    if not all(r["verified"] for r in rows):
        print("~: memory predicted (compute buffers of the plans projected in full), not projected")
    for line in label_legend([str(r["label"]) for r in rows]):
        print(line)
    for n in notes:
        print(f"note: {n}")


def balanced_line(rows: list[dict[str, object]], best_label: str | None, prompt: int) -> str:
    """What the balanced goal ranks by (a request's seconds: the prompt at pp, the answer at tg), with
    the starred row's seconds and, where another row that fits generates faster, that row's: the star
    can sit on a row whose tg is lower than a baseline's, a prompt's seconds saved outweighing it."""
    from offload_planner.core.speed.ranking import BALANCED_ANSWER

    line = (f"balanced: ranked by a request's seconds, the {prompt}-token prompt at pp t/s plus a "
            f"{BALANCED_ANSWER}-token answer at tg t/s (the fewest wins)")
    star = next((r for r in rows if r["label"] == best_label), None)
    if star is None:
        return line
    fitting = [r for r in rows if r["fits"]]
    fastest_tg = max(fitting, key=lambda r: float(r["tg_tps"]), default=star)  # type: ignore[arg-type]
    line += f": * {_request_seconds(star)}"
    if float(fastest_tg["tg_tps"]) > float(star["tg_tps"]):  # type: ignore[arg-type]
        line += f"; the highest tg, \"{fastest_tg['label']}\", {_request_seconds(fastest_tg)}"
    return line


def _request_seconds(row: dict[str, object]) -> str:
    """A request's seconds from the row's balanced score (requests per second), four figures."""
    s = 1.0 / float(row["score"])  # type: ignore[arg-type]
    text = f"{s:.4g}"
    return f"{s:.0f} s" if "e" in text else f"{text} s"


#: What the words of the search's candidate labels (core.speed.fills) mean, in the order they appear
#: in a label: "fastest (-ub 4096, own -ts, parts, speculative)" explained nothing of itself.
LABEL_TERMS = (
    ("own -ts", "the layer split chosen with the experts: each GPU a block of layers, as many whole "
                "(with their experts) as fit; the command carries that -ts"),
    ("small layers first", "one GPU: its room filled with whole expert layers, the smallest first"),
    ("parts", "the block packed: a small layer swapped for a larger one where it fills the room "
              "better, then single expert tensors of other layers in the room left"),
    ("speculative", "the split chosen for a step of speculative decoding (experts weighed by what "
                    "the verify batch and the draft read), not for one token"),
    ("mmap", "the command's load, with mmap: the GPU maps the file span of its tensors (Metal), "
             "here the top layers (-ngl), which lie together at the file's end"),
    ("split layers", "single expert tensors added from layers whose other experts stay on the CPU, "
                     "in the room each GPU has left (two more graph splits, hand-overs between devices in a "
                     "token's pass, for each such layer)"),
)


def label_legend(labels: list[str]) -> list[str]:
    """One line per term of :data:`LABEL_TERMS` used in ``labels`` (whole words between the label's
    commas and parentheses), as the table's ``~`` is explained under it."""
    used = {w.strip() for label in labels for w in label.partition("(")[2].rstrip(")").split(",")}
    starts = sorted(w for w in used if w.startswith("from "))  # "fastest (from llama.cpp --fit, ...)"
    again = ([f"{AGAIN}: the same kind of layout made again after a candidate was projected in full and "
              "found over (its predictions redone with the compute buffers just simulated, or the "
              "experts it put over a GPU taken back to the CPU)"]
             if any(re.search(rf"\) {AGAIN}( \d+)?$", label) for label in labels) else [])
    return ([f"{w}: started from the placement of the {w.removeprefix('from ')!r} row below" for w in starts]
            + [f"{term}: {meaning}" for term, meaning in LABEL_TERMS if term in used] + again)


#: After the second and later rows of one label: "fastest (-ub 512) again", "... again 3".
AGAIN = "again"


def distinct_labels(labels: list[str]) -> list[str]:
    """``labels`` with the second and later rows of a label told apart ("fastest (-ub 512) again",
    "fastest (-ub 512) again 3"): a row of the search's second round kept its first round's label,
    so the table showed two "fastest (-ub 512)" with different figures and one over."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        n = seen[label] = seen.get(label, 0) + 1
        out.append(label if n == 1 else f"{label} {AGAIN}" + (f" {n}" if n > 2 else ""))
    return out
