"""Speculative decoding (a ``-md`` draft model, or MTP) against public measurements
(tests/data/speed/public_speculative.json).

Each record is a public post's plain tg and its tg with a draft model or MTP on the same machine
(or, where the post gives only that, the speed-up ratio or the speculative tg alone).  The record's
model, hardware and settings become a command line as in :mod:`test_speed_public` (same harness);
the speculative run adds the draft: a header-only draft model of the post's draft shape written by
the synth and ``-md``/``-ngld``/``--spec-type draft-simple``, or ``--spec-type draft-mtp`` on the
main model's NextN block, with the post's ``--spec-draft-n-max``.

Acceptance: where the post prints llama.cpp's draft acceptance (accepted / drafted tokens, what
llama-server's ``draft acceptance = ...`` line and llama-speculative's ``accept = ...%`` give), it
becomes the estimator's per-token acceptance ``a`` (each drafted token kept given all earlier ones
were) by the relation the pinned build itself uses between the two (``common/speculative.cpp``,
``common_speculative_synth_rates_resolve``: the kept tokens of a step are ``a + a^2 + ... + a^n``, so
accepted / drafted = that sum / n); else the estimator's default (the report says which).

The test prints per record the estimated and measured plain tg, speculative tg and speed-up
(speculative / plain), and the median and worst of |ln(estimate / measured)| of the speed-up and of
the speculative tg.  It asserts only what a broken estimator would fail: enough graded records, the
schema, and a median speed-up error under 2x (the estimate of a speed-up is dominated by the
acceptance, which most posts do not print).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from tests.core import test_speed_public as pub
from tests.core.test_speed_dataset import record_errors

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import DeviceSet
from offload_planner.core.model import Model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.speed.efficiency import defaults_for
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import hardware_for
from offload_planner.core.speed.speculation import with_speculation
from offload_planner.core.synth import BIG_MODELS, ModelSpec, write_model

DATA = Path(__file__).resolve().parents[1] / "data" / "speed" / "public_speculative.json"
MIN_GRADED = 6
#: A median speed-up error of 2x: a broken speculative model (no draft cost, or tokens a step
#: wrong by a factor) fails it; the acceptance the posts leave out moves single records more.
SPEEDUP_BOUND = math.log(2)

SPEC_KEYS: dict[str, Any] = {
    "kind": str, "program": (str, type(None)), "command": (str, type(None)), "draft": (dict, type(None)),
    "ngld": (int, type(None)), "n_max": (int, type(None)), "p_min": (int, float, type(None)),
    "tg_tps": (int, float, type(None)), "tg_tokens": (int, type(None)), "speedup": (list, type(None)),
    "accept_rate": (int, float, type(None)), "notes": str,
}
DRAFT_KEYS = {"arch", "name", "params_b", "quant", "size_gib", "n_layer"}


def _records() -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(DATA.read_text(encoding="utf-8"))
    return data


def spec_errors(rec: dict[str, Any]) -> list[str]:
    """Schema violations of one record: the development set's schema for everything but
    ``speculative`` (a record may measure only the speculative run), and that object's own."""
    rid = str(rec.get("id", "?"))
    sp = rec.get("speculative")
    if not isinstance(sp, dict):
        return [f"{rid}: no speculative object"]
    base = {k: v for k, v in rec.items() if k != "speculative"}
    errors = [e for e in record_errors(base) if "neither pp_tps nor tg_tps" not in e]
    if set(sp) != set(SPEC_KEYS):
        return [*errors, f"{rid}.speculative: keys {sorted(sp)} != {sorted(SPEC_KEYS)}"]
    for key, types in SPEC_KEYS.items():
        if isinstance(sp[key], bool) or not isinstance(sp[key], types):
            errors.append(f"{rid}.speculative.{key}: {type(sp[key]).__name__} is not {types}")
    if errors:
        return errors
    if sp["kind"] not in ("draft", "mtp") or (sp["kind"] == "draft") != (sp["draft"] is not None):
        errors.append(f"{rid}: kind 'draft' has a draft object, 'mtp' none")
    if sp["draft"] is not None and set(sp["draft"]) != DRAFT_KEYS:
        errors.append(f"{rid}.speculative.draft: keys {sorted(sp['draft'])} != {sorted(DRAFT_KEYS)}")
    if sp["tg_tps"] is None and sp["speedup"] is None:
        errors.append(f"{rid}: neither the speculative tg nor a speed-up measured")
    if rec["measured"]["tg_tps"] is None and sp["speedup"] is None and sp["tg_tps"] is None:
        errors.append(f"{rid}: nothing to grade")
    numbers = {float(t) for t in re.findall(r"\d+(?:\.\d+)?", rec["quote"])}
    said = [sp["tg_tps"], sp["tg_tokens"], *(sp["speedup"] or [])]  # n_max may be a default (notes say)
    for value in said:
        if value is not None and float(value) not in numbers:
            errors.append(f"{rid}: speculative figure {value} does not appear in the quote")
    rate = sp["accept_rate"]
    if rate is not None and not ({float(rate), round(rate * 100, 6)} & numbers):
        errors.append(f"{rid}: accept_rate {rate} (or as a percentage) does not appear in the quote")
    return errors


