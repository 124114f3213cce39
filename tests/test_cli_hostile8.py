"""Hostile command lines against the newer surfaces (draft models, MTP, speed options): one clear
message or a plan with the server's own warning, never a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.cli import run_cli

RES = Path(__file__).resolve().parents[1] / "resources"
QWEN = str(RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
DSV3 = str(RES / "DeepSeek-V3-Q4_K_M.header.gguf")  # deepseek2, an MTP graph here, but no NextN layers


def no_traceback(r: subprocess.CompletedProcess[str], *codes: int) -> None:
    assert r.returncode in codes and "Traceback" not in r.stderr, (r.returncode, r.stderr[-2000:])


def test_draft_mtp_with_a_draft_of_an_mtp_architecture_but_no_nextn_layers() -> None:
    """`-md FILE --spec-type draft-mtp` with a deepseek2 draft lacking NextN layers built the MTP graph
    of a block the file does not have (KeyError 'blk.61.nextn.eh_proj.weight'); now plan warns that
    llama-server exits at load and fit refuses, as for a main model without NextN layers."""
    args = ["--no-detect", "--device", "CUDA0=24GiB", "--", "-c", "4096", "-md", DSV3,
            "--spec-type", "draft-mtp"]
    plan = run_cli("plan", QWEN, *args)
    no_traceback(plan, 0, 3)
    assert "warning: llama-server exits at load: -md " + DSV3 in plan.stdout + plan.stderr
    assert "(the draft model has no NextN layers)" in plan.stdout + plan.stderr
    fit = run_cli("fit", QWEN, *args)
    no_traceback(fit, 2)
    assert "(the draft model has no NextN layers)" in fit.stderr and not fit.stdout


def test_a_negative_stop_timeout_is_refused_naming_the_zero_it_takes() -> None:
    """It said 'expected seconds above 0' though --stop-timeout 0 (SIGKILL at once) is taken."""
    r = run_cli("launch", QWEN, "--stop-timeout", "-1", "--", "-c", "512")
    no_traceback(r, 2)
    assert "argument --stop-timeout: '-1': expected seconds from 0 (SIGKILL at once) to 2147483" in r.stderr
