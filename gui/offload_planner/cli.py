"""Headless entry point: ``offload-planner inspect MODEL``; the same core as the GUI."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import TextIO, TypeVar, cast

from offload_planner import __version__
from offload_planner.bundled import demo_model_path
from offload_planner.core.errors import PlannerError


def _cmd_inspect(args: argparse.Namespace) -> int:
    from offload_planner.core.gguf_reader import open_model
    from offload_planner.core.inspect_report import model_json, text_report

    if args.compact and not args.json:  # else it was silently ignored
        raise PlannerError("inspect: --compact shapes the --json output (no indentation): add --json, or "
                           "--no-layers for a shorter text report")
    if args.no_layers and args.json:
        raise PlannerError("inspect: --no-layers shortens the text report; the --json output always holds "
                           "the layers (--compact prints it on one line)")
    model = open_model(args.model or demo_model_path())
    if args.json:
        json.dump(model_json(model), sys.stdout, indent=None if args.compact else 1)
        sys.stdout.write("\n")
    else:
        from offload_planner.core.printable import printable

        # the file's strings (general.name, ...) as text: an escape sequence in a downloaded model's
        # metadata retitled or cleared the terminal
        print(printable(text_report(model, layers=not args.no_layers), keep_newlines=True))
        from offload_planner.core.loadable import load_error

        refused = load_error(model)  # the reader shows it; plan, fit and the window refuse it
        if refused is not None:
            print(printable(f"note: {refused.detail}; plan, fit and the window refuse it"))
    return 0


def check_plan_file(path: str, *, allow_remote: bool) -> None:
    """Refuse a plan file before the window opens: a bad field (named), a model that is not a
    regular file, or a model URL the user did not allow with --allow-remote."""
    from offload_planner.core.plan_file import load_plan, require_regular_file

    pf = load_plan(path)
    if pf.model_is_url:
        if not allow_remote:
            raise PlannerError(f"{path}: the plan reads its model from {pf.model_path}; pass --allow-remote "
                               "to fetch a URL named in a file")
    else:
        require_regular_file(pf.model_path, f"{path}: the plan's model")
    if pf.projector_url is not None and not allow_remote:  # the window read it unasked
        raise PlannerError(f"{path}: the plan reads its projector from {pf.projector_url[:200]}; pass "
                           "--allow-remote to fetch a URL named in a file")


def _cmd_gui(args: argparse.Namespace) -> int:
    from offload_planner.core.devices import parse_device_decls

    parse_device_decls(args.device)  # a bad --device is reported before anything else (display, Qt)
    from offload_planner.ui.app import run_gui

    try:
        w, h = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        raise PlannerError(f"--size {args.size!r}: expected WIDTHxHEIGHT, e.g. 1280x800") from None
    from offload_planner.ui.window_size import size_problem

    if size_problem(w, h):  # the window would be drawn larger than asked
        raise PlannerError(f"--size {args.size!r}: {size_problem(w, h)}")
    if args.model and args.model.lower().endswith(".json"):
        check_plan_file(args.model, allow_remote=args.allow_remote)
    return run_gui(args.model, devices=args.device, screenshot=args.screenshot, size=(w, h),
                   settings_file=args.settings, allow_remote=args.allow_remote)


def _add_gui_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    g = sub.add_parser(
        "gui",
        help="open the planner window (the default: `offload-planner [MODEL]`)",
        description="Open the planner window on MODEL (a .gguf, any shard, a URL or a saved plan "
        ".json); without MODEL, the bundled demo model.",
    )
    g.add_argument("model", nargs="?", help="GGUF path, URL or plan file (default: bundled demo model)")
    from offload_planner.cli_estimate_options import add_device_option

    add_device_option(g, "declare a device for this session only")
    g.add_argument("--screenshot", metavar="FILE.png",
                   help="render offscreen once the model is projected, save the PNG and exit")
    g.add_argument("--size", default="1280x800", metavar="WxH", help="window size with --screenshot")
    g.add_argument("--settings", metavar="FILE.ini", help="use this settings file instead of the user's")
    g.add_argument("--allow-remote", action="store_true",
                   help="open a plan file whose model is a URL (fetched without asking)")
    g.set_defaults(func=_cmd_gui)


def _default_to_gui(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`offload-planner` alone, with a path, or with window options (``--device ...``) opens the
    window; ``-h`` and ``--version`` stay the program's own."""
    commands = next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if not argv or (argv[0] not in commands and argv[0] not in ("-h", "--help", "--version")):
        return ["gui", *argv]
    return argv


