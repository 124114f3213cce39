"""``-td``/``-tbd``: a ``-md`` draft model's threads.  The pinned build takes the draft's ``cpuparams``
from ``-td``, else ``-t``, and its ``cpuparams_batch`` from ``-tbd``, else the target's batch
threads (common/arg.cpp:889-890 ``postprocess_cpu_params(params.speculative.draft.cpuparams_batch,
&params.cpuparams_batch)``: not ``-td``'s, whatever ``-tbd``'s help says), and gives both to the draft
model's context only (common/speculative.cpp:2553-2555 inside ``if (has_draft)``); ik_llama.cpp builds
the draft's context from the target's command line (common/speculative.cpp:1946) and reads neither.

So a draft pass over one token runs as with ``-t`` of ``-td``'s count and the draft's batch (its
catch-up over the verified tokens) as with ``-tb`` of ``-tbd``'s: every expected figure here is the
estimate of the same command with ``-t``/``-tb`` instead, never a number worked out by the code
under test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from offload_planner.cli import main

#: another machine's CPU (its RAM declared: no probe of this one), 16 physical cores
CPU16 = "CPU=64GiB,ram=2xDDR5-4800,cores=16"


def _spec(capsys: pytest.CaptureFixture[str], models: dict[str, Path], backend: str,
          *server: str) -> dict[str, Any]:
    draft = ["-md", str(models["llama-draft"])]
    draft += ["--spec-type", "draft-simple" if backend == "llama.cpp" else "draft"]
    argv = ["plan", str(models["llama"]), "--no-detect", "--device", CPU16, "--backend", backend, "--json",
            "--", "-c", "1024", *draft, *server]
    assert main(argv) == 0
    speed: dict[str, Any] = json.loads(capsys.readouterr().out)["speed"]
    assert speed["speculative"] is not None, speed
    spec: dict[str, Any] = speed["speculative"]
    return spec


def _slack(spec: dict[str, Any]) -> float:
    """What JSON's rounding of each ms to 4 places can move :func:`_catch_up` by."""
    return 5e-5 * (2 + spec["n_draft"]) + 1e-9


def _catch_up(spec: dict[str, Any]) -> float:
    """The draft's batch over the verified tokens: a step less its verify and its one-token drafts."""
    return float(spec["step_ms"] - spec["verify_ms"] - spec["n_draft"] * spec["draft_ms"])


