"""The ik_llama.cpp test harness shared by tests/integration/test_ik_memory.py and test_ik_compute.py:
the DeepSeek-style test models, the "is ik's library installed" gate, one ik load per (model, MLA
mode) with every context setting of that group, and the planner's side of a case."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from tests.support.ik_context import ModelReport, measure

from offload_planner.core import ik
from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import check_semantics, parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.engine import IK_LLAMA_CPP
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import Projection
from offload_planner.core.synth import SMALL_MODELS

GIB = 1024**3
F16, Q8_0, Q4_0 = 1, 8, 2  # ggml type ids (the same in ik and mainline)

#: DeepSeek-V3's attention shapes (kv_lora_rank 512, rope 64, 192/128 per head) at width 256.
DS_MAINLINE = replace(SMALL_MODELS["deepseek2"], name="synth-deepseek2-v3-attn", head_dim_k=576,
                      head_dim_v=512, n_rot=64, kv_lora_rank=512, key_length_mla=192,
                      value_length_mla=128)
DS_OLD = replace(DS_MAINLINE, name="synth-deepseek2-v3-attn-old", n_head_kv=None, head_dim_k=192,
                 head_dim_v=128, key_length_mla=0, value_length_mla=0)

#: A case: (model, command line, what ik's server passes to its context).
Case = tuple[str, str, dict[str, Any]]


def require_ik() -> None:
    """ik's library is needed: fail under CI=true, skip elsewhere."""
    from importlib.util import find_spec

    if find_spec("ik_llama_cpp") is None:
        msg = "ik-llama-cpp-python is not installed (pip install -e '.[test]')"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)


def mla_of(settings: Mapping[str, Any]) -> int:
    return int(settings.get("mla_attn", 0))


def measure_cases(files: Mapping[str, Path], cases: Iterable[Case]) -> dict[tuple[str, int], ModelReport]:
    """One ik load per (model, MLA mode), with every context of that group."""
    require_ik()
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for name, _args, settings in cases:
        groups.setdefault((name, mla_of(settings)), []).append(settings)
    return {key: measure(files[key[0]], key[1], sets) for key, sets in groups.items()}


def cpu_only() -> DeviceSet:
    return DeviceSet(Device("CPU", DeviceKind.CPU, 24 * GIB, 20 * GIB), ())


def ik_plan(path: Path, args: str, amb: int | None = None) -> tuple[Projection, list[str]]:
    """The planner on ik's server command line, CPU only, with the refusals it reports; ``amb``
    sets -amb past the server's floor of 128 (as a library caller can)."""
    model = open_model(path)
    parsed = parse_server_args(args.split(), dialect=IK_LLAMA_CPP)
    if amb is not None:
        parsed.args.amb = amb
    devices = cpu_only()
    errors = [str(e) for e in parsed.errors + check_semantics(parsed, devices.names)]
    errors += ik.model_errors(model)
    return analyse_command(model, devices, parsed, IK_LLAMA_CPP).projection, errors
