"""The planner window's sizes (no Qt: the command line checks ``--size`` before Qt starts)."""

from __future__ import annotations

#: The size the window opens at (the layout's design size) when the screen has room for it.
DEFAULT_SIZE = (1280, 800)
#: Smaller screens still hold the window: 1920x1080 at 150 % is 1280x720 logical pixels, a 1366x768
#: laptop leaves about 1366x700 under its panels (at 1280x800 minimum, the window was taller than
#: either screen). Below the default the map and the memory bars give way, the left column scrolls.
MIN_SIZE = (1024, 640)
#: The largest --size drawn (an 8K screen and then some): 99999x99999 was a 40 GB image Qt could not
#: allocate, and the process died of a segmentation fault painting into it.
MAX_SIZE = (8192, 8192)


def size_problem(width: int, height: int) -> str:
    """Why the window cannot be ``width`` x ``height`` ("" if it can)."""
    if width < MIN_SIZE[0] or height < MIN_SIZE[1]:
        return f"smaller than the window's minimum {MIN_SIZE[0]}x{MIN_SIZE[1]}"
    if width > MAX_SIZE[0] or height > MAX_SIZE[1]:
        return f"larger than the largest screenshot drawn, {MAX_SIZE[0]}x{MAX_SIZE[1]}"
    return ""


#: The panes' widths (Devices/Options, tensor map, Memory) at the design size.
PANE_DESIGN = (270, 690, 300)


def pane_widths(total: int, centre_need: int, side_mins: tuple[int, int]) -> tuple[int, int, int]:
    """The three panes' widths sharing ``total`` pixels: the side panes keep their design width
    while the tensor map has its ``centre_need`` (every column at its whole label); a narrower
    window takes the map's shortfall from the side panes, in proportion to what each can give
    above its minimum, before the map gives way (its columns then shrink to their short labels)."""
    left, _, right = PANE_DESIGN
    short = centre_need - (total - left - right)
    give_l, give_r = max(0, left - side_mins[0]), max(0, right - side_mins[1])
    if short > 0 and give_l + give_r > 0:
        take = min(short, give_l + give_r)
        dl = take * give_l // (give_l + give_r)
        left, right = left - dl, right - (take - dl)
    return left, total - left - right, right
