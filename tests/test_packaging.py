"""Packaging: every subpackage is listed in pyproject, and a built wheel carries the demo models and
finds them at run time without the checkout; the desktop entry, AppStream metainfo and the
shared-mime-info package for .gguf files agree with each other and pass the freedesktop tools
(desktop-file-validate, appstreamcli, update-mime-database; each test skips if its tool is missing)."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
import tomllib
import venv
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RES = ROOT / "resources"
DESKTOP = RES / "offload-planner.desktop"
METAINFO = RES / "io.github.offload_planner.OffloadPlanner.metainfo.xml"
MIME_XML = RES / "offload-planner.mime.xml"
GGUF_TYPE = "application/x-gguf"
SMI = "{http://www.freedesktop.org/standards/shared-mime-info}"


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
    assert f"{res}offload-planner.mime.xml" in names
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


# --- desktop integration: desktop entry, metainfo, MIME type -------------------------------------


def _desktop_entry() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(DESKTOP.read_text(encoding="utf-8"))
    return parser["Desktop Entry"]


def _mime_types() -> dict[str, ET.Element]:
    root = ET.parse(MIME_XML).getroot()
    assert root.tag == f"{SMI}mime-info"
    return {m.attrib["type"]: m for m in root.findall(f"{SMI}mime-type")}


def test_mime_package_defines_gguf_by_glob_and_magic() -> None:
    gguf = _mime_types()[GGUF_TYPE]
    assert [g.attrib["pattern"] for g in gguf.findall(f"{SMI}glob")] == ["*.gguf"]
    assert (gguf.findtext(f"{SMI}comment") or "").strip()
    matches = [m.attrib for magic in gguf.findall(f"{SMI}magic") for m in magic.findall(f"{SMI}match")]
    assert matches == [{"type": "string", "offset": "0", "value": "GGUF"}]
    for model in RES.glob("*.gguf"):  # the bundled models carry the magic
        assert model.read_bytes()[:4] == b"GGUF", model.name


def test_desktop_entry_and_metainfo_name_the_gguf_type() -> None:
    entry = _desktop_entry()
    listed = [t for t in entry["MimeType"].split(";") if t]
    assert GGUF_TYPE in listed
    assert set(listed) - {GGUF_TYPE} <= set(_mime_types()) | {"inode/directory"}
    assert "%f" in entry["Exec"].split() or "%F" in entry["Exec"].split()  # it takes the file opened
    ns = ET.parse(METAINFO).getroot()
    assert [m.text for m in ns.findall("provides/mediatype")] == [GGUF_TYPE]


@pytest.mark.parametrize(
    ("tool", "args", "path"),
    [
        ("desktop-file-validate", [], DESKTOP),
        ("appstreamcli", ["validate", "--no-net"], METAINFO),
    ],
)
def test_desktop_files_pass_the_freedesktop_validators(tool: str, args: list[str], path: Path) -> None:
    exe = shutil.which(tool)
    if exe is None:
        pytest.skip(f"{tool} is not installed")
    r = subprocess.run([exe, *args, str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    if tool == "desktop-file-validate":
        assert not r.stdout.strip(), r.stdout  # no warnings either


def test_update_mime_database_compiles_the_package_and_qt_detects_gguf(tmp_path: Path) -> None:
    exe = shutil.which("update-mime-database")
    if exe is None:
        pytest.skip("update-mime-database (shared-mime-info) is not installed")
    mime = tmp_path / "share" / "mime"
    (mime / "packages").mkdir(parents=True)
    shutil.copy2(MIME_XML, mime / "packages" / "offload-planner.xml")
    r = subprocess.run([exe, str(mime)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "error" not in r.stderr.lower(), r.stderr
    assert f"{GGUF_TYPE}:*.gguf" in (mime / "globs2").read_text()
    magic = (mime / "magic").read_bytes()
    assert f"[50:{GGUF_TYPE}]".encode() in magic and b"GGUF" in magic
    # Qt (QtCore only) with this database first: by content without the suffix, by suffix alone
    (tmp_path / "no-suffix").write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(24))
    (tmp_path / "text.gguf").write_text("not a model")
    (tmp_path / "plain").write_text("not a model")
    env = dict(os.environ, XDG_DATA_DIRS=f"{tmp_path / 'share'}:/usr/local/share:/usr/share")
    code = (
        "import sys; from PySide6.QtCore import QMimeDatabase; db = QMimeDatabase(); "
        "print(*(db.mimeTypeForFile(f).name() for f in sys.argv[1:]))"
    )
    files = [str(tmp_path / n) for n in ("no-suffix", "text.gguf", "plain")]
    r = subprocess.run([sys.executable, "-c", code, *files], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [GGUF_TYPE, GGUF_TYPE, "text/plain"]
