"""The CLI's printed commands with a hostile path: control characters escaped, on one line, and
what bash reads back is the path."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.test_cli_plan_input import GPUS, QWEN, run


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
