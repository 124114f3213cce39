"""The development set of public speed measurements (tests/data/speed/public_measurements.json).

Checks the file's schema strictly: required keys and their types, ids unique, URLs pointing at
llama.cpp / ik_llama.cpp threads on GitHub, and every measured figure (tokens/s, token counts,
context depth) present in the record's verbatim quote as a number, so that nothing in
``measured`` can have been rounded or invented. The validator is also run on broken copies of a
record to show that it rejects them.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from gguf import GGMLQuantizationType

DATA = Path(__file__).resolve().parents[1] / "data" / "speed" / "public_measurements.json"

MIN_RECORDS = 25
BACKENDS = {"llama.cpp", "ik_llama.cpp"}
URL_RE = re.compile(
    r"^https://github\.com/(ggml-org/llama\.cpp|ggerganov/llama\.cpp|ikawrakow/ik_llama\.cpp)"
    r"/((issues|pull|discussions)/\d+(#[A-Za-z0-9_-]+)?|blob/[0-9a-f]{40}/[\w./-]+)$"
)
ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
NUMBER_RE = re.compile(r"\d+(?:\.\d+)?")

TOP_KEYS = {
    "id": str,
    "url": str,
    "quote": str,
    "backend": str,
    "build": (str, type(None)),
    "cpu_tiled_matmul": bool,
    "cpu_llamafile_sgemm": bool,
    "cpu_threads_forced": (int, type(None)),
    "model": dict,
    "command": (str, type(None)),
    "settings": dict,
    "hardware": dict,
    "measured": dict,
    "notes": str,
}
OPT_NUM = (int, float, type(None))
OPT_INT = (int, type(None))
OPT_STR = (str, type(None))
MODEL_KEYS = {
    "arch": str,
    "name": str,
    "params_b": OPT_NUM,
    "active_params_b": OPT_NUM,
    "quant": str,
    "size_gib": OPT_NUM,
    "n_layer": OPT_INT,
    "n_expert": OPT_INT,
    "n_expert_used": OPT_INT,
    # a mixed quant the post spells out: QuantMix role -> ggml type name (embd, output, attn, attn_v,
    # ffn, ffn_down, shexp, shexp_down, exps, exps_down); null: one type, by `quant` and `size_gib`
    "quant_mix": (dict, type(None)),
}
SETTINGS_KEYS = {
    "ngl": OPT_INT,
    "ot": list,
    "n_cpu_moe": OPT_INT,
    "ctx": OPT_INT,
    "batch": OPT_INT,
    "ubatch": OPT_INT,
    "fa": (bool, type(None)),
    "ctk": OPT_STR,
    "ctv": OPT_STR,  # -ctv / --cache-type-v (llama-bench's type_v column)
    "nkvo": (bool, type(None)),  # -nkvo / --no-kv-offload (llama-bench's nkvo column); null: not stated
    "threads": OPT_INT,
    "split_mode": OPT_STR,
    "tensor_split": (list, type(None)),
}
MIX_ROLES = {"embd", "output", "attn", "attn_v", "ffn", "ffn_down", "shexp", "shexp_down", "exps",
             "exps_down"}
HARDWARE_KEYS = {"cpu": OPT_STR, "ram": OPT_STR, "gpus": list, "notes": OPT_STR}
MEASURED_KEYS = {
    "pp_tps": OPT_NUM,
    "pp_tokens": OPT_INT,
    "tg_tps": OPT_NUM,
    "tg_tokens": OPT_INT,
    "depth": int,
}


def _check_keys(where: str, obj: dict[str, Any], spec: dict[str, Any]) -> list[str]:
    errors = []
    if set(obj) != set(spec):
        errors.append(f"{where}: keys {sorted(obj)} != {sorted(spec)}")
    for key, types in spec.items():
        if key not in obj:
            continue
        value = obj[key]
        # bool is an int subclass: never accept it where a number is meant.
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
            errors.append(f"{where}.{key}: bool where {types} expected")
        elif not isinstance(value, types):
            errors.append(f"{where}.{key}: {type(value).__name__} is not {types}")
    return errors


def _numbers_in(text: str) -> set[float]:
    return {float(token) for token in NUMBER_RE.findall(text)}


def record_errors(record: Any) -> list[str]:
    """Every schema violation of one record (empty when the record is valid)."""
    if not isinstance(record, dict):
        return ["record is not an object"]
    rid = str(record.get("id", "?"))
    errors = _check_keys(rid, record, TOP_KEYS)
    if errors:
        return errors
    errors += _check_keys(f"{rid}.model", record["model"], MODEL_KEYS)
    errors += _check_keys(f"{rid}.settings", record["settings"], SETTINGS_KEYS)
    errors += _check_keys(f"{rid}.hardware", record["hardware"], HARDWARE_KEYS)
    errors += _check_keys(f"{rid}.measured", record["measured"], MEASURED_KEYS)
    if errors:
        return errors
    if not ID_RE.match(rid):
        errors.append(f"{rid}: id is not a lower-case slug")
    if not URL_RE.match(record["url"]):
        errors.append(f"{rid}: url {record['url']!r} is not a llama.cpp/ik_llama.cpp GitHub thread")
    if record["backend"] not in BACKENDS:
        errors.append(f"{rid}: backend {record['backend']!r} not in {sorted(BACKENDS)}")
    if not record["quote"].strip() or not record["notes"].strip():
        errors.append(f"{rid}: empty quote or notes")
    if not all(isinstance(rule, str) and "=" in rule for rule in record["settings"]["ot"]):
        errors.append(f"{rid}: settings.ot must be a list of PATTERN=BUFFER strings")
    if not all(isinstance(gpu, str) and gpu for gpu in record["hardware"]["gpus"]):
        errors.append(f"{rid}: hardware.gpus must be a list of names")
    errors += _measured_errors(rid, record["measured"], record["quote"])
    mix = record["model"]["quant_mix"] or {}
    if set(mix) - MIX_ROLES or not all(v in GGMLQuantizationType.__members__ for v in mix.values()):
        errors.append(f"{rid}: model.quant_mix must map roles of {sorted(MIX_ROLES)} to ggml type names")
    said = f"{record['quote']} {record['command'] or ''}"
    if record["settings"]["nkvo"] is not None and not re.search(r"nkvo|no-kv-offload", said):
        errors.append(f"{rid}: settings.nkvo is set but neither the quote nor the command names -nkvo")
    return errors


def _measured_errors(rid: str, measured: dict[str, Any], quote: str) -> list[str]:
    errors = []
    if measured["pp_tps"] is None and measured["tg_tps"] is None:
        errors.append(f"{rid}: neither pp_tps nor tg_tps measured")
    for rate, count in (("pp_tps", "pp_tokens"), ("tg_tps", "tg_tokens")):
        if measured[rate] is None and measured[count] is not None:
            errors.append(f"{rid}: {count} is set but {rate} is null")
        for key in (rate, count):
            value = measured[key]
            if value is not None and value <= 0:
                errors.append(f"{rid}: measured.{key} = {value} is not positive")
    if measured["depth"] < 0:
        errors.append(f"{rid}: measured.depth is negative")
    in_quote = _numbers_in(quote)
    for key in ("pp_tps", "pp_tokens", "tg_tps", "tg_tokens", "depth"):
        value = measured[key]
        if value is None or (key == "depth" and value == 0):
            continue
        if float(value) not in in_quote:
            errors.append(f"{rid}: measured.{key} = {value} does not appear in the quote")
    return errors


def _load() -> list[Any]:
    with DATA.open(encoding="utf-8") as handle:
        data = json.load(handle)
    assert isinstance(data, list), f"{DATA}: top level must be a JSON list"
    return data


def test_every_record_matches_the_schema() -> None:
    records = _load()
    errors = [error for record in records for error in record_errors(record)]
    assert not errors, "\n".join(errors)


def test_ids_are_unique_and_enough_records() -> None:
    records = _load()
    ids = [record["id"] for record in records]
    duplicates = sorted({rid for rid in ids if ids.count(rid) > 1})
    assert not duplicates, f"duplicate ids: {duplicates}"
    assert len(records) >= MIN_RECORDS, f"{len(records)} records, need at least {MIN_RECORDS}"


def _is_moe(record: dict[str, Any]) -> bool:
    """Known expert count, fewer active than total parameters, or expert tensors named in the flags."""
    model, settings = record["model"], record["settings"]
    active, total = model["active_params_b"], model["params_b"]
    return (
        bool(model["n_expert"])
        or (active is not None and total is not None and active < total)
        or settings["n_cpu_moe"] is not None
        or any("exps" in rule for rule in settings["ot"])
    )


def _weights_partly_on_cpu(record: dict[str, Any]) -> bool:
    settings, model = record["settings"], record["model"]
    partial_layers = (
        settings["ngl"] is not None and model["n_layer"] is not None and settings["ngl"] < model["n_layer"]
    )
    return (
        not record["hardware"]["gpus"]
        or any(rule.endswith("=CPU") for rule in settings["ot"])
        or settings["n_cpu_moe"] is not None
        or partial_layers
    )


def test_the_set_covers_cpu_expert_offload_and_cpu_only_moe() -> None:
    """The estimator is mostly about MoE with experts in RAM: those must be well represented."""
    moe_on_cpu = [r["id"] for r in _load() if _is_moe(r) and _weights_partly_on_cpu(r)]
    assert len(moe_on_cpu) >= 15, moe_on_cpu


def _a_valid_record() -> dict[str, Any]:
    for record in _load():
        if not record_errors(record) and record["measured"]["tg_tps"] is not None:
            return copy.deepcopy(record)
    raise AssertionError("no valid record with a tg figure")


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("measured", "tg_tps"), 1234.567),  # a figure the quote does not contain
        (("measured", "pp_tokens"), 3.5),  # wrong type
        (("measured", "depth"), None),  # wrong type
        (("url",), "https://example.com/post/1"),  # unknown host
        (("backend",), "vllm"),
        (("settings", "fa"), 1),  # int where a bool is meant
        (("settings", "nkvo"), 1),  # int where a bool is meant
        (("model", "params_b"), True),  # bool where a number is meant
        (("hardware", "gpus"), "RTX 4090"),  # not a list
        (("model", "quant_mix"), "Q8_0"),  # not an object
        (("model", "quant_mix"), {"attn": "Q9_0"}),  # no such ggml type
        (("model", "quant_mix"), {"experts": "Q8_0"}),  # no such role
    ],
)
def test_the_validator_rejects_a_broken_record(path: tuple[str, ...], value: Any) -> None:
    record = _a_valid_record()
    target = record
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert record_errors(record), f"a record with {'.'.join(path)} = {value!r} passed the schema check"


def test_the_validator_rejects_an_nkvo_the_post_does_not_state() -> None:
    record = _a_valid_record()
    record["settings"]["nkvo"] = True
    record["quote"] = record["quote"].replace("nkvo", "")
    assert record_errors(record)


def test_the_validator_rejects_a_missing_key() -> None:
    record = _a_valid_record()
    del record["settings"]["ubatch"]
    assert record_errors(record)
