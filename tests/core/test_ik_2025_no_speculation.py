"""ik_llama.cpp builds before July 2025 (the ``ik_llama.cpp-2025`` and ``-2025-05`` dialects) had no
speculative decoding in llama-server: PR 645 (2025-08-15) ported it there, and the stages
(``--spec-type``) came after. Their ``gpt_params_find_arg`` (read at 639aee23c, 2025-05-25, and
305fe4b16, 2025-06-27) knew, of the speculative flags, only ``-td``, ``-tbd``, ``--draft N``,
``-ps/--p-split``, ``-md/--model-draft`` and ``-ngld/--gpu-layers-draft``; anything else is
"error: unknown argument". The dialects took ``--spec-type`` and the rest of the current table
(leftovers4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import offload_planner
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.dialects import IK, IK_2025, IK_2025_05, Dialect

QWEN = str(Path(__file__).resolve().parents[2] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
PACKAGE_ROOT = str(Path(offload_planner.__file__).resolve().parents[1])

#: (argv, the flag ik refuses): spellings of the current ik parser absent from the 2025 ones
ABSENT = [
    (["--spec-type", "draft"], "--spec-type"),
    (["--spec-type", "mtp:n_max=1"], "--spec-type"),
    (["--spec-stage", "x"], "--spec-stage"),
    (["--draft-max", "4"], "--draft-max"),
    (["--draft-n", "4"], "--draft-n"),
    (["--draft-min", "1"], "--draft-min"),
    (["--draft-p-min", "0.5"], "--draft-p-min"),
    (["-cd", "512"], "-cd"),
    (["-ctkd", "q8_0"], "-ctkd"),
    (["-ctvd", "q8_0"], "-ctvd"),
    (["-devd", "CUDA0"], "-devd"),
    (["-draft", "-c 512"], "-draft"),
    (["--n-gpu-layers-draft", "9"], "--n-gpu-layers-draft"),
    (["-mtp"], "-mtp"),
    (["-no-mtp"], "-no-mtp"),
    (["--spec-ngram-size-n", "3"], "--spec-ngram-size-n"),
    (["--spec-autotune"], "--spec-autotune"),
    (["--spec-replace", "a", "b"], "--spec-replace"),
    (["--suffix-corpus", "x"], "--suffix-corpus"),
]
#: what those builds took (and their server ignored)
KEPT = [["--draft", "5"], ["-md", "draft.gguf"], ["--model-draft", "d.gguf"], ["-ngld", "99"],
        ["--gpu-layers-draft", "9"], ["-ps", "0.1"], ["--p-split", "0.1"], ["-td", "2"], ["-tbd", "2"]]


@pytest.mark.parametrize("dialect", [IK_2025, IK_2025_05])
@pytest.mark.parametrize(("argv", "flag"), ABSENT)
def test_the_speculative_flags_are_unknown_arguments(dialect: Dialect, argv: list[str], flag: str) -> None:
    parsed = parse_server_args(["-c", "1024", *argv], dialect=dialect)
    assert parsed.errors and parsed.errors[0].message == f"error: unknown argument: {flag}"  # ik stops there
    assert "no speculative decoding before PR 645" in parsed.errors[0].explanation
    assert parsed.args.draft.types == []


@pytest.mark.parametrize("dialect", [IK_2025, IK_2025_05])
@pytest.mark.parametrize("argv", KEPT)
def test_the_flags_of_that_parser_are_still_taken(dialect: Dialect, argv: list[str]) -> None:
    assert parse_server_args(["-c", "1024", *argv], dialect=dialect).errors == []


def test_the_current_ik_takes_them_as_before() -> None:
    assert parse_server_args(["--spec-type", "draft", "-md", "d.gguf", "-cd", "512"], dialect=IK).errors == []
    legacy = parse_server_args(["--draft", "5"], dialect=IK).errors
    assert [e.message for e in legacy] == ["legacy speculative option '--draft' is disabled"]


@pytest.mark.parametrize("backend", ["ik_llama.cpp-2025", "ik_llama.cpp-2025-05"])
def test_plan_refuses_spec_type_in_one_line(backend: str) -> None:
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT}
    r = subprocess.run([sys.executable, "-m", "offload_planner", "plan", QWEN, "--no-detect",
                        "--backend", backend, "--", "-c", "4096", "--spec-type", "draft", "-md", QWEN],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, env=env)
    assert r.returncode == 2, r.stdout[-1000:]
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("offload-planner: error: unknown argument: --spec-type (not a flag of "
                               "ik_llama.cpp")
