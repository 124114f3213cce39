"""Layer-range regexes: the compressed pattern matches exactly the chosen layers, no others."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from offload_planner.core.export import int_range_regex, layers_regex, runs


@given(st.integers(0, 3000), st.integers(0, 3000))
def test_int_range_regex_matches_exactly_the_range(a: int, b: int) -> None:
    lo, hi = min(a, b), max(a, b)
    rx = re.compile("^(" + "|".join(int_range_regex(lo, hi)) + ")$")
    for n in {0, 1, 9, 10, 99, 100, 999, 1000, lo - 1, lo, lo + 1, hi - 1, hi, hi + 1, (lo + hi) // 2}:
        if n >= 0:
            assert bool(rx.match(str(n))) == (lo <= n <= hi), (lo, hi, n)
    assert not rx.match("0" + str(lo))  # no leading zeros


@given(st.sets(st.integers(0, 130), min_size=1, max_size=60))
def test_layers_regex_in_a_tensor_name_selects_exactly_those_layers(layers: set[int]) -> None:
    rx = re.compile(rf"blk\.{layers_regex(layers)}\.ffn_up_exps")
    for il in range(0, 140):
        assert bool(rx.search(f"blk.{il}.ffn_up_exps.weight")) == (il in layers), il


def test_runs_and_compact_form() -> None:
    assert runs([5, 3, 4, 9, 10, 12]) == [(3, 5), (9, 10), (12, 12)]
    assert layers_regex(range(0, 26)) == "([0-9]|1[0-9]|2[0-5])"
    assert layers_regex([7]) == "7"
