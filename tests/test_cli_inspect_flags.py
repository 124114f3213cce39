"""``inspect``'s flags that apply to one output only: given with the other they did nothing, silently
(a newcomer's ``inspect MODEL --compact`` printed the full text report)."""

from __future__ import annotations

import json

import pytest

from offload_planner.cli import main


@pytest.mark.parametrize(("argv", "said"), [
    (["--compact"], "inspect: --compact shapes the --json output (no indentation): add --json"),
    (["--json", "--no-layers"], "inspect: --no-layers shortens the text report; the --json output always"),
])
def test_a_flag_for_the_other_output_is_refused_naming_it(argv: list[str], said: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"offload-planner: error: {said}"), err


def test_each_flag_with_its_own_output_still_works(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--json", "--compact"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and json.loads(out)["arch"]
    assert main(["inspect", "--no-layers"]) == 0
    text = capsys.readouterr().out
    assert main(["inspect"]) == 0
    assert len(text) < len(capsys.readouterr().out)
