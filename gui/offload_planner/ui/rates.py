"""How the window writes a speed in tokens/s, the same in the speed line and the map's move preview."""

from __future__ import annotations

from offload_planner.core.speed.tps import tps_text


def rate_text(x: float) -> str:
    """Three significant figures below 100 t/s (0.532, 2.45, 23.6: "0.5" and "2.5" hid changes of a
    few percent on a big model in RAM, "2.5 → 2.5"), whole numbers above, plain decimals for a slow
    plan (0.0000391): :func:`offload_planner.core.speed.tps.tps_text`, as the commands write them."""
    return tps_text(x)


def change_text(now: float, then: float) -> str:
    """A speed's change as a share of ``now``: "+1.2%", "−30%" ("no change" below 0.05%)."""
    if now <= 0:
        return "no change" if then == now else "from 0"
    pct = 100 * (then - now) / now
    if abs(pct) < 0.05:
        return "no change"
    text = f"{abs(pct):.1f}%" if abs(pct) < 10 else f"{abs(pct):.0f}%"
    return ("+" if pct > 0 else "−") + text
