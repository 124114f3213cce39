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


#: the largest file of the config folder read (its stores hold kilobytes): a larger one counts as damaged
MAX_FILE_BYTES = 16 << 20


def read_config_file(path: Path) -> tuple[bytes, str | None]:
    """The bytes of a file of the config folder and, when it is not one to read, why (its bytes are then
    not read): not a regular file (a FIFO there blocked every ``plan``, ``/dev/zero`` filled the memory)
    or larger than :data:`MAX_FILE_BYTES`.  OSError when it cannot be opened (it is not there)."""
    import stat

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return b"", "not a regular file"
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_FILE_BYTES:
            return b"", f"larger than {MAX_FILE_BYTES >> 20} MiB"
        return b"".join(chunks), None
    finally:
        os.close(fd)
