"""Entry point: parse a llama-server command line for one dialect."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from offload_planner.core.cmdline.model import ParsedArgs, TensorOverride
from offload_planner.core.dialects.base import Dialect


def split_program(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """``argv[0]`` is taken as the program when it is not a flag (llama-server has no positionals)."""
    if argv and not argv[0].startswith("-"):
        return argv[0], list(argv[1:])
    return None, list(argv)


def parse_server_args(
    argv: Sequence[str], *, dialect: Dialect = Dialect.LLAMA_CPP, env: Mapping[str, str] | None = None
) -> ParsedArgs:
    """Read ``argv`` (with or without the program name) the way that dialect's llama-server would.

    ``env`` are environment variables (``LLAMA_ARG_*``); llama-server applies them before the
    command line.  Nothing is executed and no device is probed: refusals that depend on devices
    or on the model are in :func:`offload_planner.core.cmdline.semantics.check_semantics`.
    """
    dialect = Dialect(dialect)
    program, args = split_program(argv)
    parsed = ParsedArgs(dialect=dialect, program=program)
    environment = dict(env or {})
    return dialect.parse(args, environment, parsed)


def effective_overrides(parsed: ParsedArgs, moe_layers: Sequence[int] | None = None) -> list[TensorOverride]:
    """The override list llama-server ends up with, in match order (first match wins).

    Mainline: exactly ``parsed.args.overrides`` (``--cpu-moe``/``--n-cpu-moe`` are expanded at their
    command-line position).  ik_llama.cpp: the user's ``-ot`` entries, then the ``--n-cpu-moe``
    layers chosen from ``moe_layers`` (trunk layers with routed experts; none are added when it is
    None); with ``-ngl 0`` ik drops them all.
    """
    return parsed.dialect.effective_overrides(parsed, moe_layers)
