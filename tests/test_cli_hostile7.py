"""Hostile input against the newer surface (-dev/-devd, the speculative flags, -b/-ub, plan files,
speed.json): one clear line naming the flag, file or key, an exit code, never a traceback or a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.cli import PACKAGE_ROOT, run_cli
from tests.support.refusals import refused

TWO_GPUS = ["--no-detect", "--device", "CUDA0=24GiB", "--device", "CUDA1=24GiB"]


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=timeout)


@pytest.mark.parametrize("command", ["plan", "fit"])
def test_b_0_is_refused_by_the_pinned_build_not_walked(command: str, small_models: dict[str, Path]) -> None:
    """``-b 0``: the speed estimate walked the prompt in micro-batches of 0 tokens and never ended. The
    pinned server aborts on it (tests/integration/test_batch_zero.py); the planner says so."""
    r = run(command, str(small_models["llama"]), *TWO_GPUS, "--", "-b", "0")
    refused(r, 2, "-b 0: n_batch and n_ubatch", "GGML_ASSERT(n_outputs >= 1)")


@pytest.mark.parametrize("backend", ["llama.cpp", "ik_llama.cpp", "llama.cpp-2025"])
def test_b_0_with_ub_0_is_refused_by_every_build(backend: str, small_models: dict[str, Path]) -> None:
    r = run("plan", str(small_models["llama"]), "--no-detect", "--backend", backend, "--",
            "-b", "0", "-ub", "0")
    refused(r, 2, "-b 0 with -ub 0", "cannot both be zero")


@pytest.mark.parametrize(("backend", "floor"), [("ik_llama.cpp", 16), ("ik_llama.cpp-2025", 32),
                                                ("llama.cpp-2025", 64)])
def test_b_0_runs_where_the_build_raises_the_batch(backend: str, floor: int,
                                                   small_models: dict[str, Path]) -> None:
    """ik and the 2025 mainline builds raise an n_batch below their KQ mask padding to it ("n_batch is
    less than GGML_KQ_MASK_PAD - increasing to N"): -b 0 is planned with that batch, in a moment."""
    r = run("plan", str(small_models["llama"]), "--no-detect", "--backend", backend, "--json", "--",
            "-c", "1100", "-b", "0")
    assert r.returncode == 0, r.stderr[-2000:]
    ctx = json.loads(r.stdout)["context"]
    assert (ctx["n_batch"], ctx["n_ubatch"]) == (floor, floor)


def test_llama_arg_batch_0_names_the_variable(small_models: dict[str, Path]) -> None:
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT, "LLAMA_ARG_BATCH": "0"}
    r = subprocess.run([sys.executable, "-m", "offload_planner", "plan", str(small_models["llama"]),
                        "--no-detect"], capture_output=True, text=True, timeout=30, env=env)
    refused(r, 2, "LLAMA_ARG_BATCH 0:", "GGML_ASSERT(n_outputs >= 1)")


@pytest.mark.parametrize(("args", "named"), [
    (["-ts", ""], 'error while handling argument "-ts": stof'),
    (["-fitt", ""], 'error while handling argument "-fitt": stoull'),
    (["--backend-ik", "-ts", ""], "stof (-ts : expected a number)"),
])
def test_an_empty_list_value_is_one_empty_item(args: list[str], named: str,
                                               small_models: dict[str, Path]) -> None:
    """``-ts ""`` and ``-fitt ""`` were read as no list at all; the server's regex split yields the
    whole (empty) text as one item, and std::stof / std::stoull refuse it (seen on the real server:
    'error while handling argument "-ts": stof'). A trailing separator (``-ts 1,``) still adds none."""
    ours = ["--backend", "ik_llama.cpp"] if args[0] == "--backend-ik" else []
    r = run("plan", str(small_models["llama"]), *TWO_GPUS, *ours, "--", *args[1 if ours else 0:])
    refused(r, 2, named)
    ok = run("plan", str(small_models["llama"]), *TWO_GPUS, "--", "-ts", "1,", "-c", "512")
    assert ok.returncode == 0, ok.stderr[-2000:]


