"""What the window says where the RAM holds routed experts that GPUs have room for: one text for the
Memory pane's "What next" and "Faster" lines and the Problems tab's over-capacity line (no Qt)."""

from __future__ import annotations

from offload_planner.core.units import GiB


def gpus_left(room: tuple[tuple[str, int], ...]) -> str:
    """``CUDA0's 17.3 GiB left and CUDA1's 17.8 GiB left``."""
    return " and ".join(f"{n}'s {b / GiB:.1f} GiB left" for n, b in room)


def fill_action(gpu: str) -> str:
    """Where moves or -ot rules hold the CPU's experts: the preset that moves them anyway (Fastest plan
    keeps both, so it answered "Nothing fits" to a RAM over beside a GPU with 19 GiB left); Fill takes
    whole layers, a room smaller than one takes single tensors dragged there."""
    return (f"Presets ▸ Fill {gpu} with routed experts (whole layers) or drag expert tensors onto it "
            "(Fastest plan keeps the moves and -ot rules that hold them on the CPU)")


def ram_over_action(room: tuple[tuple[str, int], ...], held: int) -> str:
    """``CUDA0's 19.0 GiB left can take routed experts from it: Presets ▸ Fastest plan moves them there``."""
    how = fill_action(room[0][0]) if held else "Presets ▸ Fastest plan moves them there"
    return f"{gpus_left(room)} can take routed experts from it: {how}"
