"""``core.speed.acceptance.powers_sum`` past the draft lengths it sums term by term: the closed form
continues the sum (no jump at the switch), and an absurd length is answered at once."""

from __future__ import annotations

import math

import pytest
from tests.support.deadline import deadline

from offload_planner.core.speed.acceptance import SUMMED_DRAFTS, Acceptance, powers_sum
from offload_planner.core.speed.speculation import tokens_per_step


@pytest.mark.parametrize("a", [0.0, 0.3, 0.806, 0.999, 1.0])
def test_the_closed_form_continues_the_sum(a: float) -> None:
    n = SUMMED_DRAFTS + 1
    assert math.isclose(powers_sum(a, n), sum(a**i for i in range(n + 1)), rel_tol=1e-9)
    assert tokens_per_step(a, 3) == 1 + a + a**2 + a**3  # the figures of real draft lengths as before


def test_an_absurd_draft_length_is_answered_at_once() -> None:
    with deadline(5):
        assert powers_sum(0.5, 2**31 - 1) == pytest.approx(2.0)
        assert powers_sum(1.0, 2**31 - 1) == 2**31
        a = Acceptance("len", 3.0).per_token(2**31 - 1)
        assert 0.0 < a < 1.0 and powers_sum(a, 2**31 - 1) == pytest.approx(3.0, rel=1e-6)
