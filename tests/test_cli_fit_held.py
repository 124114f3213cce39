"""fit keeps the command's -ot rules, so `-ot exps=CPU` keeps every routed expert on the CPU: all its
candidates had the same tg (30.46 t/s) with 21 GiB of an RTX 3090 left empty, and nothing said why (the
window's Fastest plan says it: "... stay on CPU by the command's -ot rules ...").  fit says it too, in
its notes (text and --json)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import run_cli

QWEN = str(Path(__file__).resolve().parents[1] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
HELD = ("144 routed-expert tensors stay on CPU by the command's -ot rules (the search keeps your rules: "
        "remove one to let it place those experts)")
ARGS = ("fit", QWEN, "--no-detect", "--device", "CUDA0=rtx3090")


def test_fit_says_which_experts_the_command_s_rules_hold() -> None:
    r = run_cli(*ARGS, "--", "-c", "16384", "-ngl", "99", "-ot", "exps=CPU", timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"note: {HELD}" in r.stdout.splitlines()
    j = run_cli(*ARGS, "--json", "--", "-c", "16384", "-ngl", "99", "-ot", "exps=CPU", timeout=120)
    assert HELD in json.loads(j.stdout)["notes"]
    free = run_cli(*ARGS, "--", "-c", "16384", timeout=120)  # no rule of the user's: no such note
    assert free.returncode == 0 and "by the command's -ot rules" not in free.stdout
