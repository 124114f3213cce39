"""ik_llama.cpp's MTP stage (``--spec-type mtp`` on a model with a NextN layer) against ik's own libllama:
the main context's KV (the NextN layer included), output and compute, and the MTP context's KV, output
and compute, to the 0.01 MiB ik prints.

ik's server loads the model with ``mparams.mtp`` (common/common.cpp 4287 at 8337e4cd), creates the
main context with ``cparams.mtp`` (4384) and the MTP context from the same parameters with ``mtp``,
``MTP_OP_WARMUP`` and embeddings on (common/speculative.cpp 2035-2043).  The ik-llama-cpp-python
wheel's ik (55d3c05) builds the MTP graph for GLM-4.x MoE only (src/llama.cpp 5503), so the model is
the catalogue's ``glm4moe`` (4 layers + 1 NextN).  ik's figures through ``tests/support/ik_context.py``
(``model_params={"mtp": True}``), the planner's from ``analyse_command`` with the ik dialect (the MTP
context's buffers are the projection's ``mtp`` extra).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
from tests.support.ik_cases import cpu_only, require_ik
from tests.support.ik_context import ModelReport, measure
from tests.support.server_buffers import mib, mib_rows

from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import check_semantics, parse_server_args
from offload_planner.core.dialects import IK
from offload_planner.core.extra_context import MTP
from offload_planner.core.gguf_reader import open_model

pytestmark = pytest.mark.integration

#: (command line, the context ik's server creates: n_batch = min(-b, n_ctx))
CASES: list[tuple[str, dict[str, Any]]] = [
    ("-c 1100 --spec-type mtp", {"n_ctx": 1100, "n_batch": 1100, "n_ubatch": 512, "flash_attn": True}),
    ("-c 1100 -ub 128 --spec-type mtp",
     {"n_ctx": 1100, "n_batch": 1100, "n_ubatch": 128, "flash_attn": True}),
    ("-c 1100 -fa off --spec-type mtp",
     {"n_ctx": 1100, "n_batch": 1100, "n_ubatch": 512, "flash_attn": False}),
    ("-c 1100 -fa off -ub 128 --spec-type mtp:n_max=1",
     {"n_ctx": 1100, "n_batch": 1100, "n_ubatch": 128, "flash_attn": False}),
    ("-c 4096 --spec-type mtp", {"n_ctx": 4096, "n_batch": 2048, "n_ubatch": 512, "flash_attn": True}),
    ("-c 4096 -fa off -ub 256 --spec-type mtp",
     {"n_ctx": 4096, "n_batch": 2048, "n_ubatch": 256, "flash_attn": False}),
]
_MAIN = {"n_seq_max": 1, "mtp": True, "mtp_op_type": 0}
_MTP = {"n_seq_max": 1, "mtp": True, "mtp_op_type": 1, "embeddings": True}  # MTP_OP_WARMUP


@pytest.fixture(scope="module")
def ik_mtp(small_models: dict[str, Path]) -> ModelReport:
    require_ik()
    settings = [{**s, **extra} for _, s in CASES for extra in (_MAIN, _MTP)]
    return measure(small_models["glm4moe"], 0, settings, model_params={"mtp": True})


def _ours(small_models: dict[str, Path], args: str) -> tuple[dict[str, float], list[str]]:
    parsed = parse_server_args(shlex.split(args), dialect=IK)
    devices = cpu_only()
    errors = [str(e) for e in parsed.errors + check_semantics(parsed, devices.names)]
    analysis = analyse_command(open_model(small_models["glm4moe"]), devices, parsed, IK)
    assert analysis.projection is not None
    out: dict[str, float] = {}
    for b in analysis.projection.buffers():
        key = f"{'mtp' if b.owner == MTP else 'main' if not b.owner else b.owner}/{b.kind}"
        out[key] = out.get(key, 0.0) + mib(b.bytes)
    return out, errors


def test_mtp_contexts_equal_ik(small_models: dict[str, Path], ik_mtp: ModelReport) -> None:
    assert ik_mtp.loaded, ik_mtp.stdout[-2000:]
    table = [f"{'command':44} {'buffer':14} {'ours':>8} {'ik':>8}"]
    bad: list[str] = []
    contexts = iter(ik_mtp.contexts)
    for args, _settings in CASES:
        main, mtp = next(contexts), next(contexts)
        assert main.created and mtp.created, f"{args}: ik did not create both contexts"
        ours, errors = _ours(small_models, args)
        if errors:
            bad.append(f"{args}: ik accepts it, the planner refuses: {errors}")
        theirs = {"main/model": ik_mtp.weights_mib.get("CPU")}
        for owner, ctx in (("main", main), ("mtp", mtp)):
            theirs |= {f"{owner}/kv": ctx.kv_mib.get("CPU"), f"{owner}/output": ctx.output_mib.get("CPU"),
                       f"{owner}/compute": ctx.compute_mib.get("CPU")}
        rows, wrong = mib_rows(args, ours, theirs, 44)
        table += rows
        bad += wrong
    print("\n".join(table))
    assert not bad, "\n".join(bad)


def test_ik_fit_measures_the_mtp_context_ik_allocates(small_models: dict[str, Path],
                                                      ik_mtp: ModelReport) -> None:
    """The fit's dry run of ik's MTP context (``fit_extra.extra_measure`` with ``--spec-type mtp``, at
    the context ik creates) is what ik's library allocates for it: its KV, output and compute buffers
    (the CPU build: all on the host), to the three printed 0.01 MiB figures' rounding."""
    from offload_planner.core.engine import placement_options
    from offload_planner.core.fit import device_memory
    from offload_planner.core.fit_extra import extra_measure
    from offload_planner.core.plan import plan_from_args
    from offload_planner.core.speculative import load_spec

    assert ik_mtp.loaded, ik_mtp.stdout[-2000:]
    model = open_model(small_models["glm4moe"])
    devices = cpu_only()
    bad: list[str] = []
    contexts = iter(ik_mtp.contexts)
    for args, settings in CASES:
        _main, mtp = next(contexts), next(contexts)
        parsed = parse_server_args(shlex.split(args), dialect=IK)
        plan = plan_from_args(model, devices, parsed, IK)
        spec = load_spec(devices, parsed, IK, placement_options)
        measure = extra_measure(model, devices, plan.placement_options, plan.context, spec, device_memory)
        assert measure is not None
        got = measure(settings["n_ctx"])
        theirs = sum(v["CPU"] for v in (mtp.kv_mib, mtp.output_mib, mtp.compute_mib))
        print(f"{args:44} measured {got.host / 2**20:8.3f} MiB, ik {theirs:8.2f} MiB")
        if got.used or abs(got.host / 2**20 - theirs) > 0.016:
            bad.append(f"{args}: the fit measures {got.used} + {got.host / 2**20:.3f} MiB host, "
                       f"ik {theirs} MiB")
    assert not bad, "\n".join(bad)
