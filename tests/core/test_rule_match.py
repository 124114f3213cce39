"""-ot rules on hostile patterns and in bulk: a budget that names the rule, never a hang, and the
same first-match answers as trying every rule with ``re`` in order.

Every test that could hang on a regression runs under :func:`deadline` (SIGALRM: Python's ``re``
checks signals while it backtracks), so it fails instead.
"""

from __future__ import annotations

import random
import re

import pytest
from tests.support.deadline import deadline

from offload_planner.cli import demo_model_path
from offload_planner.core.cmdline import check_pattern, compile_pattern, parse_server_args
from offload_planner.core.cmdline.ecma_regex import MAX_NESTING, PatternLimitError
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.errors import PlannerError, RuleError
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.placement import Override, PlacementOptions, place
from offload_planner.core.rule_match import NAME_STEPS, NameIndex, RuleSet

DEVICES = DeviceSet(Device("CPU", DeviceKind.CPU), (Device("CUDA0", DeviceKind.CUDA, 24 << 30, 24 << 30),))
HANGS = [r"(.+)+Z", r"([a-z0-9_.]+)*Z", r"(\w+\.?)+Z", r"(.|.)*Z", r"((.)*)*Z", r"(?:.*){1000}Z"]


@pytest.fixture(scope="module")
def deepseek() -> Model:
    return open_model(demo_model_path())


def _place(model: Model, *rules: Override, ngl: int = 999) -> list[str]:
    placement = place(model, DEVICES, PlacementOptions(n_gpu_layers=ngl, overrides=tuple(rules)))
    placement.raise_rule_errors()
    return [f"{p.name}={p.device}" for p in placement.items]


@pytest.mark.parametrize("pattern", HANGS)
def test_catastrophic_backtracking_is_a_rule_error_naming_the_rule(deepseek: Model, pattern: str) -> None:
    with deadline(30), pytest.raises(RuleError) as ei:
        _place(deepseek, Override(pattern, "CPU"))
    msg = str(ei.value)
    assert msg.startswith(f"-ot '{pattern}=CPU': the pattern backtracks "), msg
    assert "llama.cpp's std::regex backtracks the same way and would stall" in msg
    assert isinstance(ei.value, PlannerError)


def test_a_broken_rule_matches_nothing_and_the_placement_still_exists(deepseek: Model) -> None:
    """The window needs a placement to draw: the broken rule is skipped and reported."""
    opts = PlacementOptions(n_gpu_layers=999, overrides=(Override(r"(.+)+Z", "CPU"), Override("exps", "CPU")))
    with deadline(30):
        placement = place(deepseek, DEVICES, opts)
    assert len(placement.rule_errors) == 1 and "(.+)+Z=CPU" in placement.rule_errors[0]
    assert placement.device_of("blk.10.ffn_up_exps.weight") == "CPU"
    assert placement.device_of("blk.10.attn_q_a.weight") == "CUDA0"
    assert placement.override_hits == {0: 0, 1: 174}


@pytest.mark.parametrize("pattern", ["(" * 1000 + "a" + ")" * 1000, "(" * 1000, "(?:" * 500 + "x" + ")" * 500,
                                     "a" + "{1}" * 1000])
def test_deep_nesting_is_a_clear_error_not_a_recursion_error(deepseek: Model, pattern: str) -> None:
    check = check_pattern(pattern)
    assert check.limit is not None and f"more than {MAX_NESTING} deep" in check.limit
    with pytest.raises(PatternLimitError):
        compile_pattern(pattern)
    with deadline(30), pytest.raises(RuleError, match=f"more than {MAX_NESTING} deep"):
        _place(deepseek, Override(pattern, "CPU"))


def test_nesting_up_to_the_limit_still_matches(deepseek: Model) -> None:
    depth = MAX_NESTING - 1
    pattern = "(" * depth + r"ffn_up_exps" + ")" * depth
    assert check_pattern(pattern).limit is None
    placed = _place(deepseek, Override(pattern, "CPU"))
    assert "blk.10.ffn_up_exps.weight=CPU" in placed and "blk.10.ffn_down_exps.weight=CUDA0" in placed


@pytest.mark.parametrize("pattern", [r"(\w+\.)+weight", r"(blk\.\d+\.)+ffn_(up|down)_exps", r"(?:a|b|c)*exps",
                                     r"(ffn_(up|down))\1?_exps"])
def test_risky_but_fine_patterns_match_as_re_does(deepseek: Model, pattern: str) -> None:
    assert check_pattern(pattern).may_backtrack
    rx = compile_pattern(pattern)
    with deadline(30):
        placed = _place(deepseek, Override(pattern, "CPU"))
    want = [f"{t.name}={'CPU' if rx.search(t.name) else 'CUDA0'}" for t in deepseek.tensors
            if not t.name.startswith("token_embd") and not t.role.name.startswith("NEXTN")]
    assert set(want) <= set(placed)


