"""Render the app icon's PNG sizes and the Windows .ico from resources/icons/offload-planner.svg.

    python packaging/render_icons.py

Uses Qt's own SVG renderer (PySide6.QtSvg, part of PySide6-Essentials), so nothing else is needed.
Writes resources/icons/offload-planner-{16,24,32,48,64,128,256,512}.png and offload-planner.ico
(16..256, PNG-compressed entries, which every Windows since Vista reads).
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ICONS = ROOT / "resources" / "icons"
SVG = ICONS / "offload-planner.svg"
SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)


def render_png(size: int, out: Path) -> None:
    from PySide6.QtCore import QByteArray, QRectF, Qt
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    renderer = QSvgRenderer(QByteArray(SVG.read_bytes()))
    if not renderer.isValid():
        raise SystemExit(f"{SVG}: not a valid SVG")
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter, QRectF(0, 0, size, size))
    painter.end()
    if not image.save(str(out)):  # format from the .png suffix
        raise SystemExit(f"cannot write {out}")


def write_ico(pngs: dict[int, bytes], out: Path) -> None:
    """An ICO whose entries are PNG streams (ICONDIR + ICONDIRENTRY per size, then the PNGs)."""
    header = struct.pack("<HHH", 0, 1, len(pngs))
    offset = len(header) + 16 * len(pngs)
    entries, blobs = b"", b""
    for size, data in sorted(pngs.items()):
        dim = 0 if size >= 256 else size  # 0 means 256 in ICONDIRENTRY
        entries += struct.pack("<BBBBHHII", dim, dim, 0, 0, 1, 32, len(data), offset)
        blobs += data
        offset += len(data)
    out.write_bytes(header + entries + blobs)


def main() -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtGui import QGuiApplication

    _app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    pngs: dict[int, bytes] = {}
    for size in SIZES:
        out = ICONS / f"offload-planner-{size}.png"
        render_png(size, out)
        pngs[size] = out.read_bytes()
        print(f"{out.relative_to(ROOT)}: {size}x{size}, {len(pngs[size])} bytes")
    ico = ICONS / "offload-planner.ico"
    write_ico({s: pngs[s] for s in ICO_SIZES}, ico)
    print(f"{ico.relative_to(ROOT)}: {len(ICO_SIZES)} sizes, {ico.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
