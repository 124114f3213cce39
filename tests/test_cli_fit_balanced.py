"""`fit --goal balanced` (the default) ranks by a request's seconds, the prompt at pp plus a 512-token
answer at tg, so it can star a row whose tg is lower than another's (the README's DeepSeek-V3 on two
RTX 3090: the star 12.91 t/s beside llama.cpp --fit's 12.92 and 13.00 for a -ub 512 layout). One line
under the table says what the goal ranks by, with the starred row's seconds and, where another row that
fits generates faster, that row's (leftovers4). Text only: the JSON keeps its rows' ``score``
(requests per second) and nothing more."""

from __future__ import annotations

import json

from tests.test_cli_plan_input import ROOT, run

DEMO = str(ROOT / "resources" / "DeepSeek-V3-Q4_K_M.header.gguf")
ARGS = ("--no-detect", "--device", "CPU=512GiB,ram=8xDDR5-4800", "--device", "CUDA0=rtx3090",
        "--device", "CUDA1=rtx3090")
LINE = ("balanced: ranked by a request's seconds, the {p}-token prompt at pp t/s plus a 512-token answer "
        "at tg t/s (the fewest wins): * ")


def _seconds(score: float) -> str:
    return f"{1 / score:.4g} s"


def test_the_star_and_the_highest_tg_are_given_their_request_seconds() -> None:
    j = run("fit", DEMO, *ARGS, "--json", "--", "-c", "32768", "-t", "32")
    assert j.returncode == 0, j.stderr[-2000:]
    data = json.loads(j.stdout)
    rows = {r["label"]: r for r in data["candidates"]}
    star = rows[data["best"]]
    fastest = max((r for r in data["candidates"] if r["fits"]), key=lambda r: r["tg_tps"])
    assert fastest["tg_tps"] > star["tg_tps"] and fastest["score"] < star["score"]  # the case itself
    assert abs(1 / star["score"] - (4096 / star["pp_tps"] + 512 / star["tg_tps"])) < 0.01 / star["score"]
    r = run("fit", DEMO, *ARGS, "--", "-c", "32768", "-t", "32")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    table_end = next(i for i, x in enumerate(lines) if x.startswith(" llama.cpp --fit"))
    assert lines[table_end + 1] == (LINE.format(p=4096) + _seconds(star["score"]) + f"; the highest tg, "
                                    f"\"{fastest['label']}\", " + _seconds(fastest["score"]))


def test_a_star_with_the_highest_tg_gets_its_seconds_alone() -> None:
    r = run("fit", DEMO, *ARGS[:3], "--device", "CUDA0=a100-80gb", "--prompt", "512", "--json", "--",
            "-c", "8192")
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(r.stdout)
    star = next(x for x in data["candidates"] if x["label"] == data["best"])
    assert star["tg_tps"] >= max(x["tg_tps"] for x in data["candidates"] if x["fits"])
    text = run("fit", DEMO, *ARGS[:3], "--device", "CUDA0=a100-80gb", "--prompt", "512", "--", "-c", "8192")
    line = next(x for x in text.stdout.splitlines() if x.startswith("balanced: "))
    assert line == LINE.format(p=512) + _seconds(star["score"])


def test_the_other_goals_print_no_such_line() -> None:
    for goal in ("tg", "pp"):
        r = run("fit", DEMO, *ARGS, "--goal", goal, "--", "-c", "32768", "-t", "32")
        assert r.returncode == 0, r.stderr[-2000:]
        assert not any(x.startswith("balanced:") for x in r.stdout.splitlines())
