"""The command and environment llama-server is launched with: the model, ``--host``/``--port``
when the arguments do not set them, ``-lv 4`` for the pinned build (its buffer sizes are logged only
at verbosity 4) unless the user turned that off, and an optional wrapper (``numactl
--interleave=all``) as a prefix; ``--env`` assignments applied to the child's environment."""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from offload_planner.core.cmdline import Dialect, ParsedArgs, parse_server_args
from offload_planner.core.errors import PlannerError

KNOWN_ENV = {
    "CUDA_VISIBLE_DEVICES": "GPUs llama-server may see, in CUDA order (e.g. 0,1)",
    "GGML_OP_OFFLOAD_MIN_BATCH": "smallest batch for which weights in RAM are copied to the GPU (default 32)",
}
DEFAULT_PORT = 8080




@dataclass(frozen=True)
class LaunchCommand:
    """What the runner starts: ``program arguments`` (the wrapper, if any, then the server)."""

    program: str
    arguments: tuple[str, ...]
    server: str
    server_args: tuple[str, ...]  # the server's own arguments as launched
    dialect: Dialect
    host: str
    port: int | None
    health_url: str | None
    notes: tuple[str, ...] = ()
    parsed: ParsedArgs | None = None

    @property
    def argv(self) -> list[str]:
        return [self.program, *self.arguments]


#: How the -lv 4 note says to turn it off: the Launch tab's box (launch's words: --no-verbose-log).
VERBOSE_OFF = 'turn off "verbose log"'

def _connect_host(host: str) -> str:
    """The host of the URL to reach a server listening on ``host``: loopback for the wildcard addresses,
    an IPv6 address in brackets (``--host ::1``: ``http://[::1]:8080``, as llama-server logs it)."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def build_command(
    server: str,
    server_args: Sequence[str],
    *,
    dialect: Dialect = Dialect.LLAMA_CPP,
    model: str | None = None,
    host: str | None = "127.0.0.1",
    port: int | None = None,
    verbose_log: bool = True,
    extra_args: Sequence[str] = (),
    wrapper: Sequence[str] = (),
) -> LaunchCommand:
    """The argument list for ``server``: the arguments, then ``-m model`` unless they name one, ``--host``/
    ``--port`` unless they set them, ``-lv 4`` for the pinned build (it logs buffer sizes only at
    verbosity 4) unless ``verbose_log`` is off or the arguments set a verbosity; ``notes`` say what was
    added and why.  ``wrapper`` (an argument list such as ``["numactl", "--interleave=all"]``) goes
    in front; nothing passes through a shell."""
    dialect = Dialect(dialect)
    args = [*server_args, *extra_args]
    parsed = parse_server_args(args, dialect=dialect)
    notes: list[str] = []
    prefix: list[str] = []
    if model and parsed.args.model is None:
        prefix += ["-m", model]
    if parsed.args.host is None and host:
        prefix += ["--host", host]
    eff_host = parsed.args.host or host or "127.0.0.1"
    eff_port = parsed.args.port if parsed.args.port is not None else port
    if parsed.args.port is None and port is not None:
        prefix += ["--port", str(port)]
    verbosity = parsed.args.verbosity
    if dialect.logs_buffers_at_verbosity_4:
        if verbosity is None and verbose_log:
            prefix += ["-lv", "4"]
            notes.append("added -lv 4: this llama-server logs its buffer sizes only at verbosity 4 "
                         f"({VERBOSE_OFF} to launch the command exactly as written)")
        elif verbosity is not None and verbosity < 4:
            notes.append(f"-lv {verbosity}: this llama-server will not log buffer sizes, so there is "
                         "nothing to compare with the projection")
        elif verbosity is None:
            notes.append("verbose log off: this llama-server will not log buffer sizes, so there is "
                         "nothing to compare with the projection")
    launched = [*args, *prefix]  # after the user's arguments: a wrapper script sees them as its own
    url_port = eff_port if eff_port is not None else DEFAULT_PORT
    health = None if eff_host.endswith(".sock") else f"http://{_connect_host(eff_host)}:{url_port}/health"
    if wrapper:
        program = shutil.which(wrapper[0]) or wrapper[0]
        arguments = (*wrapper[1:], server, *launched)
        notes.append("wrapper: " + " ".join(wrapper))
    else:
        program, arguments = server, tuple(launched)
    return LaunchCommand(program, tuple(arguments), server, tuple(launched), dialect, eff_host, eff_port,
                         health, tuple(notes), parsed)


def parse_env_assignments(items: Sequence[str]) -> dict[str, str | None]:
    """``["CUDA_VISIBLE_DEVICES=0,1", "FOO="]``: an empty value removes the variable."""
    out: dict[str, str | None] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise PlannerError(f"--env {item!r}: expected NAME=VALUE")
        out[key] = value if value else None
    return out


def child_environment(base: Mapping[str, str], overrides: Mapping[str, str | None]) -> dict[str, str]:
    env = dict(base)
    for k, v in overrides.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env
