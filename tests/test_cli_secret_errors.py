"""A secret flag written --flag=VALUE (llama.cpp reads no '=' form: it refuses the argument) was quoted
whole in the refusal: 'error: invalid argument: --api-key=sekrit'."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.test_cli_plan_input import GPUS, QWEN, run

from offload_planner.core.cmdline import Dialect, parse_server_args


@pytest.mark.parametrize("dialect", [Dialect("llama.cpp"), Dialect("ik_llama.cpp")])
@pytest.mark.parametrize("arg", ["--api-key=sekrit", "--hf-token=sekrit", "--hf_token=sekrit"])
def test_a_refused_secret_is_not_quoted(dialect: Dialect, arg: str) -> None:
    parsed = parse_server_args(["-c", "512", arg], dialect=dialect)
    assert parsed.errors, arg
    for e in parsed.errors:
        assert "sekrit" not in str(e) and "sekrit" not in e.flag, str(e)
    assert any("=***" in str(e) for e in parsed.errors)


def test_plan_says_the_refusal_without_the_key(tmp_path: Path) -> None:
    r = run("plan", QWEN, *GPUS, "--", "-c", "512", "--api-key=sekrit",
            env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert r.returncode == 2 and "invalid argument: --api-key=***" in r.stderr, r.stderr
    assert "sekrit" not in r.stderr + r.stdout