def _add_inspect_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ins = sub.add_parser(
        "inspect",
        help="summarise a GGUF model (file, any shard of a split model, header-only file or URL)",
        description="Read a GGUF header (never the tensor data) and print the model's shape, "
        "quant types and a per-layer table of bytes by role. MODEL may be a local file, any "
        "shard of a split model, a header-only file, or an http(s) URL (only the header is "
        "downloaded, with HTTP Range requests). Without MODEL, the bundled demo model is used.",
    )
    ins.add_argument("model", nargs="?", help="GGUF path or URL (default: bundled demo model)")
    ins.add_argument("--json", action="store_true", help="print one JSON object (schema: README)")
    ins.add_argument("--compact", action="store_true", help="with --json: no indentation")
    ins.add_argument("--no-layers", action="store_true", help="omit the per-layer table")
    ins.set_defaults(func=_cmd_inspect)


def _add_plan_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from offload_planner.cli_plan import add_plan_parser

    add_plan_parser(sub)


def _add_launch_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from offload_planner.cli_launch import add_launch_parser

    add_launch_parser(sub)


def _add_fit_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from offload_planner.cli_fit import add_fit_parser

    add_fit_parser(sub)


#: Every command, in the order the help lists them, with what adds its parser.
COMMANDS: dict[str, Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = {
    "inspect": _add_inspect_parser, "gui": _add_gui_parser, "plan": _add_plan_parser,
    "launch": _add_launch_parser, "fit": _add_fit_parser,
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The program's parser; ``command``: with that command's parser only (all it takes to parse
    ``offload-planner COMMAND ...``: argparse builds slowly, a few ms a command)."""
    p = argparse.ArgumentParser(
        prog="offload-planner",
        description="Plan how llama.cpp / ik_llama.cpp place a GGUF model's tensors across CPU "
        "RAM and GPUs, project every device's memory, and export the command line.",
        epilog="Without a command, the window opens (on MODEL, or on the bundled demo). First steps: "
        "`offload-planner plan MODEL.gguf --device CUDA0=24GiB -- -ngl 999 --cpu-moe` (where every "
        "tensor goes, memory per device, speed estimate); `offload-planner fit MODEL.gguf --device "
        "CUDA0=rtx3090` (the fastest command that fits). `offload-planner COMMAND --help` for each.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, add in COMMANDS.items():
        if command is None or name == command:
            add(sub)
    return p


def split_server_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """Our options, and the llama-server arguments after the first ``--`` (kept verbatim)."""
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1:]
    return argv, []


def _parse(parser: argparse.ArgumentParser, ours: list[str]) -> argparse.Namespace:
    """Our options; llama-server flags given before ``--`` are refused with where they go."""
    args, extra = parser.parse_known_args(_default_to_gui(parser, ours))
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = getattr(args, "command", None)
    own: argparse.ArgumentParser = sub.choices.get(command, parser) if command else parser
    dashes = next((w for w in ours if w.startswith("--") and w.partition("=")[2] == "--"), None)
    if dashes:  # argparse drops the -- of --opt=-- and stores [] (--device=--: a traceback later)
        own.error(f"argument {dashes.partition('=')[0]}: '--' is not a value (a lone -- starts the "
                  "llama-server arguments)")
    if not extra:
        return args
    listed = " ".join(extra)
    elsewhere, extra_left = _other_commands_options(own, extra)
    meant, rest = _meant_options(own, extra_left)
    hints = [f"did you mean {meant}? `{own.prog} --help` lists the options"] if meant else []
    hints += elsewhere
    if rest and hasattr(args, "server_args"):
        hints.append(f"llama-server arguments go after `--`: offload-planner {command} MODEL [options] -- "
                     + " ".join(rest))
    if hints:
        own.error(f"unrecognized arguments: {listed} ({'; '.join(hints)})")
    own.error(f"unrecognized arguments: {listed} (`{own.prog} --help` lists the options)")


def _other_commands_options(own: argparse.ArgumentParser, extra: list[str]) -> tuple[list[str], list[str]]:
    """Unknown options in ``extra`` that another command takes (``plan --goal tg``: fit's; it was told
    to go after ``--`` as a llama-server flag): a hint for each, and ``extra`` without them and their
    values. Builds every command's parser (an error path: the run parsed with its own only)."""
    full = build_parser()
    sub = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction))
    commands: dict[str, argparse.ArgumentParser] = sub.choices
    mine = {o for a in own._actions for o in a.option_strings}
    owner: dict[str, tuple[list[str], bool]] = {}  # option -> (the commands taking it, takes a value)
    for name, parser in commands.items():
        for a in parser._actions:
            for o in a.option_strings:
                if o.startswith("--") and o not in mine:
                    owner.setdefault(o, ([], a.nargs != 0))[0].append(name)
    hints: list[str] = []
    left: list[str] = []
    skip = False
    for token in extra:
        flag, eq, _ = token.partition("=")
        if skip and not token.startswith("-"):
            skip = False
            continue
        skip = False
        if flag in owner:
            names, valued = owner[flag]
            which = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
            hints.append(f"{flag} is an option of `offload-planner {which}`, not of "
                         f"{own.prog.split()[-1]}")
            skip = valued and not eq
            continue
        left.append(token)
    return hints, left


