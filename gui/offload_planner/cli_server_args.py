"""The llama-server arguments after ``--`` as ``plan`` reads them: a leading program name, the
``LLAMA_ARG_*`` environment, and the notes that make every silent change visible.

llama-server reads its environment variables first and then the command line, which wins (with a
warning); ``plan`` does the same with the variables set in its own environment.  A value llama.cpp
changes without a word (``-c 32k`` read as 32, ``-ub`` above ``-b``) becomes a note; a command it
refuses becomes an error, printed alone before anything else.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from offload_planner.core.cmdline import ArgError, ParsedArgs, parse_server_args, semantic_notes
from offload_planner.core.dialects import Dialect
from offload_planner.core.model import Model

ENV_PREFIX = "LLAMA_ARG_"
#: The program name given to the parser (llama-server's argv[0] is never an argument).
PROGRAM = "llama-server"


@dataclass
class ServerArgv:
    """What ``plan`` parsed: the arguments, the program word it dropped, notes and errors."""

    parsed: ParsedArgs
    args: list[str]
    notes: list[str] = field(default_factory=list)


def server_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``LLAMA_ARG_*`` variables llama-server would read from this environment."""
    env = os.environ if environ is None else environ
    return {k: env[k] for k in env if k.startswith(ENV_PREFIX)}  # os.environ decodes what it hands out


def looks_like_program(word: str) -> bool:
    """``llama-server``, ``./build/bin/llama-server``, ``ik-server.exe``, or any executable file
    or command on PATH: a pasted command line's first word, not an argument."""
    name = Path(word).name.lower().removesuffix(".exe")
    if name.endswith(".gguf"):
        return False
    if "server" in name or "llama" in name:
        return True
    path = Path(word)
    return shutil.which(word) is not None or (path.is_file() and os.access(path, os.X_OK))


def read_server_argv(
    argv: Sequence[str], dialect: Dialect, environ: Mapping[str, str] | None = None
) -> ServerArgv:
    """Parse ``argv`` (what follows ``--``) as ``dialect``'s llama-server would, with its
    ``LLAMA_ARG_*`` environment. A first word that names a program is dropped with a note; any
    other word that is not a flag is refused, as llama-server refuses positional arguments."""
    args = list(argv)
    notes: list[str] = []
    if args and not args[0].startswith("-") and looks_like_program(args[0]):
        notes.append(f"{args[0]!r} after `--` is read as the program name and not passed on "
                     "(the dialect comes from --backend)")
        args = args[1:]
    env = server_env(environ)
    parsed = parse_server_args([PROGRAM, *args], dialect=dialect, env=env)
    notes += _env_notes(parsed)
    notes += [_text(w.message, w.explanation) for w in parsed.warnings]
    notes += [_text(w.message, w.explanation) for w in semantic_notes(parsed)]
    return ServerArgv(parsed, args, notes)


def _env_notes(parsed: ParsedArgs) -> list[str]:
    """One note per variable that set something (the command line's own flag overrides it; the
    parser's warning says so)."""
    on_line = {u.key for u in parsed.flags if u.env is None}
    return [
        f"{u.env}={u.values[0] if u.values else ('1' if u.positive else '0')} from the environment, as "
        f"llama-server reads it ({u.spelling}{' ' + ' '.join(u.values) if u.values else ''})"
        for u in parsed.flags
        if u.env is not None and u.key not in on_line
    ]


def _text(message: str, explanation: str) -> str:
    message = message.removeprefix("warn: ").removeprefix("error: ")
    return f"{message} ({explanation})" if explanation else message


def error_lines(errors: Sequence[ArgError | str]) -> list[str]:
    """One line per refusal, llama-server's own words first, our explanation after."""
    return [
        _text(e.message, e.explanation) if isinstance(e, ArgError) else str(e).removeprefix("error: ")
        for e in errors
    ]


def print_errors(errors: Sequence[ArgError | str]) -> int:
    """Errors alone, on stderr: nothing else is printed for a command that would not run."""
    for line in error_lines(errors):
        print(f"offload-planner: error: {line}", file=sys.stderr)
    return 2


def model_flag_note(parsed: ParsedArgs, model: Model) -> str | None:
    """A ``-m`` after ``--`` (or ``LLAMA_ARG_MODEL``) naming another file than the model planned: the
    plan and its command are of MODEL, the -m was dropped without a word (a pasted command for another
    model read as a plan for it). None when it names MODEL or one of its shards, or is not given."""
    named = parsed.args.model
    if not named:
        return None
    shards = [s.path for s in model.shards] or [model.path]
    for path in shards:
        try:
            if os.path.samefile(named, path):
                return None
        except (OSError, ValueError):
            if named == path:
                return None
    return (f"-m {named} is not the model planned: the plan and its command are of {model.path} (the "
            "MODEL argument); to plan the other, give it as MODEL")
