"""What the window says where no placement fits a Mac (its CPU and Metal GPUs together take more than
its one RAM, :func:`~offload_planner.core.mapped_span.no_placement_fits`): no preset helps, so none is
suggested; what helps instead. One text for the Memory pane's "What next" and the over-capacity lines."""

from __future__ import annotations

from offload_planner.core.units import GiB


def nothing_fits_text(shared_ram: str, short: int, *, cannot: str = "Fastest plan or moving layers",
                      figures: str = " (Problems has the figures)") -> str:
    """``shared_ram``: the devices of the one memory (``CPU + MTL0``); ``short``: the bytes by which they
    are over it; ``cannot``: the actions that cannot help; ``figures``: where the figures are."""
    return (f"no placement fits: {shared_ram} share one RAM and together take more than it, "
            f"by {short / GiB:.1f} GiB wherever the tensors go{figures}, so {cannot} cannot help. What "
            "helps: a smaller quant of the model, a smaller context or KV cache type (Options), or a Mac "
            "with more memory.")