def accept_from_rate(rate: float, n: int) -> float:
    """The per-token acceptance ``a`` whose drafts of ``n`` tokens keep ``rate`` of their tokens:
    ``(a + a^2 + ... + a^n) / n = rate`` (common_speculative_synth_rates_resolve's relation,
    bisected as it does)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid ** i for i in range(1, n + 1)) / n < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _qwen2(name: str, n_layer: int, n_embd: int, n_head: int, n_kv: int, n_ff: int, *,
           tied: bool = False) -> ModelSpec:
    """A Qwen2.5 shape (published config) on the harness's Llama-architecture writer: every Qwen2.5
    shares the 151936/152064-token vocabulary; the qkv biases are left out (under 0.01% of bytes)."""
    return replace(pub._llama(name, n_layer, n_embd, n_head, n_kv, n_ff, 152064), tied_embeddings=tied)


def _llama_1b(name: str) -> ModelSpec:
    """Llama-3.2-1B's config: 16 layers, 2048 wide, 32 heads / 8 KV heads, tied embeddings."""
    return replace(pub._llama(name, 16, 2048, 32, 8, 8192, 128256), tied_embeddings=True)


def _glm47_flash() -> ModelSpec:
    """GLM-4.7-Flash (glm4_moe_lite, converted as deepseek2): 47 layers + 1 NextN block, 2048 wide,
    20 heads of MLA (q_lora 768, kv_lora 512, 256-dim keys and values), 64 routed experts of 1536
    (4 used) + 1 shared, one leading dense layer (10240), 154880 tokens: the published config."""
    ds3 = BIG_MODELS["DeepSeek-V3-Q4_K_M"]
    tok = replace(ds3.tokenizer, n_vocab=154880)
    kv = {k: v for k, v in ds3.extra_kv.items() if not k.startswith("expert_group")}
    return replace(ds3, name="GLM-4.7-Flash", n_layer=48, n_nextn=1, n_embd=2048, n_head=20, n_ff=10240,
                   n_expert=64, n_expert_used=4, n_ff_exp=1536, n_layer_dense_lead=1, q_lora_rank=768,
                   key_length_mla=256, value_length_mla=256, n_ctx_train=202752, tokenizer=tok, extra_kv=kv)


def _shape(m: dict[str, Any]) -> ModelSpec | None:
    """The shapes the public harness lacks (published configs), else its own."""
    arch, p = m.get("arch"), m.get("params_b") or 0
    if arch == "glm4moe" and 100 <= p <= 110:
        return BIG_MODELS["GLM-4.5-Air-Q4_K_M"]
    if arch == "deepseek2" and 29 <= p <= 32:
        return _glm47_flash()
    if arch == "qwen2":
        for lo, hi, spec in ((0.4, 0.6, lambda: _qwen2("qwen2 0.5B", 24, 896, 14, 2, 4864, tied=True)),
                             (1.4, 1.7, lambda: _qwen2("qwen2 1.5B", 28, 1536, 12, 2, 8960, tied=True)),
                             (14, 15, lambda: _qwen2("qwen2 14B", 48, 5120, 40, 8, 13824)),
                             (32, 33, lambda: _qwen2("qwen2 32B", 64, 5120, 40, 8, 27648)),
                             (72, 73, lambda: _qwen2("qwen2 72B", 80, 8192, 64, 8, 29568))):
            if lo <= p <= hi:
                return spec()
    if arch == "llama" and 1.1 <= p <= 1.3:
        return _llama_1b(f"llama {p}B")
    return None


