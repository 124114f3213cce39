"""``-dev`` names ik_llama.cpp has no device of, against ik's own libllama (the ik-llama-cpp-python wheel,
CPU build, 55d3c05): the library takes the list as given (``llama_model_params.devices``, what ik's
server passes from ``-dev``, common/common.cpp 4245), logs ``NAME backend not available.`` for each name it
has no device of and loads the model on what is left (src/llama.cpp 5217-5228 at 55d3c05, 7821-7833 at
8337e4cd).  A CPU build lists its CPU as its one offload device ("CPU: using device CPU - N MiB free"),
so ``-dev nosuch,CPU`` keeps it.  (With no name left this wheel's ik crashes after the log lines, in its
layer-size pass over an empty device list; ik fixed that in PR 2037, c713bd599 of 2026-06-26, and loads on
the CPU: tests/core/test_ik_unknown_dev.py cites the source.)  The planner, reading the same ``-dev`` as
ik with the CPU alone, quotes exactly the lines ik logs and refuses nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.support.ik_cases import cpu_only, require_ik
from tests.support.ik_context import measure

from offload_planner.core.cmdline import check_semantics, parse_server_args, skipped_devices
from offload_planner.core.dialects import IK

pytestmark = pytest.mark.integration


def test_ik_skips_a_name_it_has_no_device_of_and_says_so(small_models: dict[str, Path]) -> None:
    require_ik()
    report = measure(small_models["qwen3moe"], 0, [], model_params={"devices": "nosuch,Cuda0,CPU",
                                                                      "n_gpu_layers": 99})
    assert report.loaded, report.stdout[-2000:]
    logged = [ln for ln in report.load_lines if ln.endswith("backend not available.")]
    assert logged == ["nosuch backend not available.", "Cuda0 backend not available."], report.load_lines
    assert any(re.match(r"CPU: using device CPU - \d+ MiB free$", ln) for ln in report.load_lines)

    parsed = parse_server_args(["-dev", "nosuch,Cuda0,CPU", "-ngl", "99"], dialect=IK)
    devices = cpu_only()
    assert not parsed.errors and not check_semantics(parsed, devices.names, dialect=IK)
    [warning] = skipped_devices(parsed, devices.names)
    quoted = re.findall(r'"([^"]*backend not available\.)"', warning.message)
    assert quoted == logged, warning


def test_ik_cpu_build_takes_its_cpu_twice_as_once(small_models: dict[str, Path]) -> None:
    """``-dev CPU,CPU`` on ik's CPU build: both mentions enter ``model->devices`` (the log names the
    device twice) but the context reorders no GPU backend (src/llama.cpp 8458-8467), so the buffers are
    ``-dev CPU``'s and the planner takes it (a GPU named twice is refused:
    tests/core/test_dev_repeated.py)."""
    require_ik()
    reports = {devs: measure(small_models["llama"], 0, [{"n_ctx": 512}],
                             model_params={"devices": devs, "n_gpu_layers": 99})
               for devs in ("CPU", "CPU,CPU")}
    for devs, report in reports.items():
        assert report.loaded and report.contexts[0].created, report.stdout[-2000:]
        using = [ln for ln in report.load_lines if ln.startswith("CPU: using device CPU")]
        assert len(using) == devs.count("CPU"), report.load_lines
    once, twice = reports["CPU"], reports["CPU,CPU"]
    assert once.weights_mib == twice.weights_mib
    first, second = once.contexts[0], twice.contexts[0]
    assert (first.kv_mib, first.compute_mib) == (second.kv_mib, second.compute_mib)
    parsed = parse_server_args(["-dev", "CPU,CPU", "-ngl", "99"], dialect=IK)
    assert not parsed.errors and not check_semantics(parsed, cpu_only().names, dialect=IK)
