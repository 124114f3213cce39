"""ik_llama.cpp's ``-draft "ARGS"``: the inner command line is parsed onto the draft's parameters when
the draft loads (common/speculative.cpp 1957-1966 at 8337e4cd); what ik refuses there is refused, in
ik's words, naming ``-draft``; what it runs is planned, never hung on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.refusals import refused

import offload_planner

PACKAGE_ROOT = str(Path(offload_planner.__file__).resolve().parents[1])
IK = ["--no-detect", "--device", "CUDA0=24GiB", "--backend", "ik_llama.cpp"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "offload_planner", *args], capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONPATH": PACKAGE_ROOT, **(env or {})})


def draft(small_models: dict[str, Path], *spec: str) -> list[str]:
    return ["plan", str(small_models["llama"]), *IK, "--", "-md", str(small_models["llama-draft"]), *spec]


@pytest.mark.parametrize(("inner", "named"), [
    ("-b 0 -ub 0", "n_batch and n_ubatch cannot both be zero"),
    ("-c -5", "-c -5: a negative size"),
    ("-ub abc", "stoi (-ub abc: expected an integer"),
    ("--bogus", "unknown argument: --bogus"),
    ("-ub", "invalid parameter for argument: -ub"),
])
@pytest.mark.parametrize("flag", ["-draft", "--draft-params"])
def test_what_ik_refuses_inside_draft_is_refused(inner: str, named: str, flag: str,
                                                 small_models: dict[str, Path]) -> None:
    """Each was planned as if the draft loaded (gpt_params_parse throws, or the draft's context cannot
    be made, and the server stops)."""
    r = run(*draft(small_models, "--spec-type", "draft", flag, inner))
    refused(r, 2, named, f'inside {flag} "{inner}"')


def draft_compute(small_models: dict[str, Path], inner: str) -> dict[str, int]:
    r = run("plan", str(small_models["llama"]), *IK, "--json", "--", "-md", str(small_models["llama-draft"]),
            "--spec-type", "draft", "-draft", inner)
    assert r.returncode == 0, r.stderr[-2000:]
    (extra,) = json.loads(r.stdout)["extras"]
    return {dev: figures["compute"] for dev, figures in extra["devices"].items()}


@pytest.mark.parametrize(("inner", "same_as"), [("-b 0", "-b 16 -ub 16"), ("-ub 0", "-b 2048 -ub 2048")])
def test_a_zero_size_inside_draft_is_planned_as_ik_runs_it(inner: str, same_as: str,
                                                           small_models: dict[str, Path]) -> None:
    """ik raises the draft's batch of 0 to GGML_KQ_MASK_PAD, 16 (src/llama.cpp 8169-8171), and a
    micro-batch of 0 is n_batch (8174): the draft's compute buffers were those of the main -b/-ub (0 read
    as not given: 2048 and 512)."""
    assert draft_compute(small_models, inner) == draft_compute(small_models, same_as)


@pytest.mark.parametrize("spec", [[], ["--spec-type", "ngram_simple"]])
def test_draft_params_without_a_loaded_draft_are_not_read(spec: list[str],
                                                         small_models: dict[str, Path]) -> None:
    """No stage that needs the draft model: ik never loads it nor parses -draft (speculative.cpp 2110)."""
    r = run(*draft(small_models, *spec, "-draft", "--bogus"))
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_draft_stage_with_draft_params_and_no_model_is_refused(small_models: dict[str, Path]) -> None:
    """has_dft() is -md or -draft (common/common.h 265-267): the draft loads from -md's path, "" here,
    unless the inner command line gives -m (speculative.cpp 1952, 1990-1993): the server stops."""
    r = run("plan", str(small_models["llama"]), *IK, "--", "--spec-type", "draft", "-draft", "-b 64")
    refused(r, 2, "failed to load draft model ''", 'no -md, and -draft "-b 64" has no -m')


@pytest.mark.parametrize("md", [False, True])
def test_an_inner_m_is_the_draft_ik_loads_and_the_plan_projects(md: bool,
                                                                 small_models: dict[str, Path]) -> None:
    """ik loads the -m inside -draft over -md (speculative.cpp 1952-1966); the plan projected the -md file
    (or no draft) and said so; it now projects that file, as -md with the same settings would."""
    other = str(small_models["llama"])  # not the -md file
    given = ["-md", str(small_models["llama-draft"])] if md else []
    r = run("plan", str(small_models["llama"]), *IK, "--", *given, "--spec-type", "draft",
            "--draft-params", f"-m {other}")
    assert r.returncode == 0, r.stderr[-2000:]
    instead = f", not the -md file {small_models['llama-draft']}" if md else ""
    assert (f'note: --draft-params "-m {other}": ik loads {other} as the draft model (the -m inside '
            f"--draft-params wins over -md); the plan projects it{instead}") in r.stdout, r.stdout
    assert "+ draft model llama.gguf:" in r.stdout, r.stdout
    same = run("plan", str(small_models["llama"]), *IK, "--", "-md", str(small_models["llama-draft"]),
               "--spec-type", "draft", "-draft", f"-m {small_models['llama-draft']}")
    assert same.returncode == 0 and "ik loads" not in same.stdout


def test_an_inner_m_projects_as_md_would(small_models: dict[str, Path]) -> None:
    """``-draft "-m FILE -ngl 0"`` without -md: the draft's buffers of ``-md FILE -ngld 0``."""
    d = str(small_models["llama-draft"])
    inner = _draft_json(small_models, "--spec-type", "draft", "-draft", f"-m {d} -ngl 0")
    md = _draft_json(small_models, "-md", d, "-ngld", "0", "--spec-type", "draft", "-draft", "-ngl 0")
    assert inner == md and inner["CUDA0"]["model"] == 0 and inner["CPU"]["model"] > 0, inner


