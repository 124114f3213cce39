"""The ik_llama.cpp dialect's CPU compute buffer against ik's own libllama, to the 0.01 MiB it prints.

``core.compute_ik`` builds ik's graphs (its DeepSeek MLA paths, fused ops, its KQ mask) and runs ik's
allocator over them; the planner uses it for the configurations listed here and keeps mainline's
estimate elsewhere.  Each case is a command line for ik's server and the ``llama_context_params`` ik's
server derives from it; ik's figures come from the ik-llama-cpp-python wheel (CPU) through
``tests/support/ik_context.py``.  The graph node count the planner reports must equal ik's too.

Models: two DeepSeek-style files with DeepSeek-V3's attention shapes at a small width (as mainline
converts them and in the older ``attn_kv_b`` layout, see ``test_ik_memory``), one of them again with
DeepSeek-V2's softmax routing (``expert_gating_func`` 1, weights scaled, not normalized; the file keeps
``exp_probs_b``), the catalogue's dense llama, a Mixtral-style llama MoE, qwen3moe, glm4moe (leading
dense layer, shared expert, sigmoid routing, q/k/v biases, one NextN block), gpt-oss (SWA, sinks,
MXFP4 experts with biases) and gemma3 (SWA 5:1, post norms).  Every -mla mode with and without flash
attention, -ub below and above the 128-token threshold of ik's prompt path, -c below -ub, quantized
caches, several sequences.

-amb (``attn_max_batch``, MiB): ik's server raises values below 128 to 128, so the server path is
exercised with -c 65536 -amb 128 on the DeepSeek file, where the K*Q / ``attn_kv_b`` scratch exceeds
128 MiB.  Cases marked ``LIBRARY_AMB`` pass a smaller ``attn_max_batch`` straight to ik's library (no
server clamp) and the same value straight to the planner's ``ContextParams.amb``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from tests.support.ik_cases import DS_MAINLINE, DS_OLD, Q4_0, Q8_0, ik_plan, measure_cases, mla_of
from tests.support.ik_context import ModelReport
from tests.support.server_buffers import mib

from offload_planner.core.compute_ik import IK_SIMULATED
from offload_planner.core.memory import Projection
from offload_planner.core.synth import BIG_MODELS, SMALL_MODELS, write_model

pytestmark = pytest.mark.integration


CASES: list[tuple[str, str, dict[str, Any]]] = []
for _mla in (0, 1, 2, 3):
    CASES += [
        ("ds_mainline", f"-c 1100 -mla {_mla}", {"n_ctx": 1100, "mla_attn": _mla, "flash_attn": True}),
        ("ds_mainline", f"-c 1100 -mla {_mla} -fa off",
         {"n_ctx": 1100, "mla_attn": _mla, "flash_attn": False}),
        ("ds_mainline", f"-c 1100 -mla {_mla} -ub 64",
         {"n_ctx": 1100, "mla_attn": _mla, "flash_attn": True, "n_ubatch": 64}),
        ("ds_mainline", f"-c 1100 -mla {_mla} -fa off -ub 64",
         {"n_ctx": 1100, "mla_attn": _mla, "flash_attn": False, "n_ubatch": 64}),
    ]
CASES += [
    ("ds_mainline", "-c 4096 -ub 2048", {"n_ctx": 4096, "mla_attn": 3, "flash_attn": True, "n_ubatch": 2048}),
    ("ds_mainline", "-c 1100 -ub 128", {"n_ctx": 1100, "mla_attn": 3, "flash_attn": True, "n_ubatch": 128}),
    ("ds_mainline", "-c 1100 -ub 100", {"n_ctx": 1100, "mla_attn": 3, "flash_attn": True, "n_ubatch": 100}),
    ("ds_mainline", "-c 200", {"n_ctx": 200, "mla_attn": 3, "flash_attn": True}),
    ("ds_mainline", "-c 300 -b 100", {"n_ctx": 300, "mla_attn": 3, "flash_attn": True, "n_batch": 100}),
    ("ds_mainline", "-c 3000 -np 4", {"n_ctx": 3000, "mla_attn": 3, "flash_attn": True, "n_seq_max": 4}),
    ("ds_mainline", "-c 1100 -ctk q8_0", {"n_ctx": 1100, "mla_attn": 3, "flash_attn": True, "type_k": Q8_0}),
    ("ds_mainline", "-c 2100 -mla 2 -ctk q4_0", {"n_ctx": 2100, "mla_attn": 2, "flash_attn": True,
                                                  "type_k": Q4_0}),
    ("ds_mainline", "-c 1100 -mla 1 -fa off -ctk q8_0",
     {"n_ctx": 1100, "mla_attn": 1, "flash_attn": False, "type_k": Q8_0}),
    ("ds_mainline", "-c 1100 -mla 0 -ctk q8_0 -ctv q8_0",
     {"n_ctx": 1100, "mla_attn": 0, "flash_attn": True, "type_k": Q8_0, "type_v": Q8_0}),
    ("ds_old", "-c 1100 -mla 0 -fa off", {"n_ctx": 1100, "mla_attn": 0, "flash_attn": False}),
    ("ds_old", "-c 1100 -mla 1 -fa off", {"n_ctx": 1100, "mla_attn": 1, "flash_attn": False}),
    ("ds_old", "-c 1100", {"n_ctx": 1100, "mla_attn": 3, "flash_attn": True}),
    ("ds_old", "-c 1100 -mla 3 -fa off", {"n_ctx": 1100, "mla_attn": 3, "flash_attn": False}),
    ("ds_old", "-c 1100 -mla 2 -ctk q8_0",
     {"n_ctx": 1100, "mla_attn": 2, "flash_attn": True, "type_k": Q8_0}),
    ("llama", "-c 1100", {"n_ctx": 1100, "flash_attn": True}),
    ("llama", "-c 1100 -fa off", {"n_ctx": 1100, "flash_attn": False}),
    ("llama", "-c 1100 -np 2", {"n_ctx": 1100, "flash_attn": True, "n_seq_max": 2}),
    ("llama", "-c 700 -ctk q8_0 -ctv q8_0",
     {"n_ctx": 700, "flash_attn": True, "type_k": Q8_0, "type_v": Q8_0}),
    ("llama", "-c 1100 -ub 64", {"n_ctx": 1100, "flash_attn": True, "n_ubatch": 64}),
]
#: Architectures beyond DeepSeek and dense llama: the same command lines on each.
for _name in ("qwen3moe", "glm4moe", "gpt-oss", "gemma3", "llama_moe"):
    CASES += [
        (_name, "-c 1100", {"n_ctx": 1100, "flash_attn": True}),
        (_name, "-c 1100 -fa off", {"n_ctx": 1100, "flash_attn": False}),
        (_name, "-c 1100 -fa off -ub 64", {"n_ctx": 1100, "flash_attn": False, "n_ubatch": 64}),
        (_name, "-c 4096 -ub 2048", {"n_ctx": 4096, "flash_attn": True, "n_ubatch": 2048}),
        (_name, "-c 200 -b 100", {"n_ctx": 200, "flash_attn": True, "n_batch": 100}),
        (_name, "-c 3000 -np 4", {"n_ctx": 3000, "flash_attn": True, "n_seq_max": 4}),
        (_name, "-c 700 -ctk q8_0 -ctv q8_0",
         {"n_ctx": 700, "flash_attn": True, "type_k": Q8_0, "type_v": Q8_0}),
    ]
CASES += [
    ("gemma3", "-c 100", {"n_ctx": 100, "flash_attn": True}),
    ("gpt-oss", "-c 1100 -ctk q8_0 -fa off", {"n_ctx": 1100, "flash_attn": False, "type_k": Q8_0}),
]
for _mla in (0, 1, 2, 3):
    CASES += [
        ("ds_softmax", f"-c 1100 -mla {_mla}", {"n_ctx": 1100, "mla_attn": _mla, "flash_attn": True}),
        ("ds_softmax", f"-c 1100 -mla {_mla} -fa off",
         {"n_ctx": 1100, "mla_attn": _mla, "flash_attn": False}),
        ("ds_softmax", f"-c 1100 -mla {_mla} -ub 64",
         {"n_ctx": 1100, "mla_attn": _mla, "flash_attn": True, "n_ubatch": 64}),
        # -amb through the server: 128 MiB, below the K*Q (-mla 0/1 without FA) or attn_kv_b
        # (-mla 2/3 with FA) scratch of a 65536-cell context
        ("ds_mainline", f"-c 65536 -mla {_mla} -amb 128",
         {"n_ctx": 65536, "mla_attn": _mla, "flash_attn": True, "attn_max_batch": 128}),
        ("ds_mainline", f"-c 65536 -mla {_mla} -fa off -amb 128",
         {"n_ctx": 65536, "mla_attn": _mla, "flash_attn": False, "attn_max_batch": 128}),
    ]
#: -amb below the server's floor: given to ik's library and to ContextParams.amb directly.
LIBRARY_AMB = "(library attn_max_batch)"
CASES += [
    ("ds_mainline", f"-c 1100 -mla 0 -fa off {LIBRARY_AMB}",
     {"n_ctx": 1100, "mla_attn": 0, "flash_attn": False, "attn_max_batch": 1}),
    ("ds_mainline", f"-c 1100 -mla 0 -fa off -ub 64 {LIBRARY_AMB}",
     {"n_ctx": 1100, "mla_attn": 0, "flash_attn": False, "n_ubatch": 64, "attn_max_batch": 1}),
    ("ds_mainline", f"-c 1100 -mla 0 {LIBRARY_AMB}",
     {"n_ctx": 1100, "mla_attn": 0, "flash_attn": True, "attn_max_batch": 1}),
    ("ds_mainline", f"-c 1100 -mla 1 -fa off {LIBRARY_AMB}",
     {"n_ctx": 1100, "mla_attn": 1, "flash_attn": False, "attn_max_batch": 1}),
    ("ds_mainline", f"-c 1100 -mla 3 {LIBRARY_AMB}",
     {"n_ctx": 1100, "mla_attn": 3, "flash_attn": True, "attn_max_batch": 1}),
    ("ds_mainline", f"-c 1100 -mla 3 -fa off {LIBRARY_AMB}",
     {"n_ctx": 1100, "mla_attn": 3, "flash_attn": False, "attn_max_batch": 1}),
    ("llama_mha", f"-c 1100 -fa off {LIBRARY_AMB}",
     {"n_ctx": 1100, "flash_attn": False, "attn_max_batch": 1}),
    ("llama_mha", "-c 1100 -fa off", {"n_ctx": 1100, "flash_attn": False}),
]

#: DeepSeek-V2's routing on the V3-shaped file: softmax gating, weights scaled by 16, not normalized.
DS_SOFTMAX = replace(DS_MAINLINE, name="synth-deepseek2-softmax-routing",
                     extra_kv={"expert_weights_scale": 16.0, "expert_gating_func": 1})
#: Mixtral-style llama MoE (ik reads the experts' width from n_ff) and a llama without GQA (where
#: -amb splits K*Q by head).
LLAMA_MOE = replace(SMALL_MODELS["llama"], name="synth-llama-moe", n_expert=8, n_expert_used=2, n_ff_exp=512)
LLAMA_MHA = replace(SMALL_MODELS["llama"], name="synth-llama-mha", n_head_kv=8)

NODES = re.compile(r"(\d+) nodes")


@pytest.fixture(scope="module")
def model_files(small_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ik_compute_models")
    return {
        **{name: small_models[name] for name in ("llama", "qwen3moe", "glm4moe", "gpt-oss", "gemma3")},
        "ds_mainline": write_model(DS_MAINLINE, root / "ds_mainline.gguf")[0],
        "ds_old": write_model(DS_OLD, root / "ds_old.gguf")[0],
        "ds_softmax": write_model(DS_SOFTMAX, root / "ds_softmax.gguf")[0],
        "llama_moe": write_model(LLAMA_MOE, root / "llama_moe.gguf")[0],
        "llama_mha": write_model(LLAMA_MHA, root / "llama_mha.gguf")[0],
    }


@pytest.fixture(scope="module")
def ik_reports(model_files: dict[str, Path]) -> dict[tuple[str, int], ModelReport]:
    return measure_cases(model_files, CASES)


def _plan(path: Path, args: str, library_amb: int | None = None) -> tuple[Projection, list[str]]:
    """The planner on ik's server command line; ``library_amb`` bypasses the server's -amb floor."""
    return ik_plan(path, args.replace(LIBRARY_AMB, ""), library_amb)


def test_cpu_compute_buffer_equals_ik(model_files: dict[str, Path],
                                      ik_reports: dict[tuple[str, int], ModelReport]) -> None:
    table = [f"{'model':12} {'command':60} {'ours MiB':>9} {'ik MiB':>9} {'ours nodes':>10} {'ik nodes':>8}"]
    bad: list[str] = []
    for name, args, settings in CASES:
        report = ik_reports[(name, mla_of(settings))]
        assert report.loaded, f"{name}: ik did not load it:\n{report.stdout[-2000:]}"
        ctx = next(c for c in report.contexts if c.settings == settings)
        assert ctx.created, f"{name} {args}: ik refused it: {ctx.lines[-3:]}"
        ik_mib = ctx.compute_mib.get("CPU")
        ik_nodes = next((int(line.split("=")[1]) for line in ctx.lines if "graph nodes" in line), None)
        library_amb = settings["attn_max_batch"] if LIBRARY_AMB in args else None
        projection, errors = _plan(model_files[name], args, library_amb)
        assert not errors, (name, args, errors)
        (buf,) = [b for b in projection.buffers() if b.kind == "compute"]
        ours = mib(buf.bytes)
        m = NODES.search(buf.why)
        nodes = int(m.group(1)) if m else None
        table.append(f"{name:12} {args:60} {ours:9.2f} {ik_mib:9.2f} {nodes!s:>10} {ik_nodes!s:>8}")
        if not buf.why.startswith(IK_SIMULATED):
            bad.append(f"{name} {args}: not simulated as ik: {buf.why}")
        if ik_mib is None or abs(ours - ik_mib) > 0.0051 or nodes != ik_nodes:
            bad.append(f"{name} {args}: ours {ours} MiB / {nodes} nodes, ik {ik_mib} MiB / {ik_nodes} nodes")
    print("\n".join(table))
    assert not bad, "\n".join(bad)


def test_real_shapes_get_iks_graph(tmp_path: Path) -> None:
    """The published models of every architecture verified above (header-only files with their real
    tensor lists: GLM-4.5-Air's NextN block, Qwen3's 128 experts, ...) take ik's simulated graph."""
    for name in ("DeepSeek-V3-Q4_K_M", "Qwen3-30B-A3B-Q4_K_M", "GLM-4.5-Air-Q4_K_M", "gpt-oss-120b-MXFP4",
                 "Llama-3.1-70B-Q4_K_M"):
        [path] = write_model(BIG_MODELS[name], tmp_path / f"{name}.gguf", header_only=True)
        projection, _errors = _plan(path, "-c 8192")
        bufs = [b for b in projection.buffers() if b.kind == "compute"]
        assert bufs and all(b.why.startswith(IK_SIMULATED) for b in bufs), (name, [b.why for b in bufs])


def test_other_architectures_keep_the_labelled_mainline_estimate(small_models: dict[str, Path],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Where compute_ik has no verified graph (``supported`` is false): mainline's graph, flagged."""
    from offload_planner.core.compute_ik import buffers

    monkeypatch.setattr(buffers, "supported", lambda model, p: False)
    projection, _errors = _plan(small_models["qwen3moe"], "-c 1100")
    bufs = [b for b in projection.buffers() if b.kind == "compute"]
    assert bufs and all(b.why.startswith("estimate for ik_llama.cpp") for b in bufs)
