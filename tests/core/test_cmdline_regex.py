"""-ot patterns as std::regex (ECMAScript, libstdc++) reads them.

Expected ``what()`` texts were captured from libstdc++ (GCC 12.2, the pinned build's compiler),
and the ones in test_cmdline_refusals.py from llama-server itself.
"""

from __future__ import annotations

import re

import pytest

from offload_planner.core.cmdline import EcmaRegexError, check_pattern, compile_pattern

LIBSTDCXX = [
    ("[abc", "Unexpected character within '[...]' in regular expression"),
    ("(?i)abc", "Invalid '(?...)' zero-width assertion in regular expression"),
    ("(?<n>x)", "Invalid '(?...)' zero-width assertion in regular expression"),
    ("(?#c)", "Invalid '(?...)' zero-width assertion in regular expression"),
    ("a{,3}", "Invalid range in '{}' in regular expression"),
    ("a{3,2}", "Invalid range in '{}' in regular expression"),
    ("\\p{L}", "Invalid range in '{}' in regular expression"),
    ("[z-a]", "Invalid range in bracket expression."),
    ("[a-\\d]", "Invalid end of '[x-x]' range in regular expression"),
    ("[\\w-z]", "Invalid start of '[x-x]' range in regular expression"),
    ("[[:foo:]]", "Invalid character class."),
    ("[[:alpha]", "Invalid character class in regular expression"),
    ("\\x4", "Invalid '\\xNN' control character in regular expression"),
    ("\\u41", "Invalid '\\uNNNN' control character in regular expression"),
    ("\\c", "invalid '\\cX' control character in regular expression"),
    ("(a\\1)", "Back-reference referred to an opened sub-expression."),
    ("(?=a)*", "Mismatched '(' and ')' in regular expression"),
    ("x)", "Mismatched '(' and ')' in regular expression"),
    ("[\\", "Invalid escape in regular expression"),
    ("\\9\\x4", "Invalid '\\xNN' control character in regular expression"),  # scanner reads one token ahead
    (
        "a{99999}",
        "Number of NFA states exceeds limit. Please use shorter regex string, or use smaller brace "
        "expression, or make _GLIBCXX_REGEX_STATE_LIMIT larger.",
    ),
]


@pytest.mark.parametrize(("pattern", "what"), LIBSTDCXX)
def test_rejected_like_libstdcxx(pattern: str, what: str) -> None:
    assert check_pattern(pattern).error == what
    with pytest.raises(EcmaRegexError, match=re.escape(what)):
        compile_pattern(pattern)


@pytest.mark.parametrize(
    "pattern",
    [
        "a**",
        "a++",
        "a{2}{3}",
        "\\Z",
        "\\k",
        "[]a]",
        "[^]",
        "(a)\\1",
        "\\0",
        "}",
        "]",
        "a{1000}",
        "[[.space.]]",
        "(?:x)",
        "(?=x)",
        "(?!x)",
        "[[:alpha:]_]+",
        "\\bffn\\B",
        "blk\\.\\d+\\.ffn_(up|down)_exps",
    ],
)
def test_accepted_like_libstdcxx(pattern: str) -> None:
    assert check_pattern(pattern).error is None


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        ("blk\\.(1|2)\\.ffn_.*_exps", "blk.1.ffn_up_exps.weight", True),
        ("blk\\.(1|2)\\.ffn_.*_exps", "blk.12.ffn_up_exps.weight", False),
        ("exps\\.weight$", "blk.0.ffn_up_exps.weight", True),
        ("weight\\Z", "blk.0.ffn_up_exps.weight", False),  # \Z is a literal Z in ECMAScript
        ("weightZ", "weightZ", True),
        ("\\cA", "A", True),  # libstdc++ reads \cX as X
        ("[]", "anything", False),  # empty class
        ("[^]", "x", True),
        ("a++b", "aab", True),  # not possessive: (a+)+
        ("\\B", "", True),
        ("[[:digit:]]+\\.ffn", "blk.31.ffn_up", True),
        ("^token_embd", "token_embd.weight", True),
        ("^output", "blk.1.output", False),
    ],
)
def test_matches_like_regex_search(pattern: str, name: str, matches: bool) -> None:
    assert bool(compile_pattern(pattern).search(name)) is matches


@pytest.mark.parametrize(
    ("pattern", "fragment"),
    [
        ("weight\\Z", "literal 'Z'"),
        ("\\Aoutput", "literal 'A'"),
        ("exps++", "not possessive"),
        ("(?<!x)y", "lookbehind"),
        ("(?P<n>x)", "named groups"),
        ("(?i)x", "inline flags"),
        ("\\cA", "control character"),
    ],
)
def test_warnings_for_python_pcre_readings(pattern: str, fragment: str) -> None:
    assert any(fragment in w for w in check_pattern(pattern).warnings)


def _generated_patterns() -> list[str]:
    """Every pattern llama.cpp writes itself for --cpu-moe, --n-cpu-moe and --n-cpu-ffn (mainline, its
    2025 builds, ik's generated block rule), for every layer a model may have."""
    from offload_planner.core.cmdline.moe import (
        IK_EXPS_BLOCK,
        MAINLINE_2025_EXPS_REGEX,
        MAINLINE_DENSE_REGEX,
        MAINLINE_EXPS_REGEX,
        block_regex,
    )
    from offload_planner.core.metadata import LLAMA_MAX_LAYERS

    tails = (MAINLINE_EXPS_REGEX, MAINLINE_2025_EXPS_REGEX, MAINLINE_DENSE_REGEX)
    out = list(tails)
    for il in range(LLAMA_MAX_LAYERS):
        out += [block_regex(il, t) for t in tails] + [IK_EXPS_BLOCK.format(il)]
    return out


def test_generated_patterns_checked_as_the_parser_checks_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp's own --cpu-moe / --n-cpu-moe / --n-cpu-ffn patterns are checked without the parser,
    and the checks are the parser's, field by field; near misses still go to the parser."""
    from offload_planner.core.cmdline import ecma_regex

    patterns = _generated_patterns()
    parsed = {p: ecma_regex._parsed(p) for p in patterns}
    near = [r"blk\.1234\.ffn_(up|down|gate)_exps", r"blk\.007\.ffn_(up|down|gate)_exps",
            r"blk\.٣\.ffn_(up|down|gate)_exps", r"blk\.1\.ffn_(up|down|gate)_exps$",
            r"\.ffn_(up|down|gate)_exps\.", r"Blk\.1\.ffn_(up|down|gate)\."]
    near_parsed = {p: ecma_regex._parsed(p) for p in near}

    class NoParser:
        def __init__(self, pattern: str) -> None:
            raise AssertionError(f"parsed {pattern!r}")

    ecma_regex._check_cached.cache_clear()
    monkeypatch.setattr(ecma_regex, "_Parser", NoParser)
    for p in patterns:
        assert check_pattern(p) == parsed[p], p
        assert compile_pattern(p).pattern == parsed[p].python
    monkeypatch.undo()
    ecma_regex._check_cached.cache_clear()
    for p, want in near_parsed.items():
        if p != r"blk\.007\.ffn_(up|down|gate)_exps":  # its own translation too, by either path
            with pytest.raises(AssertionError, match="parsed"):
                monkeypatch.setattr(ecma_regex, "_Parser", NoParser)
                ecma_regex._check_cached.cache_clear()
                check_pattern(p)
            monkeypatch.undo()
        ecma_regex._check_cached.cache_clear()
        assert check_pattern(p) == want, p
