"""A one-shot ``plan`` projects plainly (issue 10: it costs opening the file plus one plain simulation):
it keeps no graph for re-placing and records no replay reference, unless the pinned build's --fit
runs its dry runs, which re-place the graph the projection keeps.  The window's path is unchanged.

Real GGUF files from the synth writer; the buffers are compared with those of the incremental path
(itself checked against llama.cpp in tests/integration), the bytes of ``plan``'s output in
tests/test_cli_plan_golden.py."""

from __future__ import annotations

import contextlib
import io
import json
import threading
from pathlib import Path

import pytest

from offload_planner.cli import main
from offload_planner.core import compute as C
from offload_planner.core.compute import incremental as CI
from offload_planner.core.compute import template as CT
from offload_planner.core.compute.stats import stats
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import ContextParams, resolve_context
from offload_planner.core.placement import Override, PlacementOptions
from offload_planner.core.plan import Plan

GIB = 1 << 30
PATHS = ("plain", "full", "replays", "graph_reuses")


def _forget() -> None:
    C.MEMO.clear()
    CT._TEMPLATES.clear()
    CI._REFS.clear()
    CI._SEEN.clear()


def _kept() -> int:
    """Graphs kept for re-placing, recorded references, placements remembered as seen and compute
    buffers remembered by placement."""
    return len(CT._TEMPLATES) + sum(map(len, CI._REFS.values())) + len(CI._SEEN) + len(C.MEMO._d)


def _plan(path: Path, *server: str) -> int:
    argv = ["plan", str(path), "--no-detect", "--device", "CUDA0=24GiB", "--device", "CUDA1=24GiB",
            "--", "-ngl", "999", "-ot", "exps=CPU", "-c", "4096", *server]
    with contextlib.redirect_stdout(io.StringIO()):
        return main(argv)


@pytest.fixture(autouse=True)
def _config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFLOAD_PLANNER_CONFIG_DIR", str(tmp_path))


@pytest.mark.parametrize("name", ["qwen3moe", "deepseek2"])
def test_plan_fit_off_keeps_nothing(small_models: dict[str, Path], name: str) -> None:
    _forget()
    before = {k: stats[k] for k in PATHS}
    assert _plan(small_models[name], "-fit", "off") == 0
    assert _kept() == 0
    assert {k: stats[k] for k in PATHS} == before  # the from-scratch reserve: no incremental path