def _meant_options(own: argparse.ArgumentParser, extra: list[str]) -> tuple[str, list[str]]:
    """Our options that unknown ones in ``extra`` look like typos of (``"--device for --devce"``, ""
    when none does), and the rest of ``extra`` (llama-server flags given before ``--``, their values)."""
    import difflib

    ours = [o for a in own._actions for o in a.option_strings if o.startswith("--")]
    meant: list[str] = []
    rest: list[str] = []
    typo = False  # the value after a typo'd option goes with it
    for token in extra:
        flag = token.split("=", 1)[0]
        near = difflib.get_close_matches(flag, ours, n=1, cutoff=0.75) if flag.startswith("--") else []
        if near:
            meant.append(f"{near[0]} for {flag}")
        elif not (typo and not token.startswith("-")):
            rest.append(token)
        typo = bool(near) or (typo and not token.startswith("-"))
    return ", ".join(meant), rest


#: the commands whose simulations leave what they keep frozen for the cycle collector when the process
#: runs one and ends: no Qt event loop (the window and ``launch`` run one, with Qt objects to collect)
FREEZING = frozenset({"plan", "fit", "inspect"})


def _run(args: argparse.Namespace, *, freeze: bool) -> int:
    """The command; ``freeze``: this process ends with it (the console script running one of
    :data:`FREEZING`, not a caller of :func:`main`), so what its simulations leave is frozen for the
    cycle collector (:func:`~offload_planner.core.compute.simulate.freezing_after_simulations`)."""
    if not freeze:
        code: int = args.func(args)
        return code
    from offload_planner.core.compute.simulate import freezing_after_simulations

    with freezing_after_simulations():
        code = args.func(args)
        return code


_R = TypeVar("_R")


