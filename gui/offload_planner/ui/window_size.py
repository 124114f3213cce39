"""The planner window's sizes (no Qt: the command line checks ``--size`` before Qt starts)."""

from __future__ import annotations

#: The size the window opens at (the layout's design size) when the screen has room for it.
DEFAULT_SIZE = (1280, 800)
#: Smaller screens still hold the window: 1920x1080 at 150 % is 1280x720 logical pixels, a 1366x768
#: laptop leaves about 1366x700 under its panels (at 1280x800 minimum, the window was taller than
#: either screen). Below the default the map and the memory bars give way, the left column scrolls.
MIN_SIZE = (1024, 640)


def size_problem(width: int, height: int) -> str:
    """Why the window cannot be ``width`` x ``height`` ("" if it can)."""
    if width < MIN_SIZE[0] or height < MIN_SIZE[1]:
        return f"smaller than the window's minimum {MIN_SIZE[0]}x{MIN_SIZE[1]}"
    return ""