def _spec(m: dict[str, Any]) -> tuple[ModelSpec | None, str]:
    shape = _shape(m)
    if shape is None:
        return pub._spec(m)
    q = pub._quant(m, shape.arch)
    return (None, f"quant {m.get('quant')!r}") if q is None else (replace(shape, quant=q), "")


def _draft_argv(sp: dict[str, Any], draft_path: Path | None) -> list[str]:
    n = ["--spec-draft-n-max", str(sp["n_max"])] if sp["n_max"] is not None else []
    if sp["kind"] == "mtp":
        return ["--spec-type", "draft-mtp", *n]
    assert draft_path is not None
    ngld = ["-ngld", str(sp["ngld"])] if sp["ngld"] is not None else []
    return ["-md", str(draft_path), *ngld, "--spec-type", "draft-simple", *n]


Row = tuple[str, float | None, float | None, float | None, str]


def _accept(sp: dict[str, Any]) -> float | None:
    if sp["accept_rate"] is None or sp["n_max"] is None:
        return None
    return accept_from_rate(float(sp["accept_rate"]), sp["n_max"])


def _tgs(rec: dict[str, Any], model: Model, ds: DeviceSet, draft_path: Path | None) -> tuple[float, float]:
    """Estimated tg without and with the record's speculation (at its depth when it has one)."""
    sp, depth = rec["speculative"], rec["measured"]["depth"] or 0
    argv = [*pub._argv(rec), *_draft_argv(sp, draft_path)]
    plan = plan_from_args(model, ds, parse_server_args(argv, dialect=rec["backend"]), rec["backend"])
    if not rec["cpu_tiled_matmul"]:  # a build before the tiled CPU matmul, as test_speed_public
        plan = replace(plan, context=replace(plan.context, dialect=plan.dialect.before_tiled_cpu()))
    if not rec["cpu_llamafile_sgemm"]:  # a build before llamafile's sgemm, as test_speed_public
        plan = replace(plan, context=replace(plan.context, dialect=plan.dialect.before_cpu_gemm()))
    if depth:  # tg at the measured depth: the full-context figure at -c depth, as test_speed_public
        plan = replace(plan, context=replace(plan.context, n_ctx=max(256, depth)))
    hw = hardware_for(ds, threads=rec["cpu_threads_forced"] or rec["settings"].get("threads"))
    eff = defaults_for(plan.dialect)
    est = estimate(plan, hw, eff=eff)
    spec = with_speculation(est, plan, hw, eff, accept=_accept(sp))
    assert spec.spec is not None, f"{rec['id']}: the estimate has no speculation"
    if depth:
        return spec.spec.tg_tps_at_ctx_plain, spec.tg_tps_at_ctx
    return spec.spec.tg_tps_plain, spec.tg_tps


def _log_err(est: float, meas: float | list[float] | None) -> float | None:
    """ln(estimate / measured); a measured range counts as exact inside it."""
    if meas is None:
        return None
    lo, hi = (min(meas), max(meas)) if isinstance(meas, list) else (meas, meas)
    return 0.0 if lo <= est <= hi else math.log(est / (lo if est < lo else hi))


def _grade(rec: dict[str, Any], plain: float, spec: float) -> Row:
    sp, meas = rec["speculative"], rec["measured"]["tg_tps"]
    ratio_meas: float | list[float] | None = sp["speedup"]
    if ratio_meas is None and meas and sp["tg_tps"]:
        ratio_meas = sp["tg_tps"] / meas
    e_ratio = _log_err(spec / plain, ratio_meas)
    e_spec = _log_err(spec, sp["tg_tps"])
    e_plain = _log_err(plain, meas)
    shown = "-" if ratio_meas is None else (f"{ratio_meas:.2f}" if isinstance(ratio_meas, float)
                                           else "..".join(f"{x:.2f}" for x in ratio_meas))
    acc = _accept(sp)
    said = "default" if acc is None else f"{acc:.3f} (from {sp['accept_rate']})"
    detail = (f"plain {plain:.1f}/{meas}  spec {spec:.1f}/{sp['tg_tps']}  speed-up {spec / plain:.2f}/{shown}"
              f"  accept {said}")
    return rec["id"], e_ratio, e_spec, e_plain, detail


