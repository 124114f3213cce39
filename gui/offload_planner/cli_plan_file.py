"""``offload-planner launch FILE.plan.json``: the command a plan file would launch is printed in
full, with the arguments that expose the server, write files, run tools or reach other machines
named, and it runs only when the user says yes (or passed ``--yes``)."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import TextIO

from offload_planner.core.dialects import Dialect
from offload_planner.core.errors import PlannerError


def wrapper_words(text: str) -> list[str]:
    """``--wrapper`` split as a shell would (PlannerError naming the option where it cannot be)."""
    try:
        return shlex.split(text)
    except ValueError as e:  # No closing quotation / No escaped character
        raise PlannerError(f"--wrapper {text!r}: {e}") from None


def plan_file_command(args: argparse.Namespace, after: list[str]) -> tuple[str, list[str], Dialect]:
    """(model path, server arguments, dialect) of the plan file ``args.model``; ``after`` (the
    arguments after ``--``) are appended. PlannerError for a bad file or a model that is not a
    local regular file."""
    from offload_planner.core.loadable import open_loadable
    from offload_planner.core.plan import plan_command
    from offload_planner.core.plan_file import load_plan, require_regular_file

    pf = load_plan(args.model)
    if pf.model_is_url:
        raise PlannerError(
            f"{args.model}: the plan's model is a URL ({pf.model_path}); llama-server needs a local file"
        )
    require_regular_file(pf.model_path, f"{args.model}: the plan's model")
    plan, _notes = pf.to_plan(open_loadable(pf.model_path))
    return pf.model_path, [*plan_command(plan), *after], plan.dialect


def plan_file_launch(args: argparse.Namespace, after: list[str], err: TextIO) -> tuple[str, list[str]] | None:
    """Print the plan file's whole command and what to look at; (model, server arguments) once
    the user agrees or ``--yes`` was given, None when the launch is refused."""
    from offload_planner.backend import launch
    from offload_planner.core.arg_safety import masked, review_args
    from offload_planner.core.cmdline import format_command
    from offload_planner.core.printable import printable

    model, server_args, dialect = plan_file_command(args, after)
    port = args.port if args.port is not None else None
    cmd = launch.build_command(
        args.server or "llama-server",
        server_args,
        dialect=dialect,
        model=model,
        host=args.host,
        port=port,
        verbose_log=not args.no_verbose_log,
        wrapper=wrapper_words(args.wrapper),
    )
    env = {k: v for k, v in launch.parse_env_assignments(args.env).items() if v is not None}
    concerns = review_args(cmd.server_args, dialect, env=env)
    err.write(  # a hostile file name or value must not act on the terminal: its controls escaped
        f"offload-planner: the plan file {printable(str(args.model))} launches:\n  "
        f"{format_command(masked(cmd.argv), 'bash')}\n"
    )
    for c in concerns:
        err.write(f"offload-planner: look at {printable(c.line())}\n")
    err.flush()
    if args.yes:
        return model, server_args
    if not sys.stdin.isatty():
        err.write("offload-planner: not launched: the command comes from a file; pass --yes to launch it\n")
        return None
    answer = input("Launch it? [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        err.write("offload-planner: not launched\n")
        return None
    return model, server_args
