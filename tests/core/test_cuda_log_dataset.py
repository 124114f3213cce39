"""The development set of public CUDA load logs (tests/data/cuda_logs/public_cuda_logs.json).

Each record carries a verbatim excerpt of a llama.cpp / ik_llama.cpp load log and, parsed from it,
the per-device buffers. The test re-parses every buffer line of the excerpt and requires the
record's ``buffers`` to be exactly that list, so no figure can be edited by hand; the context
parameters and graph nodes/splits must appear in the excerpt as written.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).resolve().parents[1] / "data" / "cuda_logs" / "public_cuda_logs.json"

MIN_RECORDS = 15
URL_RE = re.compile(
    r"^https://github\.com/(ggml-org/llama\.cpp|ikawrakow/ik_llama\.cpp|ggml-org/ci)"
    r"/((issues|pull|discussions)/\d+|blob/[0-9a-f]{40}/[\w./-]+)$"
)
BUFFER_RE = re.compile(
    r"(?P<dev>[A-Za-z_][A-Za-z0-9_]*)\s+(?:(?P<kind>model|KV|output|compute|RS)\s+)?"
    r"buffer size\s*=\s*(?P<mib>[0-9]+(?:\.[0-9]+)?) MiB"
)
KINDS = {None: "model", "model": "model", "KV": "kv", "output": "output", "compute": "compute", "RS": "rs"}
OPT_INT = (int, type(None))
OPT_STR = (str, type(None))
TOP = {
    "id": str,
    "url": str,
    "backend": str,
    "build": OPT_STR,
    "gpus": list,
    "command": OPT_STR,
    "model": dict,
    "context": dict,
    "buffers": list,
    "graph_nodes": OPT_INT,
    "graph_splits": OPT_INT,
    "has_hparams": bool,
    "log": str,
    "notes": str,
    "reason": OPT_STR,
}
MODEL = {"name": str, "arch": OPT_STR, "file": OPT_STR}
CONTEXT = {
    "n_ctx": OPT_INT,
    "n_batch": OPT_INT,
    "n_ubatch": OPT_INT,
    "flash_attn": (bool, type(None)),
    "type_k": OPT_STR,
    "type_v": OPT_STR,
    "n_gpu_layers": OPT_INT,
}


def buffers_in(log: str) -> list[dict[str, Any]]:
    """Every ``<device> [kind] buffer size = X MiB`` line of a log, in order."""
    return [
        {"device": m["dev"], "kind": KINDS[m["kind"]], "mib": float(m["mib"])}
        for m in BUFFER_RE.finditer(log)
    ]


def _type_errors(where: str, obj: dict[str, Any], spec: dict[str, Any]) -> list[str]:
    errors = [] if set(obj) == set(spec) else [f"{where}: keys {sorted(obj)} != {sorted(spec)}"]
    for key, types in spec.items():
        value = obj.get(key)
        allowed = types if isinstance(types, tuple) else (types,)
        if key in obj and (not isinstance(value, types) or (isinstance(value, bool) and bool not in allowed)):
            errors.append(f"{where}.{key}: {value!r} is not {types}")
    return errors


def record_errors(record: Any) -> list[str]:
    if not isinstance(record, dict):
        return ["record is not an object"]
    rid = str(record.get("id", "?"))
    errors = _type_errors(rid, record, TOP)
    if errors:
        return errors
    errors += _type_errors(f"{rid}.model", record["model"], MODEL)
    errors += _type_errors(f"{rid}.context", record["context"], CONTEXT)
    if errors:
        return errors
    log = record["log"]
    if not URL_RE.match(record["url"]):
        errors.append(f"{rid}: url {record['url']!r} is not a llama.cpp / ik_llama.cpp / ggml-org CI source")
    if record["backend"] not in ("llama.cpp", "ik_llama.cpp"):
        errors.append(f"{rid}: backend {record['backend']!r}")
    if not record["buffers"]:
        errors.append(f"{rid}: no buffer line")
    if record["buffers"] != buffers_in(log):
        errors.append(f"{rid}: buffers differ from the buffer lines of the log")
    numbers = {int(t) for t in re.findall(r"\b\d+\b", log)}
    for key in ("n_ctx", "n_batch", "n_ubatch", "n_gpu_layers"):
        value = record["context"][key]
        if value is not None and value not in numbers:
            errors.append(f"{rid}: context.{key} = {value} does not appear in the log")
    for key, label in (("graph_nodes", "graph nodes"), ("graph_splits", "graph splits")):
        value = record[key]
        if value is not None and not re.search(rf"{label}\s*=\s*{value}\b", log):
            errors.append(f"{rid}: {key} = {value} does not appear in the log")
    if record["has_hparams"] and not re.search(r"(print_info|llm_load_print_meta): n_layer\s*=", log):
        errors.append(f"{rid}: has_hparams but no n_layer line in the log")
    return errors


def _load() -> list[Any]:
    with DATA.open(encoding="utf-8") as handle:
        data = json.load(handle)
    assert isinstance(data, list)
    return data


def test_every_record_matches_the_schema_and_its_log() -> None:
    errors = [error for record in _load() for error in record_errors(record)]
    assert not errors, "\n".join(errors)


def test_ids_are_unique_and_enough_records() -> None:
    ids = [record["id"] for record in _load()]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert len(ids) >= MIN_RECORDS


def test_the_buffer_parser_reads_both_log_generations() -> None:
    log = (
        "llm_load_tensors:      CUDA0 buffer size = 17284.05 MiB\n"
        "load_tensors:   CPU_Mapped model buffer size =   417.66 MiB\n"
        "llama_kv_cache_init: CUDA_Split KV buffer size = 14632.83 MiB\n"
        "llama_context:  CUDA_Host  output buffer size =     0.58 MiB\n"
        "llama_context:      CUDA1 compute buffer size =   312.75 MiB\n"
    )
    assert buffers_in(log) == [
        {"device": "CUDA0", "kind": "model", "mib": 17284.05},
        {"device": "CPU_Mapped", "kind": "model", "mib": 417.66},
        {"device": "CUDA_Split", "kind": "kv", "mib": 14632.83},
        {"device": "CUDA_Host", "kind": "output", "mib": 0.58},
        {"device": "CUDA1", "kind": "compute", "mib": 312.75},
    ]


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("graph_splits",), 999999),
        (("context", "n_ubatch"), 777777),
        (("url",), "https://example.com/log.txt"),
        (("has_hparams",), 1),
    ],
)
def test_the_validator_rejects_a_broken_record(path: tuple[str, ...], value: Any) -> None:
    record = copy.deepcopy(_load()[0])
    target = record
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert record_errors(record)


def test_an_edited_buffer_figure_is_caught() -> None:
    record = copy.deepcopy(_load()[0])
    record["buffers"][0]["mib"] += 1.0
    assert record_errors(record)
