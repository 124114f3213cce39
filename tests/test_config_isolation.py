"""The tests never write the user's settings: every config location of the app (and of the
processes the tests start) resolves under the session's temporary home, and writing through the
app's own stores leaves the user's real config folders as they were (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import offload_planner
from offload_planner.backend.calibration import CalibrationStore, config_dir

# the package under test first (a checkout's gui/ or the install), then the caller's own path
PACKAGE_ROOT = os.pathsep.join(
    p for p in (str(Path(offload_planner.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")) if p
)


def test_config_locations_are_under_the_session_root(test_root: Path) -> None:
    assert config_dir().is_relative_to(test_root)
    assert Path.home().is_relative_to(test_root)
    assert not any(k.startswith("LLAMA_ARG_") for k in os.environ)


def test_a_child_process_finds_its_config_under_the_session_root(test_root: Path) -> None:
    code = "from offload_planner.backend.calibration import config_dir; print(config_dir())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": PACKAGE_ROOT})
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).is_relative_to(test_root)


def test_the_windows_default_settings_file_is_under_the_session_root(test_root: Path) -> None:
    from offload_planner.ui.settings import Settings  # QSettings needs no application object

    settings = Settings()  # what `offload-planner` without --settings uses
    settings.q.setValue("isolation/probe", "1")
    settings.q.sync()
    path = Path(settings.q.fileName())
    assert path.is_relative_to(test_root), path
    settings.q.remove("isolation/probe")


def test_recording_a_calibration_leaves_the_user_config_alone(
    test_root: Path, user_config_changes: Callable[[], list[str]]
) -> None:
    store = CalibrationStore()
    store.record("fingerprint-of-a-test", "options", {"CPU": 1 << 20}, {"CPU": 1 << 20})
    assert store.path.is_file() and store.path.is_relative_to(test_root)
    store.forget("fingerprint-of-a-test", "options")
    assert user_config_changes() == []