def evaluate(records: list[dict[str, Any]], root: Path) -> tuple[list[Row], list[tuple[str, str]]]:
    cache: dict[str, Model] = {}
    rows: list[Row] = []
    skipped: list[tuple[str, str]] = []
    for rec in records:
        spec, why = _spec(rec["model"])
        draft = rec["speculative"]["draft"]
        dspec, dwhy = _spec(draft) if draft else (None, "")
        ds, why_dev = pub._devices(rec) if spec else (None, "")
        if spec is None or ds is None or (draft and dspec is None):
            skipped.append((rec["id"], why or dwhy or why_dev))
            continue
        draft_path = None
        if dspec is not None:
            draft_path = root / f"draft-{re.sub(r'[^A-Za-z0-9.-]', '_', dspec.name)}-{dspec.quant.name}.gguf"
            if not draft_path.exists():
                [draft_path] = write_model(dspec, draft_path, header_only=True)
        plain, spec_tg = _tgs(rec, pub._model(spec, cache, root), ds, draft_path)
        rows.append(_grade(rec, plain, spec_tg))
    return rows, skipped


def summary(rows: list[Row]) -> list[str]:
    """Median, quartiles, worst and signed median of each graded quantity's error."""
    out = []
    for label, pick in (("speed-up", lambda r: r[1]), ("speculative tg", lambda r: r[2]),
                        ("plain tg", lambda r: r[3])):
        signed = [e for e in map(pick, rows) if e is not None]
        errs = [abs(e) for e in signed]
        tail = f"; signed median {math.exp(statistics.median(signed)):.2f}" if signed else ""
        out.append(f"{label} ({len(errs)} records): {pub.spread(errs)}{tail}")
    return out


def test_speculative_records_match_the_schema() -> None:
    records = _records()
    errors = [e for rec in records for e in spec_errors(rec)]
    assert not errors, "\n".join(errors)
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)), "duplicate ids"


def test_schema_rejects_broken_records() -> None:
    rec = _records()[0]
    bad_rate = json.loads(json.dumps(rec))
    bad_rate["speculative"]["tg_tps"] = 55.5  # not in the quote
    no_spec = {k: v for k, v in rec.items() if k != "speculative"}
    bad_kind = json.loads(json.dumps(rec))
    bad_kind["speculative"]["kind"] = "mtp"  # with a draft object
    assert not spec_errors(rec)
    for broken in (bad_rate, no_spec, bad_kind):
        assert spec_errors(broken)


def test_accept_from_rate_inverts_the_drafts_kept_share() -> None:
    a = accept_from_rate(0.72055, 5)
    assert abs(sum(a ** i for i in range(1, 6)) / 5 - 0.72055) < 1e-9
    assert abs(accept_from_rate(0.5, 1) - 0.5) < 1e-9  # one drafted token: the same thing
    assert a > 0.72055  # later positions need all earlier ones: a per-token rate above the share


def test_speculative_estimates_against_public_measurements(tmp_path_factory: pytest.TempPathFactory) -> None:
    records = _records()
    rows, skipped = evaluate(records, tmp_path_factory.mktemp("spec_models"))

    def f(e: float | None) -> str:
        return "       -" if e is None else f"{math.exp(e):7.2f}x"

    print(f"\n{'record':56} {'speed-up':>8} {'spec tg':>8} {'plain tg':>8}   est/meas")
    for rid, er, es, ep, detail in rows:
        print(f"{rid:56} {f(er)} {f(es)} {f(ep)}   {detail}")
    for rid, why in skipped:
        print(f"{rid:56} skipped: {why}")
    print("\n".join(summary(rows)))
    graded = [r for r in rows if r[1] is not None or r[2] is not None]
    assert len(graded) >= MIN_GRADED, f"only {len(graded)} records graded"
    ratio = [abs(r[1]) for r in rows if r[1] is not None]
    assert statistics.median(ratio) < SPEEDUP_BOUND
