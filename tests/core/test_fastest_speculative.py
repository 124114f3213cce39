"""The fastest plan with speculative decoding in the command (``--spec-type draft-mtp``, ``-md``):
candidates rank by the estimate ``plan`` prints (tg with the draft or MTP), the MTP head's experts are
placed like the trunk's, and the draft's or MTP's own weights, KV and compute take their room on the
GPU.  Real header-only models written by the project's synth, scores recomputed here from each
candidate's plan, fits checked on fresh projections."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.plan import Plan
from offload_planner.core.speed.candidate import DEFAULT_MARGIN
from offload_planner.core.speed.efficiency import defaults_for
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.fastest import fastest_plan
from offload_planner.core.speed.hardware import Hardware, hardware_for
from offload_planner.core.speed.speculation import with_speculation
from offload_planner.core.synth import write_model
from offload_planner.core.synth.catalog import BIG_MODELS

RES = Path(__file__).resolve().parents[2] / "resources"
EFF = defaults_for("llama.cpp")


@pytest.fixture(scope="module")
def glm_air(tmp_path_factory: pytest.TempPathFactory) -> Model:
    root = tmp_path_factory.mktemp("glm_air")
    [path] = write_model(BIG_MODELS["GLM-4.5-Air-Q4_K_M"], root / "glm-air.header.gguf", header_only=True)
    return open_model(str(path))


def _devices(*gpus: str) -> DeviceSet:
    return DeviceSet(parse_device_decl("CPU=256GiB,ram=4xDDR5-5600"),
                     tuple(parse_device_decl(f"CUDA{i}={g}") for i, g in enumerate(gpus)))


def _printed(plan: Plan, hw: Hardware, accept: float | None = None) -> float:
    """tg as ``plan`` prints it (estimate plus speculation), from a fresh placement."""
    est = estimate(plan, hw, eff=EFF)
    return with_speculation(est, plan, hw, EFF, accept=accept).tg_tps


def _fits(plan: Plan, devices: DeviceSet) -> bool:
    proj = plan.projection()  # fresh, with the draft's / MTP's buffers
    return all(proj.device(g.name).resident() + (g.margin or DEFAULT_MARGIN) <= (g.capacity or 0)
               for g in devices.gpus)


def test_mtp_candidates_rank_by_the_printed_estimate(glm_air: Model) -> None:
    """GLM-4.5-Air with MTP on one 24 GiB GPU: the plain ranking chose a fill that is slower with
    MTP than ``--n-cpu-moe 38`` (its NextN experts stayed on the CPU, read by every draft pass)."""
    ds = _devices("24GiB,bw=936GB/s")
    hw = hardware_for(ds, threads=16)
    r = fastest_plan(glm_air, ds, ["-c", "16384", "--spec-type", "draft-mtp"], hw, goal="tg", eff=EFF)
    assert r.best is not None and r.best.verified
    assert r.best.estimate.spec is not None and r.best.estimate.spec.kind == "MTP (1 NextN layer)"
    assert _fits(r.best.plan, ds)
    best = _printed(r.best.plan, hw)
    assert r.best.estimate.tg_tps == pytest.approx(best, rel=1e-9)
    for c in r.candidates:
        if c.fits:
            assert best >= _printed(c.plan, hw), c.label
    # the MTP head's routed experts (blk.46) go to the GPU with the trunk's
    devs = r.best.plan.placement().tensor_devices()
    assert {devs[f"blk.46.ffn_{k}_exps.weight"] for k in ("gate", "up", "down")} == {"CUDA0"}
    # the MTP context's KV and compute are on the GPU the search filled
    owned = {b.kind for b in r.best.projection.device("CUDA0").buffers if b.owner == "mtp"}
    assert owned == {"kv", "compute"}


def test_declared_acceptance_changes_the_ranking_scores(glm_air: Model) -> None:
    ds = _devices("24GiB,bw=936GB/s")
    hw = hardware_for(ds, threads=16)
    args = ["-c", "16384", "--spec-type", "draft-mtp"]
    low = fastest_plan(glm_air, ds, args, hw, goal="tg", eff=EFF, accept=0.2)
    high = fastest_plan(glm_air, ds, args, hw, goal="tg", eff=EFF, accept=0.95)
    assert low.best is not None and high.best is not None
    assert low.best.estimate.tg_tps == pytest.approx(_printed(low.best.plan, hw, 0.2), rel=1e-9)
    assert high.best.estimate.tg_tps > 2 * low.best.estimate.tg_tps


def test_a_draft_models_memory_takes_its_room_on_the_gpu(tmp_path: Path) -> None:
    """Qwen3-30B with a 4-layer draft of Llama-3.1-70B's width (about 3 GiB, on the GPU by default):
    the draft's weights, KV and compute are in every candidate's projection, so the search leaves
    room for them (fewer expert bytes on the GPU than without the draft) and the answer fits. The draft
    has Qwen3's vocabulary: llama.cpp uses no draft of another (common_speculative_are_compatible)."""
    qwen = open_model(str(RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf"))
    spec = replace(BIG_MODELS["Llama-3.1-70B-Q4_K_M"], name="draft", n_layer=4,
                   tokenizer=BIG_MODELS["Qwen3-30B-A3B-Q4_K_M"].tokenizer)
    [draft] = write_model(spec, tmp_path / "draft.header.gguf", header_only=True)
    ds = _devices("12GiB,bw=936GB/s")
    hw = hardware_for(ds, threads=16)
    plain = fastest_plan(qwen, ds, ["-c", "8192"], hw, goal="tg", eff=EFF)
    spec = ["-md", str(draft), "--spec-type", "draft-simple"]
    r = fastest_plan(qwen, ds, ["-c", "8192", *spec], hw, goal="tg", eff=EFF)
    assert r.best is not None and plain.best is not None
    assert r.best.estimate.spec is not None and r.best.estimate.spec.kind == "draft model draft.header.gguf"
    assert _fits(r.best.plan, ds)
    gpu = r.best.projection.device("CUDA0")
    drafted = {b.kind for b in gpu.buffers if b.owner == "draft"}
    assert {"model", "kv", "compute"} <= drafted
    draft_bytes = sum(b.bytes for b in gpu.buffers if b.owner == "draft")
    assert draft_bytes > 2 * 1024**3

    def experts_on_gpu(plan: Plan) -> int:
        return sum(p.tensor.nbytes for p in plan.placement().items
                   if p.device == "CUDA0" and p.tensor.role.is_routed_expert)

    assert experts_on_gpu(plain.best.plan) - experts_on_gpu(r.best.plan) > 0.8 * draft_bytes
    for c in r.candidates:
        if c.fits:
            assert r.best.estimate.tg_tps >= _printed(c.plan, hw), c.label


def test_the_draft_is_opened_and_projected_once_per_setting(tmp_path: Path) -> None:
    """The fit command parses its command line once per candidate: the ``-md`` file is opened once
    (the same Model while the file is unchanged) and the draft's projection, which depends on its own
    placement and context only, is reused across the candidates of one ``-ub``; every candidate's
    draft buffers equal a fresh projection of that draft (placed and simulated again, no memo)."""
    from offload_planner.core import speculative
    from offload_planner.core.extra_context import DRAFT
    from offload_planner.core.memory import project
    from offload_planner.core.placement import place

    qwen = open_model(str(RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf"))
    spec = replace(BIG_MODELS["Llama-3.1-70B-Q4_K_M"], name="draft", n_layer=4)
    [draft] = write_model(spec, tmp_path / "draft.header.gguf", header_only=True)
    ds = _devices("12GiB,bw=936GB/s")
    hw = hardware_for(ds, threads=16)
    speculative.draft_buffers.cache_clear()
    speculative._open_draft.cache_clear()
    spec = ["-md", str(draft), "--spec-type", "draft-simple"]
    r = fastest_plan(qwen, ds, ["-c", "8192", *spec], hw, goal="balanced", eff=EFF)
    assert speculative._open_draft.cache_info().misses == 1
    ubs = {c.plan.context.n_ubatch for c in r.candidates}
    assert len(ubs) == 3
    assert speculative.draft_buffers.cache_info().misses == len(ubs)
    models = {id(c.plan.spec.draft.model) for c in r.candidates if c.plan.spec and c.plan.spec.draft}
    assert len(models) == 1
    fresh_model = open_model(str(draft))
    for c in r.candidates:
        d = c.plan.spec.draft if c.plan.spec else None
        assert d is not None
        [ctx] = [e for e in c.projection.extras if e.key == DRAFT]
        cp = replace(c.plan.context, n_ctx=c.projection.context.n_ctx, type_k=d.type_k, type_v=d.type_v,
                     n_outputs_max=min(c.plan.context.n_batch, c.plan.context.n_seq_max))
        fresh = project(fresh_model, d.devices, place(fresh_model, d.devices, d.placement_options), cp)
        assert [(b.device, b.name, b.kind, b.bytes) for b in ctx.buffers] == \
            [(b.device, b.name, b.kind, b.bytes) for b in fresh.buffers()], c.label
        assert {b.owner for b in ctx.buffers} == {DRAFT}


def test_step_reads_weigh_the_verify_batch_and_the_mtp_passes(glm_air: Model) -> None:
    """GLM-4.5-Air (8 of 128 experts) with MTP at the default 3 drafted tokens: the verify batch of 4
    reads 1 - (15/16)^4 of a trunk layer's experts, 3.65 tokens' worth; the NextN block's three
    one-token passes and its batch 3 + 3.65."""
    from offload_planner.core.cmdline import parse_server_args
    from offload_planner.core.plan import plan_from_args
    from offload_planner.core.speed.speculation import step_reads

    ds = _devices("24GiB,bw=936GB/s")
    plain = plan_from_args(glm_air, ds, parse_server_args(["-c", "16384"]))
    mtp = plan_from_args(glm_air, ds, parse_server_args(["-c", "16384", "--spec-type", "draft-mtp"]))
    assert step_reads(plain) is None
    got = step_reads(mtp)
    assert got is not None and got.n_trunk == 46
    hit = 1 - (15 / 16) ** 4
    assert got.trunk == pytest.approx(hit * 16) and got.nextn == pytest.approx(3 + hit * 16)


def test_a_layout_for_the_speculative_step_is_the_answer_with_mtp(glm_air: Model) -> None:
    """GLM-4.5-Air with MTP on three RTX 3060 (12 GiB): the layer split chosen by a token's reads put
    the NextN block's experts on the CPU (every draft pass reads them) and lost to the fill; the
    split chosen by a step's reads (:func:`step_reads`: the verify batch, the draft passes) is the
    answer, faster by the printed estimate than every other candidate that fits, its NextN experts on
    the GPU, and it fits every GPU by a fresh projection."""
    ds = _devices("rtx3060", "rtx3060", "rtx3060")
    hw = hardware_for(ds, threads=16)
    r = fastest_plan(glm_air, ds, ["-c", "16384", "--spec-type", "draft-mtp"], hw, goal="tg", eff=EFF)
    assert r.best is not None and r.best.verified
    assert "speculative" in r.best.label, r.best.label
    assert _fits(r.best.plan, ds)
    best = _printed(r.best.plan, hw)
    assert r.best.estimate.tg_tps == pytest.approx(best, rel=1e-9)
    for c in r.candidates:
        if c.fits and c is not r.best:
            assert best > _printed(c.plan, hw), c.label
    devs = r.best.plan.placement().tensor_devices()
    nextn = {devs[f"blk.46.ffn_{k}_exps.weight"] for k in ("gate", "up", "down")}
    assert nextn <= {"CUDA0", "CUDA1", "CUDA2"}
    plain = [c for c in r.candidates
             if c.label.startswith("fastest (-ub 512, own -ts") and "speculative" not in c.label]
    assert plain and all(_printed(c.plan, hw) < best for c in plain)
