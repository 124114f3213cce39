"""Absurdly slow declared hardware (``bw=0.001GB/s``, ``tflops=1e-9``, a CPU of 1 MB/s): the estimate
is written as what it is, never as "0.0 t/s". ``plan`` and ``fit`` printed "0.00"/"0.0" in the fit
table and 3.91e-07 in the speed line, and their ``--json`` carried ``round(x, 3)``, 0.0, as if the
plan generated nothing; now three significant figures in plain decimals (0.000391), "< 0.000001"
below a token in eleven days, and JSON numbers of three significant figures."""

from __future__ import annotations

import json
import re

import pytest
from tests.test_cli_plan_input import QWEN, run

from offload_planner.core.speed.tps import tps_fixed, tps_text

CPU = "CPU=64GiB,bw=50GB/s"  # declared: no RAM probe in the child
SPEED = re.compile(r"speed estimate \(uncalibrated\): tg (\S+|< \S+) t/s at depth 0, (\S+|< \S+) t/s at "
                   r"4096 tokens; pp (\S+|< \S+) t/s for a 4096-token prompt")


@pytest.mark.parametrize("devices", [["CUDA0=24GiB,bw=0.001GB/s", CPU],
                                     ["CUDA0=24GiB,tflops=1e-9", CPU],
                                     ["CUDA0=24GiB", "CPU=64GiB,bw=0.001GB/s"]])
def test_plan_writes_a_slow_estimate_as_it_is(devices: list[str]) -> None:
    args = ["--no-detect", *[a for d in devices for a in ("--device", d)], "--", "-c", "4096",
            *(["-ngl", "0"] if devices[1] != CPU else ["-ngl", "99"])]
    j = json.loads(run("plan", QWEN, "--json", *args).stdout)["speed"]
    text = run("plan", QWEN, *args).stdout
    assert all(j[k] > 0 for k in ("tg_tps", "tg_tps_at_ctx", "pp_tps")), j
    assert min(j["tg_tps"], j["pp_tps"]) < 0.01  # the slow device is the bottleneck
    for k in ("tg_tps", "tg_tps_at_ctx", "pp_tps"):  # below 0.1: three significant figures, not decimals
        assert j[k] >= 0.1 or j[k] == float(f"{j[k]:.3g}")
    m = SPEED.search(text)
    assert m, text
    assert list(m.groups()) == [tps_text(j["tg_tps"]), tps_text(j["tg_tps_at_ctx"]), tps_text(j["pp_tps"])]
    assert "e-" not in m.group(0) and not any(g in ("0", "0.0", "0.00") for g in m.groups())


def test_below_a_token_in_eleven_days_says_so() -> None:
    args = ["--no-detect", "--device", "CUDA0=24GiB,bw=0.001MB/s,tflops=1e-9", "--device", CPU, "--",
            "-c", "4096", "-ngl", "99"]
    r = run("plan", QWEN, *args)
    assert "tg < 0.000001 t/s at depth 0" in r.stdout and "pp < 0.000001 t/s for a 4096" in r.stdout
    j = json.loads(run("plan", QWEN, "--json", *args).stdout)["speed"]
    assert 0 < j["pp_tps"] < 1e-6 and 0 < j["tg_tps"] < 1e-6


def test_fit_table_and_json_keep_a_slow_estimate() -> None:
    args = ["--no-detect", "--device", "CUDA0=24GiB,bw=0.001GB/s", "--device", CPU, "--", "-c", "4096"]
    out = json.loads(run("fit", QWEN, "--json", *args).stdout)
    rows = {c["label"]: c for c in out["candidates"]}
    assert all(c["tg_tps"] > 0 and c["pp_tps"] > 0 for c in rows.values()), rows
    text = run("fit", QWEN, *args).stdout
    lines = text.splitlines()
    fits_at = next(ln for ln in lines if ln.startswith("candidate ")).index(" fits ")
    table = {ln[1:fits_at].strip(): ln.split()[-2:] for ln in lines if ln[1:fits_at].strip() in rows}
    assert sorted(table) == sorted(rows), text
    for label, (tg, pp) in table.items():
        assert [tg, pp] == [tps_fixed(rows[label]["tg_tps"], 2), tps_fixed(rows[label]["pp_tps"], 1)]
        assert tg not in ("0.00", "0.0") and pp not in ("0.00", "0.0")
    speed = SPEED.search(text)
    assert speed and speed.group(1) == tps_text(out["speed"]["tg_tps"])


def test_three_significant_figures_keep_their_zeros() -> None:
    """DeepSeek-V3 on a 24 GiB GPU and 8 channels of DDR5-4800, experts in RAM: tg at 32768 tokens is
    7.999 t/s and was written "8 t/s" beside "10.7 t/s" (one figure where the line promises three)."""
    demo = QWEN.replace("Qwen3-30B-A3B-Q4_K_M", "DeepSeek-V3-Q4_K_M")
    args = ["--no-detect", "--device", "CUDA0=24GiB", "--device", "CPU=512GiB,ram=8xDDR5-4800", "--"]
    r = run("plan", demo, "--json", *args, "-ngl", "999", "--cpu-moe", "-c", "32768")
    at_ctx = json.loads(r.stdout)["speed"]["tg_tps_at_ctx"]
    assert round(at_ctx, 2) == 8.0 and at_ctx != 8.0  # the case: three figures of it are 8.00
    text = run("plan", demo, *args, "-ngl", "999", "--cpu-moe", "-c", "32768").stdout
    m = re.search(r"tg (\S+) t/s at depth 0, (\S+) t/s at 32768 tokens; pp (\S+) t/s", text)
    assert m, text
    assert m.group(2) == "8.00" == tps_text(at_ctx)
    assert all(len(g.replace(".", "").lstrip("0")) == 3 for g in m.groups()), m.groups()
