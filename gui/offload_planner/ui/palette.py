"""Device colours (Okabe-Ito, colour-blind safe) and the shared brushes of the map and memory bars.

Colour is never the only cue: every view also names the device (legend, tooltips, labels).
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor

from offload_planner.core.devices import DeviceSet

CPU_COLOR = QColor("#999999")
GPU_COLORS: tuple[QColor, ...] = tuple(
    QColor(c)
    for c in ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
)
NOT_LOADED_COLOR = QColor("#E4E4E4")
OVER_COLOR = QColor("#D00000")
MOVED_MARK_COLOR = QColor("#111111")
ACTUAL_COLOR = QColor("#5E2CA5")  # the actual total a launch logged (memory view)


def device_color(devices: DeviceSet | None, name: str | None) -> QColor:
    if name is None:
        return NOT_LOADED_COLOR
    if devices is None or name.upper() == "CPU":
        return CPU_COLOR
    for i, g in enumerate(devices.gpus):
        if g.name.lower() == name.lower():
            return GPU_COLORS[i % len(GPU_COLORS)]
    return QColor("#7F7F7F")


def text_color_on(bg: QColor) -> QColor:
    """Black or white, whichever reads better on ``bg``."""
    lum = 0.2126 * bg.redF() + 0.7152 * bg.greenF() + 0.0722 * bg.blueF()
    return QColor("#000000") if lum > 0.5 else QColor("#FFFFFF")


def kind_brush(base: QColor, kind: str) -> QBrush:
    """Buffer kinds on one device: weights solid, KV dense dots, compute diagonal, output cross."""
    if kind == "model":
        return QBrush(base)
    if kind == "kv":
        return QBrush(base.lighter(135))
    if kind == "compute":
        return QBrush(base.lighter(165))
    if kind == "mmproj":
        return QBrush(base.darker(140))
    return QBrush(base.lighter(190))


def hatch_brush(color: QColor, style: Qt.BrushStyle = Qt.BrushStyle.BDiagPattern) -> QBrush:
    return QBrush(color, style)
