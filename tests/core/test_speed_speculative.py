"""Speculative decoding in the tg estimate: a step is one batch of ``n + 1`` tokens verified by the
target (weights once, routed experts any of them routes to), the draft's pass over that same batch
and ``n`` one-token draft passes; ``1 + a + ... + a^n`` tokens a step.

Every expected figure is computed here from the GGUF's own tensor list (names, byte counts) and the
declared CPU bandwidth, not by the estimator: a CPU-only plan (no graph split) whose compute is
declared far beyond its bandwidth, so each pass costs its bytes over the effective bandwidth.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.speed.efficiency import DEFAULT
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import DeviceSpeed, Figure, Hardware, Source
from offload_planner.core.speed.report import speed_json, speed_lines
from offload_planner.core.speed.speculation import DEFAULT_ACCEPT, with_speculation

GiB = 1024**3
BW = 100.0  # GB/s declared
EFF_BW = BW * DEFAULT.cpu_bandwidth.value * 1e9  # bytes/s the estimate reads at


def _hw() -> Hardware:
    d = Figure(BW, "GB/s", Source.DECLARED, "test")
    compute = Figure(1e6, "TFLOPS", Source.DECLARED, "test")
    return Hardware({"CPU": DeviceSpeed("CPU", DeviceKind.CPU, d, compute, d)})


def _plan(model: Path, argv: list[str]) -> Plan:
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), ())
    return plan_from_args(open_model(model), devices, parse_server_args(argv))


def _bytes(model: Model, names: list[str], tokens: float, share: float) -> float:
    """Bytes one pass of ``tokens`` tokens reads of these tensors: an embedding row per token, the
    routed experts at least one token routes to, everything else once."""
    hit = 1 - (1 - share) ** tokens
    total = 0.0
    for name in names:
        t = model.tensor(name)
        if "embed_tokens" in name or name == "token_embd.weight":
            total += tokens * t.nbytes / t.shape[1]
        elif "_exps" in name:
            total += t.nbytes * hit
        else:
            total += t.nbytes
    return total


def _tokens_per_step(a: float, n: int) -> float:
    return 1 + sum(a**i for i in range(1, n + 1))


def test_mtp_step_from_the_models_bytes(small_models: dict[str, Path]) -> None:
    plan = _plan(small_models["glm4moe"], ["-c", "2048", "--spec-type", "draft-mtp"])
    m = plan.model
    share = 2 / 8  # this file's expert_used_count / expert_count
    assert (m.summary.n_expert_used, m.summary.n_expert) == (2, 8)
    trunk = [t.name for t in m.tensors if not t.name.startswith("blk.4.")]
    nextn = [t.name for t in m.tensors if t.name.startswith("blk.4.")]  # the NextN block: the MTP head
    assert "blk.4.nextn.shared_head_head.weight" in nextn and "blk.4.nextn.embed_tokens.weight" in nextn
    plain_s = _bytes(m, trunk, 1, share) / EFF_BW
    e = _tokens_per_step(DEFAULT_ACCEPT, 3)
    step = (_bytes(m, trunk, 4, share) + 3 * _bytes(m, nextn, 1, share) + _bytes(m, nextn, 4, share)) / EFF_BW

    base = estimate(plan, _hw(), eff=DEFAULT)
    est = with_speculation(base, plan, _hw(), DEFAULT)
    assert base.tg_tps == pytest.approx(1 / plain_s, rel=1e-9)
    assert est.spec is not None and est.spec.n_draft == 3
    assert est.spec.tokens_per_step == pytest.approx(2.98, abs=0.005)  # the public mean length it stands for
    assert est.tg_tps == pytest.approx(e / step, rel=1e-9)
    assert est.spec.tg_tps_plain == pytest.approx(1 / plain_s, rel=1e-9)
    assert est.tg_tps_at_ctx < est.tg_tps  # the KV of 2048 cells read by every pass
    # the acceptance is a declared assumption with its public source
    acc = [a for a in est.assumptions if "acceptance" in a.what]
    assert acc and "https://github.com/ggml-org/llama.cpp/pull/25980" in acc[0].figure.note
    assert acc[0].figure.source is Source.DEFAULT


def test_draft_model_step_and_declared_acceptance(small_models: dict[str, Path]) -> None:
    draft = small_models["llama-draft"]
    plan = _plan(small_models["llama"], ["-c", "1024", "-md", str(draft), "--spec-type", "draft-simple",
                                         "--spec-draft-n-max", "5"])
    m, d = plan.model, open_model(draft)
    a = 0.6
    e = _tokens_per_step(a, 5)
    tnames = [t.name for t in m.tensors]
    dnames = [t.name for t in d.tensors]
    step = (_bytes(m, tnames, 6, 1.0) + 5 * _bytes(d, dnames, 1, 1.0) + _bytes(d, dnames, 6, 1.0)) / EFF_BW
    est = with_speculation(estimate(plan, _hw(), eff=DEFAULT), plan, _hw(), DEFAULT, accept=a)
    assert est.spec is not None and est.spec.n_draft == 5 and est.spec.kind.startswith("draft model")
    assert est.tg_tps == pytest.approx(e / step, rel=1e-9)
    assert est.spec.accept.source is Source.DECLARED
    j = speed_json(est)
    assert j["speculative"]["accept"] == a and j["tg_tps_plain"] == round(est.spec.tg_tps_plain, 3)
    assert j["tg_tps"] == round(e / step, 3)
    text = "\n".join(speed_lines(est))
    assert "5 tokens drafted a step, acceptance 0.6" in text and "without speculative decoding" in text


def test_no_speculation_leaves_the_estimate_alone(small_models: dict[str, Path]) -> None:
    plan = _plan(small_models["glm4moe"], ["-c", "2048"])
    base = estimate(plan, _hw(), eff=DEFAULT)
    assert with_speculation(base, plan, _hw(), DEFAULT) is base
    assert "speculative" not in speed_json(base) and "tg_tps_plain" not in speed_json(base)


def test_plan_cli_prints_and_carries_it(small_models: dict[str, Path],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from offload_planner.cli import main

    model = str(small_models["glm4moe"])
    common = ["plan", model, "--no-detect", "--device", "CPU=64GiB,bw=100GB/s"]
    mtp = ["-c", "2048", "--spec-type", "draft-mtp"]
    assert main([*common, "--json", "--spec-accept", "0.5", "--", *mtp]) == 0
    speed = json.loads(capsys.readouterr().out)["speed"]
    assert speed["speculative"]["accept"] == 0.5 and speed["speculative"]["n_draft"] == 3
    assert speed["speculative"]["tokens_per_step"] == pytest.approx(1.875)  # 1 + .5 + .25 + .125
    assert speed["tg_tps"] != speed["tg_tps_plain"]
    assert main([*common, "--", "-c", "2048", "--spec-type", "draft-mtp"]) == 0
    out = capsys.readouterr().out
    assert "with MTP (1 NextN layer)" in out and "acceptance 0.806 a drafted token (default)" in out
    assert "pull/25980" in out  # the assumption names its public measurement
    assert main([*common, "--spec-accept", "0.5", "--", "-c", "2048"]) == 0
    assert "--spec-accept 0.5 unused: the command has no draft model" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([*common, "--spec-accept", "1.5", "--", "-c", "2048"])
    assert "--spec-accept '1.5'" in capsys.readouterr().err


def test_fit_prints_its_answer_with_mtp_and_depth(small_models: dict[str, Path],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from offload_planner.cli import main

    argv = ["fit", str(small_models["glm4moe"]), "--no-detect", "--device", "CUDA0=4GiB,bw=500GB/s",
            "--device", "CPU=64GiB,bw=50GB/s", "--json", "--depth", "512", "--spec-accept", "0.7",
            "--", "-c", "2048", "--spec-type", "draft-mtp"]
    assert main(argv) == 0
    speed = json.loads(capsys.readouterr().out)["speed"]
    assert speed["speculative"]["accept"] == 0.7 and speed["speculative"]["kind"] == "MTP (1 NextN layer)"
    assert speed["depth"] == 512 and speed["pp_tps_at_depth"] < speed["pp_tps"]
    assert speed["tg_tps_at_ctx"] < speed["tg_tps_at_depth"] < speed["tg_tps"]


def test_draft_model_without_a_draft_type_is_loaded_but_not_drafted_with(
        small_models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """The pinned build's speculative types default to none (common/common.h): ``-md`` alone loads the
    draft (its memory stays projected) but the server generates without it ("no implementations
    specified for speculative decoding", checked on the real llama-server); ``--spec-type draft-simple``
    drafts.  A 2025 build drafts whenever ``-md`` is given."""
    from offload_planner.cli import main
    from offload_planner.core.dialects import LLAMA_CPP_2025

    draft = str(small_models["llama-draft"])
    common = ["plan", str(small_models["llama"]), "--no-detect", "--device", "CPU=64GiB,bw=100GB/s", "--json"]

    def run(*argv: str) -> dict[str, object]:
        assert main([*common, *argv]) == 0
        out: dict[str, object] = json.loads(capsys.readouterr().out)
        return out

    plain = run("--", "-c", "1024")
    alone = run("--", "-c", "1024", "-md", draft)
    typed = run("--", "-c", "1024", "-md", draft, "--spec-type", "draft-simple")
    older = run("--backend", LLAMA_CPP_2025.value, "--", "-c", "1024", "-md", draft)
    runs = {"plain": plain, "alone": alone, "typed": typed, "older": older}
    speed = {k: v["speed"] for k, v in runs.items()}
    assert "speculative" not in speed["alone"] and speed["alone"]["tg_tps"] == speed["plain"]["tg_tps"]
    # drafting changes tg (this tiny pair: the draft is a third of the target, slower than plain)
    assert "speculative" in speed["typed"] and speed["typed"]["tg_tps"] != speed["plain"]["tg_tps"]
    assert speed["typed"]["tg_tps_plain"] == speed["plain"]["tg_tps"]
    assert "speculative" in speed["older"]
    warnings = " ".join(map(str, alone.get("warnings", [])))
    assert f"-md {draft}: llama-server loads this draft model but does not draft with it" in warnings
    assert "--spec-type draft-simple" in warnings
    assert "does not draft" not in " ".join(map(str, typed.get("warnings", [])))
    # the draft's own memory is still there without a type
    def total(j: dict[str, object]) -> int:
        return sum(int(d["total_bytes"]) for d in j["devices"])  # type: ignore[index, union-attr]
    assert total(alone) > total(plain)


def test_a_draft_file_with_an_mtp_head_drafts_with_that_head(small_models: dict[str, Path]) -> None:
    """``-md`` of a file with an MTP head and no ``--spec-type``: the pinned server infers draft-mtp
    (common/arg.cpp, ``common_speculative_types_from_gguf``) and creates an MTP context on the draft
    model (speculative.cpp: ``ctx_type = LLAMA_CONTEXT_TYPE_MTP``), which drafts with the draft's
    NextN block and head on the target's hidden state; the planner ran the draft's whole trunk per
    drafted token.  A step: the target's trunk over 4 tokens, the draft's MTP head 3 times over one
    token and once over 4; ``--spec-type draft-mtp`` with ``-md`` is the same."""
    draft = small_models["deepseek2-mtp"]
    plan = _plan(small_models["deepseek2"], ["-c", "1024", "-md", str(draft)])
    m, d = plan.model, open_model(draft)
    assert plan.spec is not None and plan.spec.mtp and plan.spec.drafting
    assert plan.placement_options.load_mtp and plan.spec.draft is not None
    assert plan.spec.draft.placement_options.load_mtp  # the draft loads its NextN block too
    assert plan.context.n_outputs_max == 16  # 4 slots x (1 + 3 drafted), as the server logs it
    share = m.summary.n_expert_used / m.summary.n_expert
    dshare = d.summary.n_expert_used / d.summary.n_expert
    head = [t.name for t in d.tensors if t.name.startswith("blk.3.")]  # the draft's NextN block
    assert "blk.3.nextn.eh_proj.weight" in head
    head += ["token_embd.weight", "output.weight"]  # no nextn.embed_tokens / shared_head_head here

    def mtp(tokens: int) -> float:
        return _bytes(d, head, tokens, dshare)

    step = (_bytes(m, [t.name for t in m.tensors], 4, share) + 3 * mtp(1) + mtp(4)) / EFF_BW
    est = with_speculation(estimate(plan, _hw(), eff=DEFAULT), plan, _hw(), DEFAULT)
    assert est.spec is not None and est.spec.kind == "draft model deepseek2-mtp.gguf, MTP (1 NextN layer)"
    assert est.tg_tps == pytest.approx(_tokens_per_step(DEFAULT_ACCEPT, 3) / step, rel=1e-9)
    typed = _plan(small_models["deepseek2"], ["-c", "1024", "-md", str(draft), "--spec-type", "draft-mtp"])
    again = with_speculation(estimate(typed, _hw(), eff=DEFAULT), typed, _hw(), DEFAULT)
    assert again.tg_tps == est.tg_tps


@pytest.mark.parametrize("name", ["glm4moe", "deepseek2-mtp"])
def test_passes_on_a_gpu_pay_its_layers_as_a_plain_token_does(small_models: dict[str, Path],
                                                              name: str) -> None:
    """On a GPU a pass costs ``gpu_layer_us`` a layer whatever its batch, as plain tg counts it: the
    verify batch of n + 1 tokens is never faster than one plain token, a draft pass of the one NextN
    layer costs at least that layer, and a step of n + 1 tokens at most gives n + 1 plain tokens'
    speed.  Before, the passes left the layers out: 99,434 t/s with MTP against 5,465 plain (18x,
    with at most 4 tokens a step) on glm4moe."""
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB),
                        (Device("CUDA0", DeviceKind.CUDA, 24 * GiB, 24 * GiB),))
    plan = plan_from_args(open_model(small_models[name]), devices,
                          parse_server_args(["-c", "2048", "-ngl", "999", "--spec-type", "draft-mtp"]))

    def fig(v: float, unit: str) -> Figure:
        return Figure(v, unit, Source.DECLARED, "test")

    cpu = DeviceSpeed("CPU", DeviceKind.CPU, fig(100, "GB/s"), fig(1, "TFLOPS"), fig(100, "GB/s"))
    hw = Hardware({"CPU": cpu,
                   "CUDA0": DeviceSpeed("CUDA0", DeviceKind.CUDA, fig(900, "GB/s"), fig(70, "TFLOPS"),
                                        fig(25, "GB/s"))})
    base = estimate(plan, hw, eff=DEFAULT)
    est = with_speculation(base, plan, hw, DEFAULT)
    assert est.spec is not None and est.spec.n_draft == 3
    assert est.spec.verify_ms >= 1e3 / base.tg_tps
    assert est.spec.draft_ms >= DEFAULT.gpu_layer_us.value * 1e-3
    assert base.tg_tps < est.tg_tps <= 4 * base.tg_tps


@pytest.mark.parametrize(("given", "n", "tokens"), [
    # llama-server's slot log with full-length drafts: mean len = 1 + accepted / steps, and the
    # draft acceptance accepted / drafted = (mean len - 1) / n
    ("len=2.98", 3, 2.98),
    ("ratio=0.6", 3, 1 + 3 * 0.6),
    ("ratio=0.72055", 5, 1 + 5 * 0.72055),  # issue 5877's "draft acceptance" at --draft 5
    ("len=9", 3, 4.0),  # more than 3 drafts can give: all kept
])
def test_acceptance_as_llama_server_prints_it(small_models: dict[str, Path],
                                              capsys: pytest.CaptureFixture[str],
                                              given: str, n: int, tokens: float) -> None:
    """``--spec-accept len=L`` / ``ratio=R`` take the figures llama-server prints for a run and give
    that run's tokens a step; the assumption says which form was declared."""
    from offload_planner.cli import main

    model = str(small_models["glm4moe"])
    argv = ["plan", model, "--no-detect", "--device", "CPU=64GiB,bw=100GB/s", "--json",
            "--spec-accept", given, "--", "-c", "2048", "--spec-type", "draft-mtp",
            "--spec-draft-n-max", str(n)]
    assert main(argv) == 0
    spec = json.loads(capsys.readouterr().out)["speed"]["speculative"]
    assert spec["n_draft"] == n
    assert spec["tokens_per_step"] == pytest.approx(tokens, abs=0.005)
    a = spec["accept"]
    assert 1 + sum(a**i for i in range(1, n + 1)) == pytest.approx(tokens, abs=1e-6)
    assert spec["accept_note"].startswith(f"--spec-accept {given}: llama-server's")


@pytest.mark.parametrize("bad", ["ratio=1.5", "len=0.5", "len=nan", "ratio=inf", "size=2", "len=", "=0.5"])
def test_acceptance_forms_refused_naming_the_flag(small_models: dict[str, Path],
                                                  capsys: pytest.CaptureFixture[str], bad: str) -> None:
    from offload_planner.cli import main

    with pytest.raises(SystemExit):
        main(["plan", str(small_models["glm4moe"]), "--no-detect", "--spec-accept", bad, "--", "-c", "2048"])
    err = capsys.readouterr().err
    assert f"--spec-accept {bad!r}" in err and "mean len" in err


def test_ik_mtp_draft_passes_read_the_main_cache_types(small_models: dict[str, Path]) -> None:
    """ik's MTP context is a copy of the main context's parameters (common/speculative.cpp
    ``common_speculative_prepare_mtp_runtime``): its NextN cache has the main -ctk/-ctv, which its
    draft passes read, whatever -ctkd/-ctvd say; mainline's MTP context takes the draft's."""
    from dataclasses import replace

    from offload_planner.core.dialects import IK, LLAMA_CPP
    from offload_planner.core.memory import resolve_context
    from offload_planner.core.placement import place
    from offload_planner.core.speed.reads import kv_read_at
    from offload_planner.core.speed.speculation import _draft_side

    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), ())
    model = open_model(small_models["glm4moe"])
    s = model.summary
    depth = 1500
    reads = {}
    for dialect, spec_type in ((IK, "mtp"), (LLAMA_CPP, "draft-mtp")):
        argv = ["-c", "2048", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "-ctkd", "f16", "-ctvd", "f16",
                "--spec-type", spec_type]
        plan = plan_from_args(model, devices, parse_server_args(argv, dialect=dialect), dialect)
        placement = place(model, devices, plan.placement_options)
        side = _draft_side(plan, placement, depth)
        assert side is not None, dialect
        reads[dialect.value] = side.kv_depth
        types = ("q8_0", "q8_0") if dialect is IK else ("f16", "f16")
        params = replace(plan.context, type_k=types[0], type_v=types[1])
        ctx = resolve_context(params, s.n_ctx_train, s.n_swa)
        assert side.kv_depth == kv_read_at(model, placement, params, ctx, devices, depth,
                                           cached=range(s.n_layer_trunk, s.n_layer)), dialect
    assert reads[IK.value]["CPU"] < reads[LLAMA_CPP.value]["CPU"]  # q8_0 rows against f16
