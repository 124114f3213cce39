"""How a speed in tokens/s is written, the same in every command's text, the window and ``--json``.

A speed is never written as 0 when it is not: a GPU declared with ``bw=0.001GB/s`` (1 MB/s) or
``tflops=1e-9`` gives estimates of 1e-4 to 1e-8 t/s, which fixed decimals printed as "0.00" and
``round(x, 3)`` carried as 0.0 in JSON, as if the plan could not generate at all.
"""

from __future__ import annotations

import math

#: Below this the text says "< 0.000001 t/s": a token in more than eleven days.
TPS_FLOOR = 1e-6
BELOW_FLOOR = "< 0.000001"


def tps_text(x: float) -> str:
    """Three significant figures below 100 t/s (0.532, 2.45, 23.6), whole numbers above, in plain
    decimals down to :data:`TPS_FLOOR` (0.0000391, not 3.91e-05), "< 0.000001" below it."""
    if x >= 100:
        return f"{x:.0f}"
    if x <= 0 or math.isnan(x):
        return f"{x:.3g}"
    if x >= 1e-4:  # "#": the zeros kept ("8.00", not "8": 7.999 t/s read as a round figure)
        return f"{x:#.3g}".removesuffix(".")  # 99.95 rounds to "100."
    if x < TPS_FLOOR:
        return BELOW_FLOOR
    digits = 2 - math.floor(math.log10(x))  # three significant figures in plain decimals
    return f"{x:.{digits}f}"


def tps_fixed(x: float, decimals: int) -> str:
    """``decimals`` fixed decimals (a table's column: 12.90, 104.5) while they show two significant
    figures or more, else :func:`tps_text` (0.0532, not 0.05; 0.000391, not 0.00)."""
    return f"{x:.{decimals}f}" if x >= 10.0 ** (1 - decimals) else tps_text(x)


def tps_json(x: float) -> float:
    """A speed for ``--json``: three decimals (as before) from 0.1 t/s up, three significant figures
    below (0.000391, 2.57e-08), so that a slow plan is not carried as 0.0."""
    return round(x, 3) if x >= 0.1 or x <= 0 else float(f"{x:.3g}")
