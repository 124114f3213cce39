"""The user's config folder, where the calibration store and the speed figures live:
``$OFFLOAD_PLANNER_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/offload-planner``, ``%APPDATA%\\offload-planner``
on Windows, ``~/Library/Application Support/offload-planner`` on macOS.

A module of its own so that reading ``speed.json`` (every ``plan``) does not import the calibration
store (:mod:`offload_planner.backend.calibration`, which re-exports :func:`config_dir`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def config_dir() -> Path:
    env = os.environ.get("OFFLOAD_PLANNER_CONFIG_DIR")
    if env:
        return Path(env)
    if sys.platform == "win32":
        return Path(os.environ.get("APPDATA", Path.home() / "AppData" / "Roaming")) / "offload-planner"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "offload-planner"
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg else Path.home() / ".config") / "offload-planner"
