"""The flags the planner keeps verbatim whose value llama-server reads with std::stof / std::stoul
(``parse_mainline.STOF_FLAGS`` / ``STOUL_FLAGS``): the real server refuses a value that is no number
at parse time, and the planner refuses it in the same words. Before, ``--temp abc`` or
``--spec-draft-p-split abc`` gave a plan (exit 0) of a command the server does not start with."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.cmdline.parse_mainline import STOF_FLAGS, STOUL_FLAGS

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("flag", sorted(STOF_FLAGS | STOUL_FLAGS))
def test_a_value_that_is_no_number_is_refused_as_the_server_refuses_it(flag: str, llama_server: Path,
                                                                       tmp_path: Path) -> None:
    r = subprocess.run([str(llama_server), "-m", str(tmp_path / "absent.gguf"), flag, "abc"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    conversion = "stof" if flag in STOF_FLAGS else "stoul"
    theirs = f'error while handling argument "{flag}": {conversion}'
    assert r.returncode != 0 and theirs in r.stdout + r.stderr, (r.stdout + r.stderr)[-1500:]
    ours = parse_server_args([flag, "abc"]).errors
    assert [e.message for e in ours] == [theirs]
    assert parse_server_args([flag, "0.5x"]).errors == []  # the number before a tail is read