def test_td_sets_the_drafts_one_token_pass(small_models: dict[str, Path],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    plain = _spec(capsys, small_models, "llama.cpp", "-t", "8")
    td = _spec(capsys, small_models, "llama.cpp", "-t", "8", "-td", "1")
    one = _spec(capsys, small_models, "llama.cpp", "-t", "1", "-tb", "8")
    assert one["draft_ms"] != plain["draft_ms"]  # threads matter for this draft
    assert td["draft_ms"] == one["draft_ms"]  # a draft token: -td's one thread
    assert td["verify_ms"] == plain["verify_ms"]  # the target keeps -t 8
    # the draft's batch takes the target's batch threads (-tb, else -t), not -td's
    assert _catch_up(td) == pytest.approx(_catch_up(plain), abs=_slack(td))


def test_tbd_sets_the_drafts_batch(small_models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    plain = _spec(capsys, small_models, "llama.cpp", "-t", "8")
    tbd = _spec(capsys, small_models, "llama.cpp", "-t", "8", "-tbd", "1")
    one = _spec(capsys, small_models, "llama.cpp", "-t", "8", "-tb", "1")
    assert _catch_up(one) != pytest.approx(_catch_up(plain), abs=3e-3)  # the batch's threads matter
    # the draft's batch: -tbd's
    assert _catch_up(tbd) == pytest.approx(_catch_up(one), abs=_slack(tbd))  # the draft's batch: -tbd's
    assert tbd["draft_ms"] == plain["draft_ms"] and tbd["verify_ms"] == plain["verify_ms"]


def test_td_0_is_the_cores(small_models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """``-td`` 0 or below is ``hardware_concurrency()`` (common/arg.cpp:3997), taken as the cores."""
    zero = _spec(capsys, small_models, "llama.cpp", "-t", "2", "-td", "0")
    cores = _spec(capsys, small_models, "llama.cpp", "-t", "2", "-td", "16")
    assert zero["draft_ms"] == cores["draft_ms"]


def test_ik_reads_neither(small_models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    plain = _spec(capsys, small_models, "ik_llama.cpp", "-t", "8")
    both = _spec(capsys, small_models, "ik_llama.cpp", "-t", "8", "-td", "1", "-tbd", "1")
    assert both == plain


def test_ik_takes_the_drafts_threads_from_its_draft_params(small_models: dict[str, Path],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """ik parses ``-draft "ARGS"`` onto a copy of the main parameters (common/speculative.cpp 1946-1966):
    the draft computes with ARGS's ``-t``; with no ``-tb`` anywhere its batch takes that ``-t`` too
    (``n_threads_batch == -1 ? n_threads``), with the main ``-tb`` that one."""
    ik = "ik_llama.cpp"
    plain = _spec(capsys, small_models, ik, "-t", "8")
    inner = _spec(capsys, small_models, ik, "-t", "8", "-draft", "-t 1")
    one = _spec(capsys, small_models, ik, "-t", "1")
    assert one["draft_ms"] != plain["draft_ms"]
    assert _catch_up(one) != pytest.approx(_catch_up(plain), abs=3e-3)
    assert inner["draft_ms"] == one["draft_ms"] and inner["verify_ms"] == plain["verify_ms"]
    assert _catch_up(inner) == pytest.approx(_catch_up(one), abs=_slack(one))  # the draft's batch: its -t 1
    kept = _spec(capsys, small_models, ik, "-t", "8", "-tb", "8", "-draft", "-t 1")
    assert kept["draft_ms"] == one["draft_ms"]
    assert _catch_up(kept) == pytest.approx(_catch_up(plain), abs=_slack(plain))  # the main -tb 8


def test_an_mtp_head_on_the_target_keeps_the_targets_threads(small_models: dict[str, Path],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``--spec-type draft-mtp`` without ``-md``: no draft model, so ``has_draft`` is false and the
    MTP context takes the target's parameters (common/speculative.cpp:2535-2557)."""
    def run(*server: str) -> dict[str, Any]:
        argv = ["plan", str(small_models["deepseek2-mtp"]), "--no-detect", "--device", CPU16, "--json",
                "--", "-c", "1024", "--spec-type", "draft-mtp", "-t", "8", *server]
        assert main(argv) == 0
        out: dict[str, Any] = json.loads(capsys.readouterr().out)["speed"]["speculative"]
        return out

    assert run("-td", "1", "-tbd", "1") == run()


def test_the_text_names_the_drafts_threads(small_models: dict[str, Path],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", str(small_models["llama"]), "--no-detect", "--device", CPU16, "--", "-c", "1024",
            "-md", str(small_models["llama-draft"]), "--spec-type", "draft-simple", "-t", "8", "-td", "2",
            "-tbd", "4"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "draft model: CPU threads in a token (-td 2): 2 threads" in out
    assert "draft model: CPU threads in a batch (-tbd 4): 4 threads" in out
    assert main(argv[:-4]) == 0  # without -td/-tbd: not said
    assert "draft model: CPU threads" not in capsys.readouterr().out


def test_the_text_names_ik_drafts_threads(small_models: dict[str, Path],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", str(small_models["llama"]), "--no-detect", "--device", CPU16, "--backend", "ik_llama.cpp",
            "--", "-c", "1024", "-md", str(small_models["llama-draft"]), "--spec-type", "draft", "-t", "8",
            "-draft", "-t 2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "draft model: CPU threads in a token (-draft's -t 2): 2 threads" in out
    assert "draft model: CPU threads in a batch" not in out  # the batch takes the draft's -t 2 as well
