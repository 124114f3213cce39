"""Bundled resources (demo model headers, icons, desktop files), installed as
``offload_planner.resources`` so they are found from a wheel as well as a checkout."""

from pathlib import Path

RESOURCE_DIR = Path(__file__).resolve().parent


def resource_path(name: str) -> Path:
    """Absolute path of a bundled resource file."""
    return RESOURCE_DIR / name