class _GuardedStdout:
    """Standard output whose write errors other than a closed pipe (a full disk, a quota, EIO)
    become one clear :class:`PlannerError` instead of a traceback from the ``print`` that met them."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._guarded(self._stream.write, text)

    def flush(self) -> None:
        self._guarded(self._stream.flush)

    @staticmethod
    def _guarded(call: Callable[..., _R], *args: object) -> _R:
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise PlannerError(f"cannot write the output (standard output): {e.strerror or e}") from None

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


def _run_printing(args: argparse.Namespace, *, freeze: bool) -> int:
    """:func:`_run` with its output guarded and flushed (a write error is met here, not at exit)."""
    real = sys.stdout
    if real is None:  # started with stdout closed (the window and launch need none)
        if args.command in ("inspect", "plan", "fit"):  # commands whose product is their output
            raise PlannerError(f"standard output is closed: `{args.command}` has nothing to print to "
                               "(redirect it, e.g. > out.txt)")
        return _run(args, freeze=freeze)
    sys.stdout = _GuardedStdout(real)
    try:
        code = _run(args, freeze=freeze)
        sys.stdout.flush()
        return code
    finally:
        sys.stdout = real


#: Words a newcomer types as a command for what is an option of one ("explain" went to the window as a
#: model name: "no display", or "cannot open explain"): the command line that does it.
OPTION_WORDS = {
    "explain": "`offload-planner plan MODEL --explain -- ARGS` lists every buffer with how it was computed",
    "export": "`offload-planner plan MODEL -- ARGS` ends with the llama-server command (the window's Command "
              "tab writes it for bash, PowerShell, cmd.exe, llama-swap or docker env)",
    "bench": "`offload-planner launch MODEL --bench -- ARGS` measures prompt and generation speed",
    "verify": "`offload-planner launch MODEL --verify -- ARGS` checks the projection against llama-server",
    "run": "`offload-planner launch MODEL -- ARGS` runs llama-server",
}


def _mistyped_command(first: str) -> str:
    """The command ``first`` looks like a typo of ("plna" -> "plan"), or an option word's command line
    (:data:`OPTION_WORDS`); "" when it may be a model to open in the window (a path, a URL, a file that
    exists, or nothing like a command)."""
    if first in COMMANDS or first.startswith("-") or any(c in first for c in "/\\.:"):
        return ""  # before any import: `plan` and `fit` pay nothing for this
    import difflib
    import os

    if os.path.exists(first):
        return ""
    if first.lower() in OPTION_WORDS:
        return OPTION_WORDS[first.lower()]
    near = difflib.get_close_matches(first, list(COMMANDS), n=1, cutoff=0.6)
    return f"did you mean {near[0]}?" if near else ""


def _quick_parse(ours: list[str]) -> argparse.Namespace | None:
    """``offload-planner COMMAND ...`` read from the command's recorded options without building its
    parser, where argparse would read them alike and succeed (:mod:`offload_planner.cli_fastparse`);
    None: the parser decides."""
    if not ours or ours[0] not in COMMANDS:
        return None
    from offload_planner.cli_fastparse import Recorder, fast_parse

    rec = Recorder()
    COMMANDS[ours[0]](cast("argparse._SubParsersAction[argparse.ArgumentParser]", rec))
    return fast_parse(rec.parsers[0], ours[1:], ours[0]) if len(rec.parsers) == 1 else None


def main(argv: Sequence[str] | None = None) -> int:
    ours, server_args = split_server_args(list(sys.argv[1:] if argv is None else argv))
    meant = _mistyped_command(ours[0]) if ours else ""
    if meant:  # it went to the window as a model name: "unrecognized arguments: model.gguf"
        print(f"offload-planner: error: unknown command {ours[0]!r}: {meant} (commands: "
              f"{', '.join(COMMANDS)}; `offload-planner MODEL` opens the window)", file=sys.stderr)
        return 2
    quick = _quick_parse(ours)  # plan, fit and launch: their arguments (with `func` and `server_args`)
    parser = build_parser(ours[0] if ours and ours[0] in COMMANDS else None) if quick is None else None
    args = quick or _parse(cast(argparse.ArgumentParser, parser), ours)
    if hasattr(args, "server_args"):
        args.server_args = server_args
    elif server_args and parser is not None:
        parser.error("arguments after -- are for `plan`, `fit` and `launch` only")
    if not getattr(args, "func", None) and parser is not None:
        parser.print_help()
        return 0
    try:
        return _run_printing(args, freeze=argv is None and args.command in FREEZING)
    except PlannerError as e:  # it may quote a file's name or bytes: control characters escaped
        from offload_planner.core.printable import printable

        print(f"offload-planner: error: {printable(str(e), keep_newlines=True)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's 128 + SIGINT (a forked child is reaped)
        print("offload-planner: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
