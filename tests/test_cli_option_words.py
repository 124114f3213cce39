"""A newcomer types what the README calls a feature as a command: `offload-planner explain MODEL`,
`export`, `bench`. They went to the window as a model name ("no display" without one, else a file
that does not open; `explain` was "did you mean plan?", which planned without the explanation). Each is
refused naming the command line that does it."""

from __future__ import annotations

import pytest
from tests.test_cli_plan_input import QWEN, refused, run

TAIL = " (commands: inspect, gui, plan, launch, fit; `offload-planner MODEL` opens the window)\n"


@pytest.mark.parametrize(("typed", "said"), [
    ("explain", "`offload-planner plan MODEL --explain -- ARGS` lists every buffer with how it was computed"),
    ("export", "`offload-planner plan MODEL -- ARGS` ends with the llama-server command (the window's "
               "Command tab writes it for bash, PowerShell, cmd.exe, llama-swap or docker env)"),
    ("Bench", "`offload-planner launch MODEL --bench -- ARGS` measures prompt and generation speed"),
    ("verify", "`offload-planner launch MODEL --verify -- ARGS` checks the projection against llama-server"),
    ("run", "`offload-planner launch MODEL -- ARGS` runs llama-server"),
])
def test_an_option_typed_as_a_command_names_its_command_line(typed: str, said: str) -> None:
    err = refused(run(typed, QWEN, "--", "-c", "4096"))
    assert err == f"offload-planner: error: unknown command {typed!r}: {said}{TAIL}"


def test_launch_help_gives_its_defaults() -> None:
    """`launch --help` listed --timeout TIMEOUT, --stop-timeout, --bench-prompt N and --bench-gen N with
    no default or unit: a newcomer could not tell how long a 671B load may take before it gives up."""
    r = run("launch", "--help")
    text = " ".join(r.stdout.split())  # argparse wraps to the terminal's width
    assert r.returncode == 0
    assert "--timeout SECONDS seconds to wait for the server to listen (default 600: a big model loads for " \
           "minutes)" in text
    assert "--stop-timeout SECONDS seconds between SIGTERM and SIGKILL (default 10)" in text
    assert "--bench-prompt N prompt tokens for --bench (default 512)" in text
    assert "--bench-gen N generated tokens for --bench (default 64)" in text
