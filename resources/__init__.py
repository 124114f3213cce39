"""Bundled resources (demo model headers, icons, desktop files), installed as
``offload_planner.resources`` so they are found from a wheel as well as a checkout."""

from pathlib import Path

RESOURCE_DIR = Path(__file__).resolve().parent
ICON_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def resource_path(name: str) -> Path:
    """Absolute path of a bundled resource file."""
    return RESOURCE_DIR / name


def icon_path(size: int = 256) -> Path:
    """The app icon as a PNG of the smallest rendered size >= ``size`` (512 at most); the SVG
    source is ``resource_path("icons/offload-planner.svg")``."""
    px = next((s for s in ICON_SIZES if s >= size), ICON_SIZES[-1])
    return RESOURCE_DIR / "icons" / f"offload-planner-{px}.png"
