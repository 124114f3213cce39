"""``--override-kv``: read as llama-server reads it, and the overrides the projection models applied to
the model the plan projects (the experts a token uses, the trained context), on the bundled headers.

Before, the flag was kept verbatim and ignored: ``--override-kv deepseek2.expert_used_count=int:4``
gave DeepSeek-V3 the same tg as with its 8 experts, ``-c 0`` with an overridden ``context_length`` the
file's KV cache, and a malformed item a plan of a command llama-server refuses.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.dialects import IK, LLAMA_CPP, Dialect
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.kv_override import atof, atol, csv_items, overrides_in, parse_item
from offload_planner.core.memory import resolve_context
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import hardware_for

RES = Path(__file__).resolve().parents[2] / "resources"
DSV3 = RES / "DeepSeek-V3-Q4_K_M.header.gguf"
GIB = 1024**3
DEVICES = DeviceSet(Device("CPU", DeviceKind.CPU, 512 * GIB, 512 * GIB),
                    (Device("CUDA0", DeviceKind.CUDA, 24 * GIB, 24 * GIB),))


@pytest.fixture(scope="module")
def dsv3():  # type: ignore[no-untyped-def]
    return open_model(DSV3)


def _analysis(model, argv: list[str], dialect: Dialect = LLAMA_CPP):  # type: ignore[no-untyped-def]
    parsed = parse_server_args(argv, dialect=dialect)
    assert parsed.ok, parsed.errors
    return analyse_command(model, DEVICES, parsed, dialect, command=True)


def _total(analysis, kind: str) -> int:  # type: ignore[no-untyped-def]
    return sum(dm.total(kind) for dm in analysis.projection.devices)


def _n_ctx(analysis) -> int:  # type: ignore[no-untyped-def]
    s = analysis.plan.model.summary
    return resolve_context(analysis.plan.context, s.n_ctx_train, s.n_swa).n_ctx


BASE = ["-ngl", "999", "-ot", "exps=CPU", "-c", "8192", "-fit", "off"]


# --- reading the flag as common.cpp does --------------------------------------------------------


def test_c_number_reading() -> None:
    assert [atol(t) for t in ("12", " -7", "+3x", "x", "", "99999999999999999999")] == [
        12, -7, 3, 0, 0, 2**63 - 1]
    assert [atof(t) for t in ("1.5", " 2e3", ".5x", "x", "1e", "inf")] == [1.5, 2000.0, 0.5, 0.0, 1.0,
                                                                             float("inf")]


def test_csv_items_as_parse_csv_row() -> None:
    assert csv_items('a=int:1,b=str:"x,y"') == ["a=int:1", 'b=str:"x', 'y"']  # a quote mid-field: literal
    assert csv_items('"a=str:x,y",b=int:2') == ["a=str:x,y", "b=int:2"]
    assert csv_items('"a=str:say ""hi"""') == ['a=str:say "hi"']
    assert csv_items("a=int:1,") == ["a=int:1", ""]


@pytest.mark.parametrize(("item", "printed"), [
    ("noequals", "malformed KV override 'noequals'"),
    ("k" * 128 + "=int:1", "malformed KV override"),
    ("k=long:1", "invalid type for KV override 'k=long:1'"),
    ("k=bool:yes", "invalid boolean value for KV override 'k=bool:yes'"),
    ("k=str:" + "v" * 128, "value cannot exceed 127 chars"),
])
def test_items_llama_refuses(item: str, printed: str) -> None:
    override, said = parse_item(item)
    assert override is None and printed in said


def test_a_refused_item_refuses_the_command_in_each_dialect() -> None:
    main = parse_server_args(["--override-kv", "a=int:1,bad"], dialect=LLAMA_CPP)
    assert [e.message for e in main.errors] == [
        'error while handling argument "--override-kv": error: Invalid type for KV override: bad']
    # ik reads one item a flag: the comma is part of the int's text (atol stops there), so it passes
    assert parse_server_args(["--override-kv", "a=int:1,bad"], dialect=IK).ok
    ik = parse_server_args(["-okv", "bad"], dialect=IK)
    assert len(ik.errors) == 1 and "-okv" in str(ik.errors[0])
    # the 2025 mainline builds took one item a flag too
    assert parse_server_args(["--override-kv", "a=int:1,bad"], dialect=Dialect("llama.cpp-2025")).ok


def test_ik_knows_the_short_spelling() -> None:
    parsed = parse_server_args(["-okv", "deepseek2.expert_used_count=int:4"], dialect=IK)
    assert parsed.ok and "-okv" in parsed.passthrough


# --- the projection and the speed estimate follow the overrides it models ----------------------------


def test_fewer_experts_a_token_read_less_and_run_faster(dsv3) -> None:  # type: ignore[no-untyped-def]
    plain = _analysis(dsv3, BASE)
    four = _analysis(dsv3, [*BASE, "--override-kv", "deepseek2.expert_used_count=int:4"])
    assert four.plan.model.summary.n_expert_used == 4 and plain.plan.model.summary.n_expert_used == 8
    hw = hardware_for(DEVICES)
    e8, e4 = estimate(plain.plan, hw), estimate(four.plan, hw)
    cpu8 = next(d for d in e8.devices if d.name == "CPU")
    cpu4 = next(d for d in e4.devices if d.name == "CPU")
    # the CPU holds every routed expert (the file's bytes, from its tensor table): a token reads 4 of
    # each layer's 256 instead of 8, so 4/256 of them less
    routed = sum(t.nbytes for t in dsv3.tensors if "_exps." in t.name)
    assert cpu8.bytes_per_token - cpu4.bytes_per_token == pytest.approx(routed * 4 / 256, rel=1e-6)
    assert e4.tg_tps > 1.5 * e8.tg_tps
    # the weights do not change (every expert is loaded), the command keeps the flag
    assert _total(four, "model") == _total(plain, "model")
    assert four.command[-2:] == ["--override-kv", "deepseek2.expert_used_count=int:4"]
    assert any("experts a token uses 4, the file's 8" in n for n in four.command_notes)


