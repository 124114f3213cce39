"""The README's screenshots: every picture it shows from resources/screenshots/ is a committed PNG of
the size its caption states (no pixel comparison; `python packaging/screenshots.py` remakes them)."""

from __future__ import annotations

import re
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# ![alt](resources/screenshots/NAME.png) followed by a caption paragraph that states WIDTHxHEIGHT
IMAGE = re.compile(r"!\[[^\]]*\]\((resources/screenshots/[^)\s]+\.png)\)\s*\n\s*\n(.+?)(?:\n\s*\n|\Z)", re.S)
SIZE = re.compile(r"\b(\d{2,5})x(\d{2,5})\b")


def _readme_screenshots() -> list[tuple[str, tuple[int, int]]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = []
    for m in IMAGE.finditer(text):
        size = SIZE.search(m.group(2))
        assert size, f"{m.group(1)}: the caption under it does not state WIDTHxHEIGHT"
        found.append((m.group(1), (int(size.group(1)), int(size.group(2)))))
    return found


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert head[12:16] == b"IHDR", f"{path}: no IHDR chunk first"
    w, h = struct.unpack(">II", head[16:24])
    return w, h


def test_readme_shows_the_default_view_and_the_presets() -> None:
    names = {Path(p).name for p, _ in _readme_screenshots()}
    assert {"default.png", "presets.png"} <= names, names


def test_readme_screenshots_are_pngs_of_the_stated_size() -> None:
    shots = _readme_screenshots()
    assert shots
    for rel, stated in shots:
        path = ROOT / rel
        assert path.is_file(), f"README shows {rel}, which is missing"
        assert png_size(path) == stated, rel
