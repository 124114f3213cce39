"""Every command that takes --device names, in its --help, every key a declaration takes: the help
listed "CPU: ram=12xDDR5-4800, threads=N; RPC: link=10Gb/s" while cores= and ghz= (the CPU's compute,
which the README tells a newcomer to declare) and an RPC device's threads= were accepted but nowhere
in the help."""

from __future__ import annotations

import re

import pytest
from tests.test_cli_plan_input import run

from offload_planner.core.speed.declared import HARDWARE_KEYS


@pytest.mark.parametrize("command", ["plan", "fit", "launch", "gui"])
def test_the_device_help_names_every_key(command: str) -> None:
    r = run(command, "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())  # argparse wraps the help at any space
    keys = set(HARDWARE_KEYS) - {"bandwidth"} | {"free", "margin"}  # "bandwidth": bw='s long spelling
    missing = [k for k in sorted(keys) if not re.search(rf"\b{k}=", text)]
    assert not missing, missing
    assert re.search(r"RPC: [^;]*threads=", text)
