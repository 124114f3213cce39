"""The tensor map's column header: when a role's column is narrower than its label (a small window
squeezes the map to fit its width), the header shows a shorter form of the label ("exp down" →
"down", "embd/out" → "embd"), elided only as a last resort; the tooltip keeps the full name."""

from __future__ import annotations

from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QFontMetrics, QPainter
from PySide6.QtWidgets import QHeaderView, QStyle, QStyleOptionHeader, QWidget

#: Shorter forms of the role labels, tried in order when the full label does not fit.
_SHORT_FORMS: dict[str, tuple[str, ...]] = {
    "embd/out": ("embd",),
    "exp gate+up": ("gate+up", "g+up"),
    "exp up": ("up",),
    "exp gate": ("gate",),
    "exp down": ("down",),
    "router": ("rout",),
    "shared": ("shexp", "shx"),
    "norms": ("norm",),
}


def label_forms(label: str) -> tuple[str, ...]:
    """``label`` and its shorter forms, longest first."""
    return (label, *_SHORT_FORMS.get(label, ()))


def shortest_form(label: str) -> str:
    return label_forms(label)[-1]


def fitted_label(label: str, width: int, fm: QFontMetrics) -> str:
    """The longest form of ``label`` whose text fits in ``width`` pixels, else its shortest form
    elided."""
    forms = label_forms(label)
    for form in forms:
        if fm.horizontalAdvance(form) <= width:
            return form
    return fm.elidedText(forms[-1], Qt.TextElideMode.ElideRight, max(0, width))


class RoleHeader(QHeaderView):
    """A horizontal header painting each section's label in the form that fits its width."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(Qt.Orientation.Horizontal, parent)

    def text_room(self, width: int) -> int:
        """The pixels a section ``width`` wide has for its label (the style's margins taken off)."""
        margin = self.style().pixelMetric(QStyle.PixelMetric.PM_HeaderMargin, None, self)
        return width - 2 * margin

    def shown_label(self, logical: int) -> str:
        """The text the header shows for section ``logical`` at its current width."""
        label = self.model().headerData(logical, self.orientation()) if self.model() else None
        if label is None:
            return ""
        return fitted_label(str(label), self.text_room(self.sectionSize(logical)), self.fontMetrics())

    def paintSection(self, painter: QPainter, rect: QRect, logicalIndex: int) -> None:
        if not rect.isValid():
            return
        opt = QStyleOptionHeader()
        self.initStyleOption(opt)
        self.initStyleOptionForIndex(opt, logicalIndex)
        opt.rect = rect
        opt.text = fitted_label(opt.text, self.text_room(rect.width()), self.fontMetrics())
        self.style().drawControl(QStyle.ControlElement.CE_Header, opt, painter, self)