def test_the_trained_context_override_sizes_the_kv_cache_of_c_0(dsv3) -> None:  # type: ignore[no-untyped-def]
    argv = ["-ngl", "999", "-ot", "exps=CPU", "-c", "0", "-fit", "off"]
    plain = _analysis(dsv3, argv)
    small = _analysis(dsv3, [*argv, "--override-kv", "deepseek2.context_length=int:16384"])
    assert [_n_ctx(a) for a in (plain, small)] == [163840, 16384]
    kv = [_total(a, "kv") for a in (plain, small)]
    assert kv[1] * 10 == kv[0]  # the cache is per cell: a tenth of the cells
    assert any("trained context 16384" in n for n in small.command_notes)
    assert not any("163840" in n and "-c 0" in n for n in small.command_notes)


def test_first_override_of_a_key_wins_and_wrong_types_keep_the_file(dsv3) -> None:  # type: ignore[no-untyped-def]
    first = _analysis(dsv3, [*BASE, "--override-kv", "deepseek2.expert_used_count=int:2",
                             "--override-kv", "deepseek2.expert_used_count=int:6"])
    assert first.plan.model.summary.n_expert_used == 2
    typed = _analysis(dsv3, [*BASE, "--override-kv", "deepseek2.expert_used_count=float:2"])
    assert typed.plan.model.summary.n_expert_used == 8
    assert any("expected int but got float" in n for n in typed.command_notes)
    shape = _analysis(dsv3, [*BASE, "--override-kv", "deepseek2.block_count=int:3"])
    assert shape.plan.model.summary.n_layer == 61
    assert any("not modelled" in n and "block_count (61)" in n for n in shape.command_notes)


def test_an_override_llama_asserts_on_is_a_warning_not_a_crash(dsv3) -> None:  # type: ignore[no-untyped-def]
    for value, why in (("0", "no expert used of 256"), ("257", "257 experts used of 256"),
                       ("-1", "4294967295 experts used")):  # -1 as uint32_t
        a = _analysis(dsv3, [*BASE, "--override-kv", f"deepseek2.expert_used_count=int:{value}"])
        assert a.plan.model.summary.n_expert_used == 8  # projected as the file, flagged as refused
        assert any("llama-server aborts while loading the model" in w and why in w for w in a.warnings)


def test_plans_of_one_command_share_the_loaded_model(dsv3) -> None:  # type: ignore[no-untyped-def]
    """Edits copy the plan: the overridden model stays one object (the window's caches key on it), and a
    plan without the flag projects the file's model again."""
    from dataclasses import replace

    a = _analysis(dsv3, [*BASE, "--override-kv", "deepseek2.expert_used_count=int:4"])
    b = replace(a.plan, moves={"blk.5.ffn_up_exps.weight": "CUDA0"})
    assert b.model is a.plan.model
    c = replace(a.plan, extra_args=[])
    assert c.model is dsv3


def test_ik_ser_is_said_to_do_nothing_in_current_builds() -> None:
    """ik_llama.cpp since PR 840 (2025-10-19) selects experts with ggml_top_k, its ggml_top_k_thresh
    call commented out (src/llama-build-context.cpp llm_build_moe_ffn): -ser reaches no op. The 2025
    builds applied it (PR 239), which the estimate does not model: said so there."""
    now = parse_server_args(["-ser", "6,1"], dialect=IK)
    assert now.ok and any("-ser 6,1 does nothing" in w.message for w in now.warnings)
    old = parse_server_args(["-ser", "6,1"], dialect=Dialect("ik_llama.cpp-2025"))
    assert old.ok and any("does not model it" in w.message for w in old.warnings)
    assert not any("does nothing" in w.message for w in old.warnings)


def test_with_override_replaces_one_key_and_keeps_the_rest() -> None:
    from offload_planner.core.kv_override import with_override

    key = "qwen3moe.expert_used_count"
    args = ["-t", "8", "--override-kv", f'{key}=int:2,"a=str:x,y"', "--jinja",
            "--override-kv", f"{key}=int:6"]
    out = with_override(args, key, f"{key}=int:4", csv=True)
    assert out == ["-t", "8", "--override-kv", '"a=str:x,y"', "--jinja", "--override-kv", f"{key}=int:4"]
    # read back as llama-server reads it: the other item intact, one override of the key
    assert parse_server_args(out).ok
    assert [o.item for o in overrides_in(out, True)] == ["a=str:x,y", f"{key}=int:4"]
    assert with_override(out, key, None, csv=True) == ["-t", "8", "--override-kv", '"a=str:x,y"', "--jinja"]
    ik = with_override(["-okv", f"{key}=int:2", "-okv", "b=int:1"], key, None, csv=False)
    assert ik == ["-okv", "b=int:1"]
