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
#: The tensor map's rows of a draft model and of a multimodal projector: a tint behind them and a
#: rule above their first row set them apart from the main model's rows.
SECTION_TINTS = {"draft": QColor("#E3EEF9"), "mmproj": QColor("#F4E6F0")}
SECTION_RULE_COLOR = QColor("#505050")


def section_tint(section: str) -> QColor:
    return SECTION_TINTS.get(section, QColor("#EEEEEE"))


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


def _luminance(c: QColor) -> float:
    """WCAG relative luminance."""
    def lin(v: float) -> float:
        return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4

    return 0.2126 * lin(c.redF()) + 0.7152 * lin(c.greenF()) + 0.0722 * lin(c.blueF())


def contrast(a: QColor, b: QColor) -> float:
    """WCAG contrast ratio of two colours (1 to 21)."""
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


#: WCAG AA for normal text
READABLE = 4.5


def readable(color: QColor, background: QColor) -> QColor:
    """``color`` as it is where it reads on ``background`` (contrast :data:`READABLE`), else mixed
    towards white on a dark background (black on a light one) until it does: the window's red and
    amber texts were chosen for a light palette, and on a dark one (#B00000 on #1E1E1E: 2.3) they
    hardly read."""
    if contrast(color, background) >= READABLE:
        return color
    end = 1.0 if _luminance(background) < 0.18 else 0.0
    out = QColor(color)
    for step in range(1, 11):
        t = step / 10
        out = QColor.fromRgbF(*(c + (end - c) * t for c in (color.redF(), color.greenF(), color.blueF())))
        if contrast(out, background) >= READABLE:
            break
    return out


def css_color(color: QColor) -> str:
    """A style sheet's ``color:`` for ``color``."""
    return f"color: {color.name()}"


def kind_brush(base: QColor, kind: str) -> QBrush:
    """Buffer kinds on one device: weights solid, KV dense dots, compute diagonal, output cross."""
    if kind == "model":
        return QBrush(base)
    if kind == "kv":
        return QBrush(base.lighter(135))
    if kind == "rs":  # a hybrid model's recurrent state, next to its KV cache
        return QBrush(base.lighter(150))
    if kind == "compute":
        return QBrush(base.lighter(165))
    if kind == "mmproj":
        return QBrush(base.darker(140))
    if kind in ("draft", "mtp"):  # an extra context: the device colour, darker, with kind_overlay
        return QBrush(base.darker(125))
    return QBrush(base.lighter(190))


#: What sets an extra context's segment apart from the main model's kinds: white dots on the draft
#: model, white vertical stripes on the MTP context.
_OVERLAYS = {"draft": Qt.BrushStyle.Dense6Pattern, "mtp": Qt.BrushStyle.VerPattern}


def kind_overlay(kind: str) -> QBrush | None:
    """The pattern drawn over :func:`kind_brush` for ``kind`` (None: solid)."""
    style = _OVERLAYS.get(kind)
    return None if style is None else QBrush(QColor(255, 255, 255, 190), style)


def hatch_brush(color: QColor, style: Qt.BrushStyle = Qt.BrushStyle.BDiagPattern) -> QBrush:
    return QBrush(color, style)
