"""The CLI's printed commands with a hostile path: control characters escaped, on one line, and
what bash reads back is the path."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.test_cli_plan_files import _fake_server, _plan_file, _run
from tests.test_cli_plan_input import GPUS, QWEN, run

from offload_planner.core.dialects import Dialect


def test_plan_prints_the_command_with_the_path_escaped(tmp_path: Path) -> None:
    model = tmp_path / "q\x1b[2Jw\nen\r\u202e.gguf"
    shutil.copyfile(QWEN, model)
    r = run("plan", str(model), *GPUS, env={"XDG_CONFIG_HOME": str(tmp_path / "cfg")})
    assert r.returncode in (0, 3), r.stderr
    assert not any(c in r.stdout for c in "\x1b\r\u202e")
    line = next(x for x in r.stdout.splitlines() if x.startswith("llama-server -m "))
    assert line.startswith("llama-server -m $'") and "\\x1b[2Jw\\nen\\r\\xe2\\x80\\xae.gguf'" in line
    words = subprocess.run(["bash", "-c", "printf '%s\\0' " + line.removeprefix("llama-server ")],
                           capture_output=True, timeout=20, check=True).stdout.split(b"\0")
    assert words[1] == bytes(model)


def test_the_chmod_suggestion_is_one_line_bash_reads(tmp_path: Path) -> None:
    """`launch --server FILE` with no x bit suggests `chmod +x FILE`: a newline in FILE was printed raw
    inside shlex's quotes, the command spread over two lines."""
    exe = tmp_path / "llama\nserver"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o644)
    r = run("launch", QWEN, "--no-detect", "--server", str(exe), "--", "-c", "512",
            env={"XDG_CONFIG_HOME": str(tmp_path / "cfg")})
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"(chmod +x $'{tmp_path}/llama\\nserver')" in r.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="a POSIX script stands in for llama-server")
def test_a_plan_files_launch_review_shows_control_characters_escaped(tmp_path: Path) -> None:
    """`launch PLAN` prints the command and the arguments to look at before asking: a --log-file
    value with a CR and an erase-line sequence printed raw could hide what the file writes."""
    exe, marker = _fake_server(tmp_path)
    hostile = "/tmp/ok.log\r\x1b[2K--log-file: writes its log to /dev/null\u202e"
    plan = _plan_file(tmp_path / "p\x1b[2J.plan.json", Path(QWEN), ["--log-file", hostile])
    r = _run(["launch", str(plan), "--server", str(exe), "--no-detect"], tmp_path)
    assert r.returncode == 2, r.stderr
    assert not any(c in r.stderr for c in "\r\x1b\u202e"), r.stderr
    assert "look at --log-file: writes its log to /tmp/ok.log\\r\\x1b[2K--log-file" in r.stderr
    assert "the plan file " + str(tmp_path) + "/p\\x1b[2J.plan.json launches:" in r.stderr
    assert not marker.exists()


def test_the_windows_launch_question_shows_control_characters_escaped() -> None:
    pytest.importorskip("PySide6")
    from offload_planner.core.arg_safety import review_args
    from offload_planner.ui.confirm import launch_text

    argv = ["llama-server", "--log-file", "/tmp/a\r\u202eb"]
    text = launch_text(argv, review_args(argv[1:], Dialect.LLAMA_CPP))
    assert "\r" not in text and "\u202e" not in text and "writes its log to /tmp/a\\r\\u202eb" in text
