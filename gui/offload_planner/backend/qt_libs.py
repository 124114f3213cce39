"""The system libraries Qt's X11 platform plugin needs, checked before a QApplication exists.

PySide6's wheel brings Qt but not the X11 client libraries its xcb plugin (``libqxcb.so`` and
``libQt6XcbQpa.so.6``) links against. On a fresh Debian or Ubuntu some are missing
(``libxcb-icccm4``, ``libxcb-keysyms1``, ``libxcb-cursor0``) and Qt aborts with a message that
names only one of them. :func:`missing_libraries` tries to load each one the way the plugin would
(``dlopen`` by soname) and :func:`missing_message` says which are missing and the one ``apt-get``
line that installs them. ``python -m offload_planner.backend.qt_libs`` prints the missing sonames.

The list is what ``ldd`` shows for the two files in PySide6 6.11 (Qt's own libraries excluded).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable, Mapping

#: soname -> the Debian/Ubuntu package that provides it.
XCB_LIBRARIES: dict[str, str] = {
    "libxcb.so.1": "libxcb1",
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-util.so.1": "libxcb-util1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libX11.so.6": "libx11-6",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libGL.so.1": "libgl1",
    "libEGL.so.1": "libegl1",
    "libfontconfig.so.1": "libfontconfig1",
    "libfreetype.so.6": "libfreetype6",
    "libdbus-1.so.3": "libdbus-1-3",
}


def can_load(soname: str) -> bool:
    """Does the dynamic loader find ``soname`` (as Qt's plugin would, by its soname)?"""
    try:
        ctypes.CDLL(soname)
    except OSError:
        return False
    return True


def platform_is_xcb(env: Mapping[str, str], platform: str = sys.platform) -> bool:
    """Will Qt pick its xcb plugin: Linux, no ``QT_QPA_PLATFORM`` override, an X display and no
    Wayland session (Qt 6 prefers its Wayland plugin there)?"""
    if not platform.startswith("linux") or env.get("QT_QPA_PLATFORM"):
        return False
    wayland = bool(env.get("WAYLAND_DISPLAY")) or env.get("XDG_SESSION_TYPE") == "wayland"
    return bool(env.get("DISPLAY")) and not wayland


def missing_libraries(loadable: Callable[[str], bool] | None = None) -> list[str]:
    """The sonames of :data:`XCB_LIBRARIES` that cannot be loaded (default: :func:`can_load`)."""
    load = loadable or can_load
    return [so for so in XCB_LIBRARIES if not load(so)]


def missing_message(missing: list[str]) -> str:
    packages = " ".join(dict.fromkeys(XCB_LIBRARIES[so] for so in missing))
    return (
        f"Qt's X11 (xcb) platform plugin needs system libraries that are missing: {', '.join(missing)}.\n"
        f"Install them (Debian/Ubuntu): sudo apt-get install -y {packages}\n"
        "or run without X11: QT_QPA_PLATFORM=wayland, or `offload-planner plan` / `inspect` "
        "for text, or `gui --screenshot FILE.png`."
    )


def check_xcb(env: Mapping[str, str] | None = None,
              loadable: Callable[[str], bool] | None = None) -> str | None:
    """The message to print instead of letting Qt abort, or None when the window can open."""
    if not platform_is_xcb(os.environ if env is None else env):
        return None
    missing = missing_libraries(loadable)
    return missing_message(missing) if missing else None


if __name__ == "__main__":
    print("\n".join(missing_libraries()))
