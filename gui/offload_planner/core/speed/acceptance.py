"""``--spec-accept`` as declared: a per-token share, or one of llama-server's printed forms
(:class:`Acceptance`), resolved by :func:`speculation.accept_figure` once the draft length is known.
No heavy imports: the command line parses it."""

from __future__ import annotations

from dataclasses import dataclass

#: draft lengths up to this are summed term by term (the figures as always, to the last digit)
SUMMED_DRAFTS = 4096


def powers_sum(a: float, n: int) -> float:
    """``1 + a + ... + a^n``; a draft length beyond any real one (``--spec-draft-n-max 2147483647``
    was summed term by term, for minutes) takes the geometric series' closed form."""
    if n <= SUMMED_DRAFTS:
        return sum(a**i for i in range(n + 1))
    return float(n + 1) if a >= 1.0 else (1.0 - a ** (n + 1)) / (1.0 - a)


@dataclass(frozen=True)
class Acceptance:
    """A declared acceptance in one of llama-server's two printed forms (its slot log: "draft
    acceptance = 0.72055 (... accepted / ... generated), mean len = 2.98"), turned into the per-token
    figure :func:`tokens_per_step` takes once the draft length ``n`` is known: ``ratio`` accepted over
    drafted tokens, ``(a + a^2 + ... + a^n) / n``; ``len`` tokens a verify step gives,
    ``1 + a + ... + a^n`` (both with full-length drafts, the pinned build's default
    ``--spec-draft-p-min 0``)."""

    kind: str  # "ratio" or "len"
    value: float

    def per_token(self, n: int) -> float:
        """The per-token acceptance ``a`` whose sum ``a + ... + a^n`` is this figure's (bisection: the
        sum rises with ``a``); clamped to 0..1 when the figure lies outside what ``n`` drafts give."""
        want = self.value * n if self.kind == "ratio" else self.value - 1.0
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            drafted = sum(mid**i for i in range(1, n + 1)) if n <= SUMMED_DRAFTS else powers_sum(mid, n) - 1.0
            if drafted < want:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    def text(self) -> str:
        return f"--spec-accept {self.kind}={self.value:g}"


#: ``--spec-accept``: a per-token share, one of llama-server's printed forms, or None (the default)
AcceptArg = float | Acceptance | None
