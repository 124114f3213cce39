"""Packaging: every subpackage is listed in pyproject, and a built wheel carries the demo models and
finds them at run time without the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed_in_pyproject() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    pkg_root = ROOT / "gui"
    found = {
        ".".join(p.parent.relative_to(pkg_root).parts)
        for p in (pkg_root / "offload_planner").rglob("__init__.py")
    }
    assert found | {"offload_planner.resources"} == listed


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out),
         str(ROOT)],
        check=True, timeout=300,
    )
    return next(out.glob("offload_planner-*.whl"))


def test_wheel_contains_demo_models(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "offload_planner/resources/DeepSeek-V3-Q4_K_M.header.gguf" in names
    assert "offload_planner/resources/Qwen3-30B-A3B-Q4_K_M.header.gguf" in names


def test_wheel_contains_icons_and_desktop_files(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    res = "offload_planner/resources/"
    assert {f"{res}icons/offload-planner-{s}.png" for s in (16, 24, 32, 48, 64, 128, 256, 512)} <= names
    assert {f"{res}icons/offload-planner.svg", f"{res}icons/offload-planner.ico"} <= names
    assert f"{res}offload-planner.desktop" in names
    assert f"{res}io.github.offload_planner.OffloadPlanner.metainfo.xml" in names
    assert not any(n.startswith(f"{res}screenshots/") for n in names)  # README pictures stay out


def test_installed_wheel_inspects_its_demo_model_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=True)
    py = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)],
                   check=True, timeout=300, env=env)
    r = subprocess.run([py, "-m", "offload_planner", "inspect", "--json", "--compact"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert '"arch": "deepseek2"' in r.stdout and '"n_tensors": 1086' in r.stdout
    assert str(ROOT) not in r.stdout  # the demo model came from the installed wheel
    r = subprocess.run(
        [py, "-c", "from offload_planner.resources import icon_path; p = icon_path(); "
         "print(p, p.is_file(), p.read_bytes()[:8] == bytes.fromhex('89504e470d0a1a0a'))"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env,
    )
    assert r.returncode == 0, r.stderr
    path, is_file, is_png = r.stdout.split()
    assert path.endswith("offload-planner-256.png") and is_file == is_png == "True"
    assert not path.startswith(str(ROOT))  # the icon came from the installed wheel too