def test_a_declared_cpu_size_is_not_read_from_the_system(small_models: dict[str, Path],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--device CPU=SIZE,ram=...`` (another machine) replaces the RAM total the system reports: a
    one-shot plan does not read /proc/meminfo for it (a read the output never showed); without it the
    total is read, and the CPU row's capacity is that total.  A bare ``CPU=SIZE`` reads it once, for
    the note that compares the size with this machine's RAM (``speed_store.probe_speed_note``)."""
    from offload_planner.backend import system

    reads: list[str] = []
    real = system._mem_total
    monkeypatch.setattr(system, "_mem_total", lambda *a: reads.append("meminfo") or real(*a))
    argv = ["plan", str(small_models["qwen3moe"]), "--no-detect", "--json", "--device", "CUDA0=24GiB"]
    for cpu, read in ((["--device", "CPU=64GiB,ram=2xDDR5-4800"], []), ([], ["meminfo"]),
                      (["--device", "CPU=64GiB"], ["meminfo"])):
        reads.clear()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main([*argv, *cpu, "--", "-ngl", "999", "-fit", "off"]) == 0
        assert reads == read
        row = next(d for d in json.loads(out.getvalue())["devices"] if d["name"] == "CPU")
        assert row["capacity_bytes"] == (64 * GIB if cpu else system.cpu_device().total), row


#: what a one-shot ``plan -fit off`` does not need, and a new process paid to import (~10 ms in all):
#: the calibration store (for the config folder's name), hashlib (its fingerprints), subprocess (a Mac's
#: sysctl), traceback (the window's error text), platform (this machine's name: os.uname has it), the
#: fit's modules, the utf-8-sig codec (cpuinfo's BOM)
NOT_IMPORTED = {"offload_planner.backend.calibration", "hashlib", "subprocess", "traceback", "platform",
                "offload_planner.core.fit", "offload_planner.core.fit_extra", "encodings.utf_8_sig"}

FRESH_PLAN = """
import contextlib, io, json, sys
before = set(sys.modules)
from offload_planner.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(sys.argv[1:])
print(json.dumps([code, len(out.getvalue()), sorted(set(sys.modules) - before)]))
"""


def test_a_new_plan_process_imports_only_what_it_uses(small_models: dict[str, Path], tmp_path: Path) -> None:
    """A one-shot plan in a new process (the command as run) pays its imports first: none of
    :data:`NOT_IMPORTED` is among them with -fit off (each was imported by a module the plan needs for
    something else); the pinned build's --fit imports the fit's modules, which it runs."""
    import os
    import subprocess
    import sys
    import time

    from offload_planner.backend import speed_store

    now = time.strftime("%Y-%m-%d %H:%M")
    entry = {"ram_gbs": 40.0, "ram_measured_at": now, "ram_busy": False,  # the probe's figures, cached
             "ram_thread_gbs": 20.0, "ram_thread_measured_at": now, "ram_thread_busy": False}
    (tmp_path / "speed.json").write_text(json.dumps({"machines": {speed_store.machine_key(): entry}}))
    env = {**os.environ, "OFFLOAD_PLANNER_CONFIG_DIR": str(tmp_path)}
    argv = ["plan", str(small_models["qwen3moe"]), "--no-detect", "--device", "CUDA0=24GiB", "--device",
            "CPU=64GiB", "--", "-ngl", "999", "-ot", "exps=CPU", "-c", "4096"]
    fit_modules = {"offload_planner.core.fit", "offload_planner.core.fit_extra"}
    for fit, expect in ((["-fit", "off"], set()), ([], fit_modules)):
        out = subprocess.run([sys.executable, "-c", FRESH_PLAN, *argv, *fit], capture_output=True, text=True,
                             env=env, check=True, timeout=120)
        code, printed, imported = json.loads(out.stdout)
        assert code == 0 and printed > 0
        assert NOT_IMPORTED & set(imported) == expect, (fit, sorted(NOT_IMPORTED & set(imported)))


def test_a_new_plan_process_reads_a_busy_figures_age_without_strptime(small_models: dict[str, Path],
                                                                      tmp_path: Path) -> None:
    """A RAM figure cached while the machine was busy is checked for age at every plan (measured again
    after an hour): its time is read without importing _strptime (with calendar and datetime, ~3 ms of
    a new process); a recent one is kept, not measured again."""
    import os
    import subprocess
    import sys
    import time

    from offload_planner.backend import speed_store

    now = time.strftime("%Y-%m-%d %H:%M")
    entry = {"ram_gbs": 40.0, "ram_measured_at": now, "ram_busy": True,
             "ram_thread_gbs": 20.0, "ram_thread_measured_at": now, "ram_thread_busy": True}
    store = tmp_path / "speed.json"
    store.write_text(json.dumps({"machines": {speed_store.machine_key(): entry}}))
    before = store.read_bytes()
    env = {**os.environ, "OFFLOAD_PLANNER_CONFIG_DIR": str(tmp_path)}
    argv = ["plan", str(small_models["qwen3moe"]), "--no-detect", "--device", "CUDA0=24GiB", "--device",
            "CPU=64GiB", "--", "-ngl", "999", "-c", "4096", "-fit", "off"]
    out = subprocess.run([sys.executable, "-c", FRESH_PLAN, *argv], capture_output=True, text=True, env=env,
                         check=True, timeout=120)
    code, printed, imported = json.loads(out.stdout)
    assert code == 0 and printed > 0
    assert "_strptime" not in imported
    assert store.read_bytes() == before  # recent: kept as it was

def test_plan_with_fit_keeps_the_graph_its_dry_runs_re_place(small_models: dict[str, Path]) -> None:
    _forget()
    before = stats["graph_reuses"]
    assert _plan(small_models["qwen3moe"]) == 0
    assert stats["graph_reuses"] > before
    assert _kept() > 0


def _setup(path: Path) -> tuple[Plan, DeviceSet, ContextParams]:
    model = open_model(path)
    gpus = tuple(Device(f"CUDA{i}", DeviceKind.CUDA, 24 * GIB, 24 * GIB) for i in range(2))
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 512 * GIB, 480 * GIB), gpus)
    params = ContextParams(n_ctx=4096, n_batch=2048, n_ubatch=512, n_seq_max=4, kv_unified=True,
                           flash_attn=True, type_k="f16", type_v="f16", offload_kqv=True, swa_full=False,
                           n_outputs_max=4)
    opts = PlacementOptions(n_gpu_layers=model.summary.n_layer + 1, overrides=(Override("exps", "CPU"),))
    return Plan(model, devices, opts, params), devices, params


@pytest.mark.parametrize("name", ["qwen3moe", "deepseek2", "gpt-oss", "gemma3", "llama"])
def test_one_shot_buffers_equal_the_incremental_path(small_models: dict[str, Path], name: str) -> None:
    plan, devices, params = _setup(small_models[name])
    s = plan.model.summary
    ctx = resolve_context(params, s.n_ctx_train, s.n_swa)
    _forget()
    with C.one_shot():
        plain = C.compute_buffers(plan.model, devices, plan.placement(), ctx, params)
    assert _kept() == 0
    C.MEMO.clear()
    kept = C.compute_buffers(plan.model, devices, plan.placement(), ctx, params)
    assert _kept() > 0  # outside the context: the window's path, which keeps the graph
    assert plain == kept
    assert sum(b.bytes for b in plain) > 0


def test_one_shot_is_this_thread_only(small_models: dict[str, Path]) -> None:
    """A window's worker thread projecting while a one-shot context is open elsewhere keeps its graph."""
    plan, devices, params = _setup(small_models["qwen3moe"])
    s = plan.model.summary
    ctx = resolve_context(params, s.n_ctx_train, s.n_swa)
    _forget()
    with C.one_shot():
        worker = threading.Thread(target=C.compute_buffers,
                                  args=(plan.model, devices, plan.placement(), ctx, params))
        worker.start()
        worker.join()
    assert _kept() > 0