@pytest.mark.parametrize(("args", "named"), [
    (["-dev", "CPU"], '"-dev": invalid device: CPU'),
    (["-dev", "cuda0,cpu"], '"-dev": invalid device: CPU'),
    (["-md", "DRAFT", "-devd", "CPU"], '"-devd": invalid device: CPU'),
    (["-mmdev", "foo"], '"-mmdev": invalid device: foo'),
    (["-mmdev", "CPU"], '"-mmdev": invalid device: CPU'),
    (["-mmdev", "CUDA0,CUDA1"], '"-mmdev": only one device may be specified for mmproj'),
])
def test_device_names_the_pinned_server_refuses(args: list[str], named: str,
                                                small_models: dict[str, Path]) -> None:
    """The pinned build's parse_device_list refuses a CPU-type device and -mmdev takes one device, with
    or without a projector (seen on the real server for CPU and foo). ``-dev CPU`` was planned as
    ``-dev none`` and -mmdev was not read at all (the projector silently went to the CPU)."""
    args = [str(small_models["llama-draft"]) if a == "DRAFT" else a for a in args]
    line = refused(run("plan", str(small_models["llama"]), *TWO_GPUS, "--", *args), 2, named)
    if "invalid device" in line:
        assert "known devices: ['CUDA0', 'CUDA1']" in line


def test_an_empty_device_list_item_is_one_error(small_models: dict[str, Path]) -> None:
    """``-dev ,``: two empty names gave the same line twice; the server stops at the first."""
    r = run("plan", str(small_models["llama"]), *TWO_GPUS, "--", "-dev", ",")
    refused(r, 2, '"-dev": invalid device: ')


@pytest.mark.parametrize(("args", "named"), [
    (["--spec-draft-p-split", "abc"], 'error while handling argument "--spec-draft-p-split": stof'),
    (["--draft-p-split", ""], 'error while handling argument "--draft-p-split": stof'),
    (["--temp", "abc"], 'error while handling argument "--temp": stof'),
    (["--seed", "abc"], 'error while handling argument "--seed": stoul'),
])
def test_kept_flags_read_as_numbers_are_refused_when_they_are_none(args: list[str], named: str,
                                                                   small_models: dict[str, Path]) -> None:
    """Kept verbatim, these were never read: exit 0 for a command the server refuses at once
    (tests/integration/test_float_flags_vs_server.py runs it for each such flag)."""
    refused(run("plan", str(small_models["llama"]), "--no-detect", "--", *args), 2, named)


@pytest.mark.parametrize(("model", "accept", "spec"), [
    ("llama", [], ["-md", "DRAFT", "--spec-type", "draft-simple", "--spec-draft-n-max", "2147483647"]),
    ("llama", ["--spec-accept", "len=3"],
     ["-md", "DRAFT", "--spec-type", "draft-simple", "--spec-draft-n-max", "2147483647"]),
    ("llama", ["--spec-accept", "ratio=0.7"],
     ["-md", "DRAFT", "--spec-type", "draft-simple", "--spec-draft-n-max", "2147483647"]),
    ("deepseek2-mtp", [], ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2147483647"]),
    ("llama", ["--backend", "ik_llama.cpp"], ["-md", "DRAFT", "--spec-type", "draft:n_max=2147483647"]),
])
def test_the_largest_draft_length_is_estimated_at_once(model: str, accept: list[str], spec: list[str],
                                                       small_models: dict[str, Path]) -> None:
    """The expected tokens a step (1 + a + ... + a^n) and the acceptance a llama-server figure
    implies were summed term by term: --spec-draft-n-max 2147483647 ran for minutes."""
    spec = [str(small_models["llama-draft"]) if a == "DRAFT" else a for a in spec]
    r = run("plan", str(small_models[model]), "--no-detect", *accept, "--", *spec, "-c", "2048", timeout=20)
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("speed estimate"))
    assert " t/s at depth 0" in line and "without speculative decoding" in line, line


@pytest.mark.parametrize("command", ["plan", "fit"])
def test_more_sequences_than_llama_cpp_takes_are_refused(command: str, small_models: dict[str, Path]) -> None:
    """-np 100000 was planned (0 cells a sequence; fit took a plan) though llama.cpp refuses more than
    LLAMA_MAX_SEQ = 256 sequences when it creates the context, and a plan of it could not be saved
    (the plan file takes 1..256); ik has no such limit."""
    r = run(command, str(small_models["qwen3moe"]), *TWO_GPUS, "--", "-np", "100000")
    refused(r, 2, "-np 100000: llama.cpp takes at most 256 sequences", "n_seq_max must be <= 256")
    ok = run("plan", str(small_models["qwen3moe"]), *TWO_GPUS, "--", "-np", "256", "-c", "65536")
    assert ok.returncode == 0, ok.stderr[-2000:]
    ik = run("plan", str(small_models["qwen3moe"]), *TWO_GPUS, "--backend", "ik_llama.cpp", "--",
             "-np", "300")
    assert ik.returncode == 0, ik.stderr[-2000:]
