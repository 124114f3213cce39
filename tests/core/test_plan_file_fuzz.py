"""Fuzzing plan files within a time budget: mutated bytes, JSON structure, types, huge integers,
deep nesting, invalid UTF-8 and lone surrogates. Only :class:`PlanFileError` may escape
``load_plan``, and every plan that loads must also project, export its command, save and load back
the same.

The budget (``PLAN_FUZZ_SECONDS``, default 20 s) and the seed (``PLAN_FUZZ_SEED``, default a fixed
one) can be set from the environment; the test prints how many inputs it tried and the outcomes.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import random
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from offload_planner.core.arg_safety import strip_secrets
from offload_planner.core.devices import Device, DeviceKind, DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.placement import Override
from offload_planner.core.plan import plan_command, plan_from_args
from offload_planner.core.plan_file import PlanFile, PlanFileError, load_plan, plan_json, save_plan
from offload_planner.core.synth import SMALL_MODELS, write_model

BUDGET_S = float(os.environ.get("PLAN_FUZZ_SECONDS", "20"))
SEED = int(os.environ.get("PLAN_FUZZ_SEED", "1212"))

#: Values a field is replaced with: every JSON type, edges of every range, huge and tiny numbers.
POOL: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    2,
    3,
    4,
    7,
    255,
    256,
    257,
    4096,
    2**31 - 1,
    2**31,
    2**32,
    2**53,
    2**63,
    10**30,
    -(10**30),
    0.0,
    0.5,
    -0.5,
    1e300,
    -1e300,
    5e-324,
    "",
    "x",
    "CPU",
    "CUDA0",
    "CUDA9",
    "RPC0",
    "cpu",
    "q8_0",
    "q4_0",
    "f32",
    "iq4_nl",
    "none",
    "row",
    "graph",
    "tensor",
    "layer",
    "ik_llama.cpp",
    "llama.cpp-2025",
    "llama.cpp",
    "blk\\.(",
    "(.)*",
    "exps",
    "blk\\.[0-9]+\\.",
    "127.0.0.1:1",
    "::1:50052",
    "\u0000",
    "é" * 3,
    "http://127.0.0.1:1/m.gguf", "\ud800", {"\udfff": "CPU"},
    "ftp://x/y",
    "/dev/null",
    [],
    [1],
    ["--port"],
    {},
    {"a": 1},
    {"CPU": "CPU"},
    [0.0, 0.0],
    [1e308, 1e308],
    [float("1e-300")],
]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _replace_at(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    out = copy.deepcopy(doc)
    node = out
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return out


def _delete_at(doc: Any, path: tuple[Any, ...]) -> Any:
    if not path:
        return doc
    out = copy.deepcopy(doc)
    node = out
    for k in path[:-1]:
        node = node[k]
    del node[path[-1]]
    return out


class Mutator:
    def __init__(self, rng: random.Random, seeds: list[dict[str, Any]]) -> None:
        self.rng = rng
        self.seeds = seeds

    def __call__(self) -> tuple[str, bytes]:
        rng = self.rng
        doc = rng.choice(self.seeds)
        kind = rng.choice(
            [
                "value",
                "value",
                "value",
                "delete",
                "wrap",
                "bytes",
                "bytes",
                "huge-int",
                "deep",
                "utf8",
                "swap-type",
                "multi",
            ]
        )
        if kind == "multi":
            for _ in range(rng.randint(2, 6)):
                doc = self._value(doc)
            return kind, json.dumps(doc).encode()
        if kind == "value":
            return kind, json.dumps(self._value(doc)).encode()
        if kind == "delete":
            return kind, json.dumps(_delete_at(doc, rng.choice(_paths(doc)))).encode()
        if kind == "wrap":
            path = rng.choice(_paths(doc))
            node: Any = doc
            for k in path:
                node = node[k]
            return kind, json.dumps(_replace_at(doc, path, rng.choice([[node], {"v": node}]))).encode()
        if kind == "swap-type":
            path = rng.choice(_paths(doc))
            node = doc
            for k in path:
                node = node[k]
            swapped = (
                str(node) if not isinstance(node, str) else (len(node) if rng.random() < 0.5 else [node])
            )
            return kind, json.dumps(_replace_at(doc, path, swapped)).encode()
        text = json.dumps(doc)
        if kind == "huge-int":
            digits = "9" * rng.choice([20, 400, 4299, 4301, 20000])
            at = rng.choice([m.start() for m in _numbers(text)] or [0])
            end = at
            while end < len(text) and (text[end].isdigit() or text[end] in "-.eE+"):
                end += 1
            return kind, (text[:at] + digits + text[end:]).encode()
        if kind == "deep":
            depth = rng.choice([40, 1000, 100_000])
            path = rng.choice(_paths(doc))
            marker = "\u0001DEEP\u0001"
            out = json.dumps(_replace_at(doc, path, marker))
            return kind, out.replace(json.dumps(marker), "[" * depth + "1" + "]" * depth).encode()
        if kind == "utf8":
            raw = bytearray(text.encode())
            for _ in range(rng.randint(1, 4)):
                raw[rng.randrange(len(raw))] = rng.choice([0xFF, 0xC0, 0xED, 0x80, 0xF8])
            return kind, bytes(raw)
        raw = bytearray(text.encode())  # bytes: flips, inserts, deletions
        for _ in range(rng.randint(1, 8)):
            op = rng.random()
            i = rng.randrange(len(raw))
            if op < 0.4:
                raw[i] = rng.randrange(256)
            elif op < 0.7:
                raw.insert(i, rng.choice(b'{}[]",:0123456789-.eE \\nulltruefalse'))
            else:
                del raw[i]
        return kind, bytes(raw)

    def _value(self, doc: Any) -> Any:
        return _replace_at(doc, self.rng.choice(_paths(doc)), copy.deepcopy(self.rng.choice(POOL)))


def _numbers(text: str) -> list[Any]:
    import re

    return list(re.finditer(r"(?<=[:\[, ])-?\d", text))


def _seeds(model: Model) -> list[dict[str, Any]]:
    cpu = Device("CPU", DeviceKind.CPU, 64 << 30, 60 << 30, margin=2 << 30)
    gpus = (
        replace(parse_device_decl("CUDA0=24GiB"), margin=1 << 30),
        Device("RPC0", DeviceKind.RPC, 8 << 30, endpoint="127.0.0.1:50052"),
    )
    out = []
    for dialect in ("llama.cpp", "ik_llama.cpp", "llama.cpp-2025"):
        plan = plan_from_args(model, DeviceSet(cpu, gpus), argparse.Namespace(ctx_size=4096), dialect)
        popts = replace(
            plan.placement_options,
            overrides=(Override(r"blk\.1\.", "CPU", "-ot"), Override("exps", "RPC0", "-ot")),
            tensor_split=(1.0, 2.0),
        )
        plan = replace(
            plan,
            placement_options=popts,
            moves={"blk.2.ffn_up_exps.weight": "CPU", "blk.0.attn_q.weight": "CUDA0"},
            extra_args=["--port", "8080", "-t", "8"],
        )
        out.append(json.loads(json.dumps(plan_json(PlanFile.of(plan, {"path": "/opt/llama-server"})))))
    return out


@pytest.mark.slow
def test_mutated_plan_files_fail_only_with_plan_file_errors(tmp_path: Path) -> None:
    path = write_model(SMALL_MODELS["qwen3moe"], tmp_path / "qwen3moe.gguf")[0]
    model = open_model(path)
    seeds = _seeds(model)
    mutate = Mutator(random.Random(SEED), seeds)
    target = tmp_path / "fuzz.plan.json"
    again = tmp_path / "again.plan.json"
    outcomes: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[str] = collections.Counter()
    escaped: list[str] = []
    t0 = time.monotonic()
    tried = 0
    while time.monotonic() - t0 < BUDGET_S and len(escaped) < 5:
        kind, raw = mutate()
        kinds[kind] += 1
        tried += 1
        target.write_bytes(raw)
        try:
            pf = load_plan(target)
        except PlanFileError as e:
            assert str(target) in str(e), str(e)
            outcomes["refused (PlanFileError)"] += 1
            continue
        except Exception:  # the point of the test: anything but PlanFileError
            escaped.append(f"load_plan [{kind}] {raw[:300]!r}\n{traceback.format_exc(limit=3)}")
            continue
        try:
            plan, _ = pf.to_plan(model)
            plan.projection()
            plan_command(plan)
            save_plan(again, pf)
            assert load_plan(again) == replace(pf, extra_args=strip_secrets(pf.extra_args, pf.dialect)[0])
        except Exception:  # a plan that loaded must project, export, save and load back the same
            escaped.append(f"projection [{kind}] {raw[:300]!r}\n{traceback.format_exc(limit=4)}")
            continue
        outcomes["loaded and projected"] += 1
    print(
        f"\nplan file fuzz: seed {SEED}, {tried} inputs in {time.monotonic() - t0:.1f} s; "
        f"mutations {dict(kinds)}; outcomes {dict(outcomes)}; escaped {len(escaped)}"
    )
    assert not escaped, "\n\n".join(escaped)
    assert tried > 200 and outcomes["refused (PlanFileError)"] and outcomes["loaded and projected"]