def _naive_first(rules: list[Override], name: str) -> int | None:
    for i, o in enumerate(rules):
        check = check_pattern(o.pattern)
        if check.python is not None and re.search(check.python, name, re.ASCII):
            return i
    return None


_PIECES = ["blk", r"\.", r"\d", r"\d+", "1", "2", "[0-9]", "ffn", "_", "up", "down", "exps", "attn", "weight",
           ".", ".*", "(up|down)", "(ch|)", "^", "$", "[^_]", r"\b", "(?=ffn)", "(?!attn)", "output", "token"]


def test_first_match_equals_trying_every_rule_in_order(deepseek: Model) -> None:
    """The literal prefilter and the per-pattern cache never change which rule wins."""
    rng = random.Random(12)
    rules = [Override("".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 6))), "CPU")
             for _ in range(300)]
    rules += rules[:20]  # repeated patterns: the later copies are shadowed
    rs = RuleSet(rules)
    for t in deepseek.tensors:
        assert rs.first(t.name) == _naive_first(rules, t.name), t.name


def test_all_names_at_once_equal_trying_every_rule_in_order(deepseek: Model) -> None:
    """``first_of_all`` (place's path: each pattern's matches kept in the model's name index and
    shared by later rule sets) gives every name the rule the per-name path gives it."""
    rng = random.Random(13)
    names = [t.name for t in deepseek.tensors]
    index = NameIndex(tuple(names))
    for _ in range(4):
        rules = [Override("".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 6))), "CPU")
                 for _ in range(120)]
        rules = [o for o in rules if not check_pattern(o.pattern).may_backtrack]
        rules += rules[:10]
        rs = RuleSet(rules)
        got = rs.first_of_all(index)
        assert got is not None
        assert got == [_naive_first(rules, n) for n in names]
        assert got == [RuleSet(rules).first(n) for n in names]
    risky = RuleSet([Override(r"(\w+\.)+weight", "CPU")])
    assert risky.first_of_all(index) is None  # budgeted: name by name


def test_ten_thousand_rules_compile_only_the_candidates(deepseek: Model) -> None:
    """10,000 -ot rules took 9-24 s: each was compiled and tried on every tensor."""
    rules = [Override(rf"blk\.{i}\.ffn_up_exps", "CPU") for i in range(10_000)]
    rs = RuleSet(rules)
    with deadline(60):
        placed = _place(deepseek, *rules)
    assert "blk.60.ffn_up_exps.weight=CPU" in placed and "blk.60.ffn_down_exps.weight=CUDA0" in placed
    compiled = sum(p._regex is not None for p in rs.patterns)
    assert compiled == 0  # a fresh set: nothing compiled until a name needs it
    for t in deepseek.tensors:
        rs.first(t.name)
    compiled = sum(p._regex is not None for p in rs.patterns)
    assert 0 < compiled <= 62, compiled  # layers 0..60 (and NextN 61) only


def test_n_cpu_moe_stops_at_llama_max_layers(deepseek: Model) -> None:
    """--n-cpu-moe 99999 made 99,999 rules (59 s); llama.cpp loads at most 512 layers."""
    huge = parse_server_args(["--n-cpu-moe", "99999"], dialect="llama.cpp").args.overrides
    exact = parse_server_args(["--n-cpu-moe", "61"], dialect="llama.cpp").args.overrides
    assert len(huge) == 512 and huge[:61] == exact
    with deadline(60):
        assert _place(deepseek, *map(_override, huge)) == _place(deepseek, *map(_override, exact))


def _override(o: object) -> Override:
    return Override(o.pattern, o.buft, o.source)  # type: ignore[attr-defined]


def test_a_few_independent_repeats_are_not_budgeted(deepseek: Model) -> None:
    """``.*ffn.*exps.*weight`` is cubic at worst on names of < 64 bytes: matched by re directly."""
    assert not check_pattern(r".*ffn.*exps.*weight").may_backtrack
    placed = _place(deepseek, Override(r".*ffn.*exps.*weight", "CPU"))
    assert "blk.3.ffn_gate_exps.weight=CPU" in placed and "blk.3.ffn_gate_shexp.weight=CUDA0" in placed


def test_message_names_the_budget() -> None:
    assert f"{NAME_STEPS:,}" == "100,000"


def test_a_repeated_count_flag_adds_no_duplicate_rules(deepseek: Model) -> None:
    """Found by the command-line fuzz: --n-cpu-moe 4096 given 2,000 times was a million rules
    (each use appends its rules, as llama.cpp does; a repeat can never be the first match)."""
    with deadline(60):
        many = parse_server_args(["--n-cpu-moe", "4096"] * 2000 + ["--cpu-moe"] * 50).args.overrides
    once = parse_server_args(["--n-cpu-moe", "4096", "--cpu-moe"]).args.overrides
    assert [(o.pattern, o.source) for o in many] == [(o.pattern, o.source) for o in once]
    assert len(once) == 513
    user = parse_server_args(["-ot", "exps=CPU"] * 3).args.overrides
    assert len(user) == 3  # -ot rules are the user's own: each one is reported
