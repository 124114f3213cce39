"""ik_llama.cpp's speculative draft model (``-md`` with ``--spec-type draft``) against ik's own libllama:
the draft context's KV, output and compute buffers and the draft's weights, to the 0.01 MiB ik prints.

ik's server loads the draft with ``common_speculative_load_draft_model`` (common/speculative.cpp
1939-1999 at ikawrakow/ik_llama.cpp 8337e4cd): a copy of the main parameters with ``-ngld``, ``-devd``,
``-ctkd``/``-ctvd`` (else the main ``-ctk``/``-ctv``), the ``-draft "ARGS"`` line parsed onto it, the
main ``-c`` as given (``-cd`` only without it; 0: the draft's trained length) and one sequence; its
context takes ``common_context_params_to_llama`` of that (``n_batch`` = min(-b, n_ctx)).  Each case
below is a command line for ik's server and those ``llama_context_params`` written out by hand; ik's
figures come from the ik-llama-cpp-python wheel (CPU) through ``tests/support/ik_context.py``, the
planner's from ``analyse_command`` with the ik dialect (the draft's buffers are the projection's
``draft`` extra).  Models: the catalogue's ``llama`` and its two-layer draft ``llama-draft``.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
from tests.support.ik_cases import Q8_0, cpu_only, require_ik
from tests.support.ik_context import ModelReport, measure
from tests.support.server_buffers import mib, mib_rows

from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import check_semantics, parse_server_args
from offload_planner.core.dialects import IK
from offload_planner.core.extra_context import DRAFT
from offload_planner.core.gguf_reader import open_model

pytestmark = pytest.mark.integration

_BASE = {"n_seq_max": 1, "n_ubatch": 512, "flash_attn": True}
#: (command line, DRAFT standing for the draft's path; the draft context ik's server creates)
CASES: list[tuple[str, dict[str, Any]]] = [
    ("-c 1100 -md DRAFT --spec-type draft", {**_BASE, "n_ctx": 1100, "n_batch": 1100}),
    ("-md DRAFT --spec-type draft -cd 700", {**_BASE, "n_ctx": 700, "n_batch": 700}),
    ("-md DRAFT --spec-type draft", {**_BASE, "n_ctx": 0, "n_batch": 2048}),  # the draft's trained length
    ("-c 1100 -cd 300 -md DRAFT --spec-type draft -ctkd q8_0 -ctvd q8_0",  # -cd ignored beside -c
     {**_BASE, "n_ctx": 1100, "n_batch": 1100, "type_k": Q8_0, "type_v": Q8_0}),
    ("-c 2000 -ub 256 -fa off -md DRAFT --spec-type draft:n_max=4",
     {**_BASE, "n_ctx": 2000, "n_batch": 2000, "n_ubatch": 256, "flash_attn": False}),
    ("-c 1100 -ctk q8_0 -md DRAFT --spec-type draft",
     {**_BASE, "n_ctx": 1100, "n_batch": 1100, "type_k": Q8_0}),
    ("-c 1100 -md DRAFT --spec-type draft -draft '-c 600 -ub 128'",
     {**_BASE, "n_ctx": 600, "n_batch": 600, "n_ubatch": 128}),
    ("-c 1100 --spec-type ngram-mod --spec-type draft -md DRAFT", {**_BASE, "n_ctx": 1100, "n_batch": 1100}),
]


@pytest.fixture(scope="module")
def ik_draft(small_models: dict[str, Path]) -> ModelReport:
    require_ik()
    return measure(small_models["llama-draft"], 0, [settings for _, settings in CASES])


def _draft_buffers(small_models: dict[str, Path], args: str) -> tuple[dict[str, float], list[str]]:
    argv = shlex.split(args.replace("DRAFT", str(small_models["llama-draft"])))
    parsed = parse_server_args(argv, dialect=IK)
    devices = cpu_only()
    errors = [str(e) for e in parsed.errors + check_semantics(parsed, devices.names)]
    projection = analyse_command(open_model(small_models["llama"]), devices, parsed, IK).projection
    assert projection is not None
    out: dict[str, float] = {}
    for b in projection.buffers():
        if b.owner == DRAFT:
            out[b.kind] = out.get(b.kind, 0.0) + mib(b.bytes)
    return out, errors


def test_draft_context_equals_ik(small_models: dict[str, Path], ik_draft: ModelReport) -> None:
    assert ik_draft.loaded, ik_draft.stdout[-2000:]
    table = [f"{'command':66} {'kind':14} {'ours':>8} {'ik':>8}"]
    bad: list[str] = []
    for (args, _settings), ctx in zip(CASES, ik_draft.contexts, strict=True):
        assert ctx.created, f"{args}: ik did not create the draft context"
        ours, errors = _draft_buffers(small_models, args)
        if errors:
            bad.append(f"{args}: ik accepts it, the planner refuses: {errors}")
        theirs = {"model": ik_draft.weights_mib.get("CPU"), "kv": ctx.kv_mib.get("CPU"),
                  "output": ctx.output_mib.get("CPU"), "compute": ctx.compute_mib.get("CPU")}
        rows, wrong = mib_rows(args, ours, theirs, 66)
        table += rows
        bad += wrong
    print("\n".join(table))
    assert not bad, "\n".join(bad)
