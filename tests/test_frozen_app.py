"""The PyInstaller one-folder app: build it from packaging/offload-planner.spec into a temporary
folder (PyInstaller's cache too) and run the frozen executable outside the checkout: --version,
a headless `inspect --json` of the bundled demo model, an offscreen screenshot of the window
(which needs the Qt platform plugins in the bundle) and `launch --verify` against the real
llama-server. About 20 s of build on 2 cores."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from offload_planner import __version__
from offload_planner.core.synth import SMALL_MODELS, write_model

ROOT = Path(__file__).resolve().parents[1]
NAME = "offload-planner"
APP_ID = "io.github.offload_planner.OffloadPlanner"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("PyInstaller", reason="PyInstaller is in the test extra: pip install -e '.[test]'")
    tmp = tmp_path_factory.mktemp("frozen")
    env = {k: v for k, v in os.environ.items() if k != "PYINSTALLER_CONFIG_DIR"}
    env["PYINSTALLER_CONFIG_DIR"] = str(tmp / "cache")  # not ~/.cache/pyinstaller
    r = subprocess.run(
        [sys.executable, str(ROOT / "packaging" / "build.py"), "--dist", str(tmp / "dist"),
         "--work", str(tmp / "work"), "--quiet"],
        capture_output=True, text=True, timeout=900, env=env,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return tmp / "dist" / NAME


def _run(bundle: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    exe = bundle / (f"{NAME}.exe" if sys.platform == "win32" else NAME)
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "QT_QPA_PLATFORM")}
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**clean, **env})


def test_frozen_version(bundle: Path, tmp_path: Path) -> None:
    r = _run(bundle, "--version", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{NAME} {__version__}"


def test_frozen_inspect_json_of_the_bundled_demo_model(bundle: Path, tmp_path: Path) -> None:
    r = _run(bundle, "inspect", "--json", "--compact", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert '"arch": "deepseek2"' in r.stdout and '"n_tensors": 1086' in r.stdout
    assert str(bundle) in r.stdout and str(ROOT) not in r.stdout  # the model inside the bundle


def test_frozen_window_renders_offscreen(bundle: Path, tmp_path: Path) -> None:
    shot = tmp_path / "shot.png"
    r = _run(bundle, "gui", "--device", "CUDA0=24GiB", "--screenshot", str(shot), "--size", "1440x900",
             "--settings", str(tmp_path / "settings.ini"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    head = shot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", head[16:24]) == (1440, 900)


@pytest.mark.integration
def test_frozen_launch_verifies_against_the_real_server(
    bundle: Path, tmp_path: Path, llama_server: Path
) -> None:
    model = write_model(SMALL_MODELS["qwen3moe"], tmp_path / "qwen3moe.gguf")[0]
    r = _run(bundle, "launch", str(model), "--server", str(llama_server), "--verify", "--no-detect",
             "--quiet", "--", "-c", "1024", "-fit", "off", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every device matches the projection" in r.stdout + r.stderr


def test_bundle_carries_icons_and_desktop_files(bundle: Path) -> None:
    res = bundle / "_internal" / "offload_planner" / "resources"
    assert (res / "icons" / "offload-planner-256.png").is_file()
    assert (res / "Qwen3-30B-A3B-Q4_K_M.header.gguf").is_file()
    share = bundle / "share"
    assert (share / "applications" / "offload-planner.desktop").is_file()
    assert (share / "metainfo" / f"{APP_ID}.metainfo.xml").is_file()
    assert (share / "mime" / "packages" / "offload-planner.xml").is_file()
    for size in (16, 32, 48, 128, 256, 512):
        assert (share / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "offload-planner.png").is_file()
    assert (share / "icons" / "hicolor" / "scalable" / "apps" / "offload-planner.svg").is_file()
