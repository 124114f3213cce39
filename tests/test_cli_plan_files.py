"""Plan files on the command line, through the real entry point in a subprocess: a bad file, a
FIFO or a model URL ends with one message and exit status 2 (never a Qt abort); ``launch`` with a
plan file prints the whole command and the arguments to look at, and runs it only with --yes."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.plan_file import PlanFile, plan_json
from offload_planner.core.synth import SMALL_MODELS, write_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(SMALL_MODELS["qwen3moe"], tmp_path_factory.mktemp("cli_plans") / "qwen3moe.gguf")[0]


def _plan_file(
    path: Path, model: Path, extra: list[str] | None = None, model_path: str | None = None
) -> Path:
    m = open_model(model)
    plan = plan_from_args(
        m, DeviceSet(Device("CPU", DeviceKind.CPU, 64 << 30), ()), argparse.Namespace(ctx_size=2048)
    )
    data = plan_json(PlanFile.of(replace(plan, extra_args=list(extra or []))))
    data["extra_args"] = list(extra or [])
    if model_path is not None:
        data["model"]["path"] = model_path
    path.write_text(json.dumps(data))
    return path


def _run(args: list[str], home: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m offload_planner ARGS`` with a temporary config home, offscreen, no stdin."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "gui"),
        "QT_QPA_PLATFORM": "offscreen",
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
    }
    return subprocess.run(
        [sys.executable, "-m", "offload_planner", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=home,
        stdin=subprocess.DEVNULL,
    )


def _gui(plan: Path, home: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return _run(["gui", str(plan), "--settings", str(home / "s.ini"), *more], home)


def _clean(r: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in r.stderr and "QThread" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_gui_with_a_bad_plan_file_exits_2_naming_the_field(tmp_path: Path, model_path: Path) -> None:
    plan = _plan_file(tmp_path / "bad.plan.json", model_path)
    data = json.loads(plan.read_text())
    data["placement_options"]["overrides"] = [{"pattern": "blk\\.(", "buft": "CPU"}]
    plan.write_text(json.dumps(data))
    r = _gui(plan, tmp_path)
    assert r.returncode == 2, r.stderr
    assert str(plan) in r.stderr and "$.placement_options.overrides[0].pattern" in r.stderr
    _clean(r)


def test_gui_with_undecodable_plan_bytes_exits_2(tmp_path: Path) -> None:
    plan = tmp_path / "junk.plan.json"
    plan.write_bytes(b"\xff\xfe{\x00")
    r = _gui(plan, tmp_path)
    assert r.returncode == 2 and "not UTF-8" in r.stderr and str(plan) in r.stderr
    _clean(r)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_gui_with_a_fifo_as_plan_or_model_exits_2_at_once(tmp_path: Path, model_path: Path) -> None:
    fifo = tmp_path / "pipe.plan.json"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    r = _gui(fifo, tmp_path)
    assert r.returncode == 2 and "not a regular file (a FIFO)" in r.stderr
    model_fifo = tmp_path / "fifo.gguf"
    os.mkfifo(model_fifo)
    r = _gui(_plan_file(tmp_path / "m.plan.json", model_path, model_path=str(model_fifo)), tmp_path)
    assert r.returncode == 2 and str(model_fifo) in r.stderr and "a FIFO" in r.stderr
    _clean(r)
    assert time.monotonic() - t0 < 30


def test_gui_refuses_a_plan_whose_model_is_a_url_unless_allowed(tmp_path: Path, model_path: Path) -> None:
    url = "http://127.0.0.1:9/models/m.gguf"
    plan = _plan_file(tmp_path / "u.plan.json", model_path, model_path=url)
    r = _gui(plan, tmp_path)
    assert r.returncode == 2 and url in r.stderr and "--allow-remote" in r.stderr
    _clean(r)


def _fake_server(tmp_path: Path) -> tuple[Path, Path]:
    """An executable that records its arguments when run with a model (-m), then fails."""
    marker = tmp_path / "ran.json"
    exe = tmp_path / "llama-server"
    exe.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"if '-m' in sys.argv:\n    open({str(marker)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
        "    sys.exit(1)\nprint('version: 1 (abc)')\n"
    )
    exe.chmod(0o755)
    return exe, marker


@pytest.mark.skipif(sys.platform == "win32", reason="a POSIX script stands in for llama-server")
def test_launch_of_a_plan_file_shows_the_command_and_needs_yes(tmp_path: Path, model_path: Path) -> None:
    exe, marker = _fake_server(tmp_path)
    log = tmp_path / "server.log"
    plan = _plan_file(
        tmp_path / "p.plan.json",
        model_path,
        ["--host", "0.0.0.0", "--log-file", str(log), "--api-key", "sk-never-printed"],
    )
    r = _run(["launch", str(plan), "--server", str(exe), "--no-detect"], tmp_path)
    assert r.returncode == 2, r.stderr
    err = r.stderr
    assert "launches:" in err and str(exe) in err
    assert "--host 0.0.0.0" in err and str(model_path) in err and "-fit off" in err
    assert (
        "look at --host: listens on 0.0.0.0" in err and f"look at --log-file: writes its log to {log}" in err
    )
    assert "sk-never-printed" not in err and "pass --yes" in err
    assert not marker.exists(), "the server was not started"

    r = _run(["launch", str(plan), "--server", str(exe), "--no-detect", "--yes", "--timeout", "20"], tmp_path)
    assert marker.exists(), r.stderr
    argv = json.loads(marker.read_text())
    assert argv[argv.index("--host") + 1] == "0.0.0.0" and "--log-file" in argv
    assert r.returncode == 3 and "Traceback" not in r.stderr


def test_launch_of_a_bad_plan_file_exits_2(tmp_path: Path) -> None:
    plan = tmp_path / "bad.plan.json"
    plan.write_text('{"format": "offload-planner-plan", "version": 1, "model": []}')
    r = _run(["launch", str(plan), "--no-detect"], tmp_path)
    assert r.returncode == 2 and "$.model: expected an object" in r.stderr and str(plan) in r.stderr
    _clean(r)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a pseudo-terminal stands in for the user")
@pytest.mark.parametrize("answer", ["n", "y"])
def test_launch_of_a_plan_file_asks_on_a_terminal(tmp_path: Path, model_path: Path, answer: str) -> None:
    import pty

    exe, marker = _fake_server(tmp_path)
    plan = _plan_file(tmp_path / "p.plan.json", model_path, ["--host", "0.0.0.0"])
    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "gui"), "HOME": str(tmp_path),
           "XDG_CONFIG_HOME": str(tmp_path / ".config")}
    args = [sys.executable, "-m", "offload_planner", "launch", str(plan), "--server", str(exe), "--no-detect",
            "--timeout", "20"]
    with subprocess.Popen(args, stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                          cwd=tmp_path) as proc:
        os.close(follower)
        os.write(leader, f"{answer}\n".encode())
        _out, err = proc.communicate(timeout=60)
    os.close(leader)
    assert b"look at --host: listens on 0.0.0.0" in err
    if answer == "n":
        assert proc.returncode == 2 and b"not launched" in err and not marker.exists()
    else:
        assert marker.exists() and proc.returncode == 3, err.decode()
