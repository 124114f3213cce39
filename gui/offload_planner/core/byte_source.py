"""Where GGUF bytes come from: a local file, or a URL read with HTTP Range requests.

The reader asks a source for byte ranges of the header only; it never reads tensor data.
"""

from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path
from typing import Protocol

from offload_planner.core.errors import GGUFError


class ByteSource(Protocol):
    """Random access to the bytes of one file."""

    @property
    def name(self) -> str:
        """Path or URL, used in messages."""
        ...

    @property
    def size(self) -> int:
        """Total size of the file in bytes."""
        ...

    def read(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes from ``offset``; fewer only at the end of the file."""
        ...

    def close(self) -> None: ...


_NOT_REGULAR = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _check_regular(path: str, mode: int) -> None:
    """Refuse what is not a regular file before reading it: a FIFO would block forever, a
    directory cannot be mapped."""
    if stat.S_ISREG(mode):
        return
    what = next((name for test, name in _NOT_REGULAR if test(mode)), "not a regular file")
    raise GGUFError(path, f"is {what}, not a GGUF file" + (_ggufs_in(path) if stat.S_ISDIR(mode) else ""))


def _ggufs_in(folder: str, at_most: int = 200) -> str:
    """The model files a folder holds (a download folder named instead of its file): ": name one of
    its .gguf files, e.g. FOLDER/x-00001-of-00003.gguf (3 files)", the first part of a split model
    first; "" when there is none or the folder cannot be listed. At most ``at_most`` entries are
    looked at (a huge folder is not walked)."""
    try:
        with os.scandir(folder) as it:
            names = [e.name for _, e in zip(range(at_most), it, strict=False)
                     if e.name.lower().endswith(".gguf") and e.is_file()]
    except OSError:
        return ""
    if not names:
        return ""
    names.sort(key=lambda n: ("-00001-of-" not in n, "mmproj" in n.lower(), n))
    more = f" ({len(names)} .gguf files)" if len(names) > 1 else ""
    return f": name one of its .gguf files, e.g. {os.path.join(folder, names[0])}{more}"


class FileSource:
    """A local file; memory-mapped so that reading the header copies nothing more than needed."""

    def __init__(self, path: str | Path) -> None:
        self._path = str(path)
        try:
            _check_regular(self._path, os.stat(self._path).st_mode)
            # O_NONBLOCK: a FIFO swapped in after the check opens at once instead of blocking.
            fd = os.open(self._path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except OSError as e:
            raise GGUFError(self._path, f"cannot open: {e.strerror or e}") from None
        try:
            st = os.fstat(fd)
            _check_regular(self._path, st.st_mode)
            self._size = st.st_size
            self._map: mmap.mmap | None = (
                mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if self._size else None
            )
        except (OSError, ValueError) as e:
            raise GGUFError(self._path, f"cannot map: {e}") from None
        finally:
            os.close(fd)

    @property
    def name(self) -> str:
        return self._path

    @property
    def size(self) -> int:
        return self._size

    def read(self, offset: int, n: int) -> bytes:
        if self._map is None or offset >= self._size:
            return b""
        return self._map[offset : offset + n]

    def buffer(self) -> mmap.mmap | bytes:
        """The whole file as a buffer (no copy)."""
        return self._map if self._map is not None else b""

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

    def __enter__(self) -> FileSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def is_url(s: str) -> bool:
    return s.startswith(("http://", "https://"))
