"""The ik_llama.cpp dialect against ik's own libllama: KV cache, output buffer, weights and the
tensors ik computes at load, per MLA mode, and ik's refusals.

ik's figures come from the ik-llama-cpp-python wheel (ik's libllama, CPU) through
``tests/support/ik_context.py``; each case is a command line as a user types it for ik's server
and the context parameters ik's server derives from it (written out by hand here, not by the
planner's parser). The planner's side is ``offload-planner plan --backend ik_llama.cpp``'s engine.

Models: the small architectures of the catalogue, and two DeepSeek-style files with DeepSeek-V3's
attention shapes at a small width: one as mainline converts it (``attn_k_b``/``attn_v_b``, one KV
head), one in the older layout (``attn_kv_b``, every head). The catalogue's own deepseek2 has
shapes ik refuses, which is itself a case.

Compute buffers are printed beside ik's but not asserted: the planner simulates mainline's graph,
and ik builds its own (fused MoE and up/gate ops, its MLA paths).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.ik_cases import DS_MAINLINE, DS_OLD, Q4_0, Q8_0, ik_plan, measure_cases, mla_of, require_ik
from tests.support.ik_context import ModelReport, measure
from tests.support.server_buffers import mib

from offload_planner.core import ik
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import IK_CPU_BUFFER_EXTRA, Projection
from offload_planner.core.synth import write_model

pytestmark = pytest.mark.integration


#: (model, command line, what ik's server passes to its context). ik's server defaults:
#: -fa on, -mla 3, f16 caches, one sequence.
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("ds_mainline", "-c 1100 -mla 0 -fa off", {"n_ctx": 1100, "mla_attn": 0, "flash_attn": False}),
    ("ds_mainline", "-c 1100 -mla 1 -fa off", {"n_ctx": 1100, "mla_attn": 1, "flash_attn": False}),
    ("ds_mainline", "-c 1100 -mla 2 -fa off", {"n_ctx": 1100, "mla_attn": 2, "flash_attn": False}),
    ("ds_mainline", "-c 1100 -mla 3 -fa off", {"n_ctx": 1100, "mla_attn": 3, "flash_attn": False}),
    ("ds_mainline", "-c 1100", {"n_ctx": 1100, "mla_attn": 3, "flash_attn": True}),
    ("ds_mainline", "-c 1100 -mla 3 -fa off -ctk q8_0",  # c^KV takes the V type here
     {"n_ctx": 1100, "mla_attn": 3, "flash_attn": False, "type_k": Q8_0}),
    ("ds_mainline", "-c 1100 -mla 2 -fa off -ctk q8_0",
     {"n_ctx": 1100, "mla_attn": 2, "flash_attn": False, "type_k": Q8_0}),
    ("ds_mainline", "-c 1100 -mla 1", {"n_ctx": 1100, "mla_attn": 1, "flash_attn": True}),
    ("ds_mainline", "-c 1100 -mla 0", {"n_ctx": 1100, "mla_attn": 0, "flash_attn": True}),
    ("ds_mainline", "-c 1100 -mla 1 -fa off -ctk q8_0",
     {"n_ctx": 1100, "mla_attn": 1, "flash_attn": False, "type_k": Q8_0}),
    ("ds_mainline", "-c 1100 -ctk q8_0", {"n_ctx": 1100, "mla_attn": 3, "flash_attn": True, "type_k": Q8_0}),
    ("ds_mainline", "-c 1100 -mla 0 -ctk q8_0 -ctv q8_0",
     {"n_ctx": 1100, "mla_attn": 0, "flash_attn": True, "type_k": Q8_0, "type_v": Q8_0}),
    ("ds_mainline", "-c 3000 -np 4", {"n_ctx": 3000, "mla_attn": 3, "flash_attn": True, "n_seq_max": 4}),
    ("ds_mainline", "-c 2100 -mla 2 -ctk q4_0", {"n_ctx": 2100, "mla_attn": 2, "flash_attn": True,
                                                  "type_k": Q4_0}),
    ("ds_mainline", "-c 1100 -mla 1 -fa off -ctk q8_0 -ctv q8_0",  # refused: quantized V needs FA
     {"n_ctx": 1100, "mla_attn": 1, "flash_attn": False, "type_k": Q8_0, "type_v": Q8_0}),
    ("ds_old", "-c 1100 -mla 0 -fa off", {"n_ctx": 1100, "mla_attn": 0, "flash_attn": False}),
    ("ds_old", "-c 1100 -mla 1 -fa off", {"n_ctx": 1100, "mla_attn": 1, "flash_attn": False}),
    ("ds_old", "-c 1100", {"n_ctx": 1100, "mla_attn": 3, "flash_attn": True}),
    ("ds_old", "-c 1100 -mla 2 -ctk q8_0",
     {"n_ctx": 1100, "mla_attn": 2, "flash_attn": True, "type_k": Q8_0}),
]
for _name in ("llama", "qwen3moe", "glm4moe", "gemma3", "gpt-oss"):
    CASES += [
        (_name, "-c 1100 -fa off", {"n_ctx": 1100, "flash_attn": False}),
        (_name, "-c 1100 -np 2", {"n_ctx": 1100, "flash_attn": True, "n_seq_max": 2}),
        (_name, "-c 700 -ctk q8_0 -ctv q8_0", {"n_ctx": 700, "flash_attn": True, "type_k": Q8_0,
                                               "type_v": Q8_0}),
    ]


@pytest.fixture(scope="module")
def model_files(small_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ik_models")
    files = dict(small_models)
    files["ds_mainline"] = write_model(DS_MAINLINE, root / "ds_mainline.gguf")[0]
    files["ds_old"] = write_model(DS_OLD, root / "ds_old.gguf")[0]
    return files


@pytest.fixture(scope="module")
def ik_reports(model_files: dict[str, Path]) -> dict[tuple[str, int], ModelReport]:
    return measure_cases(model_files, CASES)


def _context(report: ModelReport, settings: dict[str, Any]) -> Any:
    return next(c for c in report.contexts if c.settings == settings)


def _rows(model_files: dict[str, Path], ik_reports: dict[tuple[str, int], ModelReport]
          ) -> Iterator[tuple[str, str, Projection, list[str], ModelReport, Any]]:
    for name, args, settings in CASES:
        report = ik_reports[(name, mla_of(settings))]
        projection, errors = ik_plan(model_files[name], args)
        yield name, args, projection, errors, report, _context(report, settings)


def test_kv_output_and_refusals_equal_ik(model_files: dict[str, Path],
                                         ik_reports: dict[tuple[str, int], ModelReport]) -> None:
    table = [f"{'model':12} {'command':42} {'KV ours':>9} {'ik':>9} {'out ours':>8} {'ik':>6} "
             f"{'compute ours':>12} {'ik':>8}"]
    bad: list[str] = []
    for name, args, projection, errors, report, ctx in _rows(model_files, ik_reports):
        assert report.loaded, f"{name}: ik did not load it:\n{report.stdout[-2000:]}"
        if not ctx.created:
            refusal = next((line for line in ctx.lines if "requires" in line or "error" in line.lower()), "")
            table.append(f"{name:12} {args:42} refused by ik: {refusal.strip()}")
            if not any("V cache quantization requires flash_attn" in e for e in errors):
                bad.append(f"{name} {args}: ik refuses ({refusal.strip()}), the planner does not: {errors}")
            continue
        if errors:
            bad.append(f"{name} {args}: ik accepts it, the planner refuses: {errors}")
        cpu = projection.device("CPU")
        kv, out, comp = mib(cpu.kv), mib(cpu.output), mib(cpu.compute)
        ik_kv, ik_out = ctx.kv_mib.get("CPU"), ctx.output_mib.get("CPU")
        ik_comp = ctx.compute_mib.get("CPU", float("nan"))
        table.append(f"{name:12} {args:42} {kv:9.2f} {ik_kv:9.2f} {out:8.2f} {ik_out:6.2f} "
                     f"{comp:12.2f} {ik_comp:8.2f}")
        if ik_kv is None or abs(kv - ik_kv) > 0.0051:
            bad.append(f"{name} {args}: KV {kv} MiB, ik {ik_kv} MiB")
        if ik_out is None or abs(out - ik_out) > 0.0051:
            bad.append(f"{name} {args}: output {out} MiB, ik {ik_out} MiB")
    print("\n".join(table))
    assert not bad, "\n".join(bad)


def test_weights_and_computed_mla_tensors_equal_ik(model_files: dict[str, Path],
                                                   ik_reports: dict[tuple[str, int], ModelReport]) -> None:
    """ik's llama_model_size counts the tensors it computes at load: for the DeepSeek files, minus
    the file's tensors, that is exactly what the planner adds for the MLA mode. The weights buffer
    is the mmap span for every model."""
    seen: set[tuple[str, int]] = set()
    lines = []
    for name, _args, projection, _errors, report, _ctx in _rows(model_files, ik_reports):
        key = (name, report.mla)
        if key in seen:
            continue
        seen.add(key)
        model = open_model(model_files[name])
        tensors = ik.computed_tensors(model, report.mla)
        extra = sum(c.nbytes for c in tensors)
        ik_extra = report.model_size - model.total_bytes
        buffers = sum(b.bytes for b in projection.buffers() if b.kind == "model" and "computes" in b.why)
        assert buffers == extra + IK_CPU_BUFFER_EXTRA * len(tensors)  # one CPU buffer each
        mapped = sum(b.bytes for b in projection.buffers()  # ik names its mmap buffer plain CPU
                     if b.kind == "model" and b.name == "CPU" and "computes" not in b.why)
        lines.append(f"{name:12} -mla {report.mla}: computed ours {extra} B, ik {ik_extra} B; "
                     f"weights buffer ours {mib(mapped)} MiB, ik {report.weights_mib}")
        if name.startswith("ds_"):
            assert extra == ik_extra, lines[-1]
        else:  # ik's count also has duplicated tensors (tied output, rope_freqs per layer) and no NextN
            assert tensors == [], lines[-1]
        assert abs(mib(mapped) - report.weights_mib["CPU"]) < 0.0051, lines[-1]
    print("\n".join(lines))
    computed = {k for k in seen if k[0].startswith("ds_")}
    assert computed, "no DeepSeek case ran"


def test_computed_tensors_are_named_and_shaped_as_ik_prints_them(
        ik_reports: dict[tuple[str, int], ModelReport], model_files: dict[str, Path]) -> None:
    """ik printf()s every tensor it computes: ``Computed blk.0.attn_kv_b.weight as 512 x 1024 ...``."""
    checked = 0
    for (name, mla), report in ik_reports.items():
        if not name.startswith("ds_"):
            continue
        printed = sorted(f"{m.group(1)} {m.group(2)}" for line in report.stdout.splitlines()
                         if (m := re.match(r"Computed (\S+) as ([0-9x ]+?) of type", line)))
        ours = sorted(f"{c.name} {' x '.join(str(d) for d in c.shape)}"
                      for c in ik.computed_tensors(open_model(model_files[name]), mla))
        assert printed == ours, (name, mla)
        checked += len(ours)
    assert checked >= 20, "no computed tensors were compared"


def test_ik_refuses_the_mainline_deepseek_file_the_planner_flags(small_models: dict[str, Path],
                                                                 model_files: dict[str, Path]) -> None:
    require_ik()
    bad = measure(small_models["deepseek2"], 3, [])
    assert not bad.loaded
    assert "Detected incompatible DeepSeek model without a known way to fix it" in bad.stdout
    errors = ik.model_errors(open_model(small_models["deepseek2"]))
    assert len(errors) == 1 and "Detected incompatible DeepSeek model" in errors[0]
    assert ik.model_errors(open_model(model_files["ds_mainline"])) == []
