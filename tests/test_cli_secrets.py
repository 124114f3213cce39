"""`plan` and `fit` print the command as the user's copy, with a secret's value as given, and say so;
nothing else they print quotes it."""

from __future__ import annotations

from pathlib import Path

from tests.test_cli_plan_input import GPUS, QWEN, run


def test_plan_keeps_the_key_in_its_command_and_says_so(tmp_path: Path) -> None:
    r = run("plan", QWEN, *GPUS, "--", "-c", "8192", "--api-key", "sekrit", "-hft", "other",
            env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1].startswith("llama-server ") and lines[-1].endswith("--api-key sekrit -hft other")
    assert sum("sekrit" in ln for ln in lines) == 1  # only the command
    assert ("note: the command carries the value of --api-key, -hft as given (the copy is yours: it "
            "must run)") in r.stdout


def test_plan_without_a_secret_says_nothing_of_it(tmp_path: Path) -> None:
    r = run("plan", QWEN, *GPUS, "--", "-c", "8192", "--api-key-file", "/k",
            env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "carries the value" not in r.stdout
