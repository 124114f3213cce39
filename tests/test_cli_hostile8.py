"""Hostile command lines against the newer surfaces (draft models, MTP, speed options): one clear
message or a plan with the server's own warning, never a traceback."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest
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


@pytest.mark.parametrize(("key", "value"), [
    ("tflops", "1_0"),  # float() read it as 10
    ("tflops", "７０"), ("ghz", "３.５"), ("bw", "٩٠٠GB/s"), ("ram", "８xDDR5-4800"), ("pcie", "４x16"),
])
def test_a_speed_figure_in_other_digits_is_refused_as_threads_is(key: str, value: str) -> None:
    """threads= and cores= refused fullwidth or Arabic-Indic digits, bw=, tflops=, ghz=, ram= and pcie=
    took them (and tflops=1_0 as 10): one syntax, ASCII digits, for every key."""
    from offload_planner.core.speed.declared import parse_hardware_keys

    with pytest.raises(ValueError, match="not a"):
        parse_hardware_keys([(key, value)])


@pytest.mark.parametrize(("key", "value", "field", "want"), [
    ("tflops", "71.5TFLOPS", "tflops", 71.5), ("tflops", "1e-3", "tflops", 1e-3),
    ("tflops", ".5", "tflops", 0.5),
    ("ghz", "2250MHz", "ghz", 2.25), ("ghz", "3.", "ghz", 3.0), ("bw", "936GB/s", "bw", 936.0),
    ("ram", "12xDDR5-4800", "ram", 460.8), ("pcie", "gen4x8", "pcie", (4, 8)),
])
def test_the_usual_spellings_are_still_taken(key: str, value: str, field: str, want: object) -> None:
    from offload_planner.core.speed.declared import parse_hardware_keys

    got = getattr(parse_hardware_keys([(key, value)]), field)
    assert got == pytest.approx(want) if isinstance(want, float) else got == want


@pytest.mark.parametrize("value", ["len=2_5", "1_0e-1", "０.５", "ratio=０.５", "len=１.5"])
def test_a_spec_accept_in_other_digits_is_refused(value: str) -> None:
    """float() read 'len=2_5' as a mean length of 25 (every token accepted) and '1_0e-1' as 1."""
    from offload_planner.cli_estimate_options import _accept

    with pytest.raises(argparse.ArgumentTypeError, match="expected a share from 0 to 1"):
        _accept(value)


@pytest.mark.parametrize(("value", "want"), [("0.7", 0.7), ("1", 1.0), (".5", 0.5), ("1e-1", 0.1)])
def test_a_spec_accept_share_is_still_taken(value: str, want: float) -> None:
    from offload_planner.cli_estimate_options import _accept

    assert _accept(value) == pytest.approx(want)
    assert _accept("len=2.98").value == 2.98 and _accept("ratio=0.72").value == 0.72  # type: ignore[union-attr]


def _plan_file_with(path: Path, extra_args: list[str]) -> Path:
    """A plan file of Qwen3-30B on a CPU whose kept flags are ``extra_args``, written at ``path``."""
    import argparse as ap
    import json

    from offload_planner.core.devices import Device, DeviceKind, DeviceSet
    from offload_planner.core.loadable import open_loadable
    from offload_planner.core.plan import plan_from_args
    from offload_planner.core.plan_file import PlanFile, plan_json

    plan = plan_from_args(open_loadable(QWEN), DeviceSet(Device("CPU", DeviceKind.CPU, 64 << 30)),
                          ap.Namespace(ctx_size=2048))
    data = plan_json(PlanFile.of(plan))
    data["extra_args"] = extra_args
    path.write_text(json.dumps(data))
    return path


def test_a_draft_model_url_is_refused_without_a_request(tmp_path: Path) -> None:
    """llama-server opens -md as a file name (a URL fails to load), but the planner downloaded its
    header: a plan file whose kept flags held '-md http://...' made `launch FILE` (before asking) and the
    window fetch it unasked, where a plan's own model URL is fetched only with --allow-remote. Now -md
    URL is refused in one line and nothing is requested."""
    from tests.support.http_range_server import RangeServer

    (tmp_path / "files").mkdir()
    with RangeServer(tmp_path / "files") as srv:
        url = srv.url("draft.gguf")
        path = _plan_file_with(tmp_path / "remote-draft.plan.json",
                               ["-md", url, "--spec-type", "draft-simple"])
        launched = run_cli("launch", str(path), "--server", "/nonexistent/llama-server")
        planned = run_cli("plan", QWEN, "--no-detect", "--", "-md", url, "--spec-type", "draft-simple")
        assert srv.log == [], [r.path for r in srv.log]
    no_traceback(planned, 2)
    assert f"error: draft model {url}: llama-server opens a draft model (-md" in planned.stderr
    no_traceback(launched, 2)


def test_a_plan_files_projector_url_is_fetched_only_when_allowed(tmp_path: Path) -> None:
    """A plan file whose kept flags held '-mmu URL' made the window download the projector's header
    unasked (its model's URL needs --allow-remote, or a yes in the window). Now `gui FILE` refuses it
    without --allow-remote, naming the URL, and sends nothing."""
    from tests.support.http_range_server import RangeServer

    from offload_planner.core.plan_file import load_plan

    (tmp_path / "files").mkdir()
    with RangeServer(tmp_path / "files") as srv:
        url = srv.url("mmproj.gguf")
        path = _plan_file_with(tmp_path / "remote-mmproj.plan.json", ["-mmu", url])
        r = run_cli("gui", str(path), "--screenshot", str(tmp_path / "x.png"), QT_QPA_PLATFORM="offscreen")
        assert srv.log == [], [q.path for q in srv.log]
    assert load_plan(path).projector_url == url
    no_traceback(r, 2)
    assert f"the plan reads its projector from {url}; pass --allow-remote" in r.stderr
