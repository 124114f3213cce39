"""Missing X11 libraries are named, with the apt line, before Qt can abort (issue 13, item 1)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from offload_planner.backend import qt_libs

ROOT = Path(__file__).resolve().parents[2]
X11 = {"DISPLAY": ":0"}


def test_a_fresh_debian_gets_the_libraries_and_the_apt_line() -> None:
    present = set(qt_libs.XCB_LIBRARIES) - {"libxcb-icccm.so.4", "libxcb-keysyms.so.1"}
    msg = qt_libs.check_xcb(X11, loadable=present.__contains__)
    assert msg is not None
    assert "libxcb-icccm.so.4, libxcb-keysyms.so.1" in msg
    assert "sudo apt-get install -y libxcb-icccm4 libxcb-keysyms1\n" in msg


def test_nothing_missing_or_not_xcb_says_nothing() -> None:
    assert qt_libs.check_xcb(X11, loadable=lambda _so: True) is None
    never = lambda _so: False  # noqa: E731
    assert qt_libs.check_xcb({"DISPLAY": ":0", "QT_QPA_PLATFORM": "offscreen"}, never) is None
    assert qt_libs.check_xcb({"DISPLAY": ":0", "WAYLAND_DISPLAY": "wayland-0"}, never) is None
    assert qt_libs.check_xcb({}, never) is None
    assert not qt_libs.platform_is_xcb(X11, platform="win32")


def test_the_gui_exits_2_with_the_message_instead_of_aborting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from offload_planner.ui.app import run_gui

    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.delenv("XDG_SESSION_TYPE", raising=False)
    monkeypatch.setenv("DISPLAY", ":99")
    monkeypatch.setattr(qt_libs, "can_load", lambda so: so != "libxcb-cursor.so.0")
    assert run_gui(None) == 2
    err = capsys.readouterr().err
    assert "libxcb-cursor.so.0" in err and "apt-get install -y libxcb-cursor0" in err


def _qxcb_files() -> list[Path]:
    import PySide6

    qt = Path(PySide6.__file__).parent / "Qt"
    return [qt / "plugins" / "platforms" / "libqxcb.so", *sorted((qt / "lib").glob("libQt6XcbQpa.so*"))]


def test_the_list_covers_every_x11_library_qts_plugin_links() -> None:
    """What ldd lists for libqxcb.so and libQt6XcbQpa: every X11/xkb/GL library is in the table."""
    if shutil.which("ldd") is None:
        pytest.fail("ldd is not installed")
    files = [f for f in _qxcb_files() if f.exists()]
    assert files, "PySide6 has no xcb plugin"
    linked: set[str] = set()
    x11 = re.compile(r"^\s*(lib(?:xcb|X11|xkbcommon)[-\w]*\.so\.\d+|libE?GL\.so\.\d+)", re.M)
    for f in files:
        out = subprocess.run(["ldd", str(f)], capture_output=True, text=True, check=False).stdout
        linked |= set(x11.findall(out))
    assert linked and linked <= set(qt_libs.XCB_LIBRARIES), linked - set(qt_libs.XCB_LIBRARIES)


def test_the_real_check_agrees_with_ldd() -> None:
    """Run the check in a fresh interpreter: what it cannot load is what ldd says is not found."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "gui")}
    r = subprocess.run([sys.executable, "-m", "offload_planner.backend.qt_libs"], capture_output=True,
                       text=True, env=env, timeout=60, check=True)
    plugin = _qxcb_files()[0]
    out = subprocess.run(["ldd", str(plugin)], capture_output=True, text=True, check=False).stdout
    not_found = {m for m in re.findall(r"^\s*(\S+) => not found", out, re.M) if m in qt_libs.XCB_LIBRARIES}
    assert set(r.stdout.split()) == not_found