def _draft_json(small_models: dict[str, Path], *spec: str, env: dict[str, str] | None = None
                ) -> dict[str, dict[str, int]]:
    """The draft's buffers by device and kind (``plan --json``'s extras), the main -c 4096."""
    r = run("plan", str(small_models["llama"]), *IK, "--json", "--", "-c", "4096", *spec, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    (extra,) = json.loads(r.stdout)["extras"]
    return {dev: figures for dev, figures in extra["devices"].items()}


def test_the_environment_is_applied_again_to_the_draft_params(small_models: dict[str, Path]) -> None:
    """ik parses ``-draft "ARGS"`` with ``gpt_params_parse``, which reads the ``LLAMA_ARG_*`` variables
    first (common/common.cpp 829-830) onto the draft's copy, after -ngld/-ctkd/-md were set on it
    (common/speculative.cpp 1946-1966): the environment's -ngl replaces -ngld, its -c the main -c;
    ARGS win over both. Without -draft the environment is not read again. The planner parsed ARGS
    with no environment (the draft stayed on CUDA0)."""
    env = {"LLAMA_ARG_N_GPU_LAYERS": "0"}
    md = ("-md", str(small_models["llama-draft"]), "--spec-type", "draft", "-ngld", "99")
    on_gpu = _draft_json(small_models, *md, env=env)
    assert on_gpu["CUDA0"]["model"] > 0  # no -draft: -ngld 99 holds
    on_cpu = _draft_json(small_models, *md, "-draft", "-b 64", env=env)
    assert on_cpu["CUDA0"]["model"] == 0 and on_cpu["CUDA0"]["kv"] == 0, on_cpu
    back = _draft_json(small_models, *md, "-draft", "-b 64 -ngl 99", env=env)
    assert back["CUDA0"]["model"] == on_gpu["CUDA0"]["model"]
    # LLAMA_ARG_CTX_SIZE: the main -c 4096 wins for the main model, the variable for the draft
    short = _draft_json(small_models, *md, "-draft", "-b 64", env={"LLAMA_ARG_CTX_SIZE": "1024"})
    assert short["CUDA0"]["kv"] * 4 == on_gpu["CUDA0"]["kv"], (short, on_gpu)


def test_llama_arg_model_replaces_md_when_draft_params_are_parsed(small_models: dict[str, Path]) -> None:
    """``LLAMA_ARG_MODEL`` is applied again too: with ``-draft`` ik loads that file as the draft model."""
    main = str(small_models["llama"])
    r = run(*draft(small_models, "--spec-type", "draft", "-draft", "-b 64"), env={"LLAMA_ARG_MODEL": main})
    assert r.returncode == 0, r.stderr[-2000:]
    assert (f'note: -draft "-b 64": ik loads {main} as the draft model (LLAMA_ARG_MODEL, which ik applies '
            "again when it parses -draft (common/common.cpp 829-830), wins over -md)") in r.stdout, r.stdout


def test_a_bad_variable_is_refused_once(small_models: dict[str, Path]) -> None:
    """The main parse stops at it (outside ik's try block); the -draft parse never runs."""
    r = run(*draft(small_models, "--spec-type", "draft", "-draft", "-b 64"), env={"LLAMA_ARG_UBATCH": "abc"})
    assert r.returncode == 2 and r.stderr.count("LLAMA_ARG_UBATCH=abc") == 1, r.stderr
