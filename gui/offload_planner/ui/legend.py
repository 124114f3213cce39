"""The tensor map's legend: each device's colour with its name, the moved mark, the not-movable hatch,
and the tints of a draft model's and a projector's rows when the map has them."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QHelpEvent, QPainter, QPaintEvent, QPalette, QPen, QPolygonF, QResizeEvent
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from offload_planner.ui.document import PlanDocument
from offload_planner.ui.palette import (
    MOVED_MARK_COLOR,
    SECTION_RULE_COLOR,
    device_color,
    hatch_brush,
    section_tint,
)
from offload_planner.ui.tensor_map_model import MOVED_MEANING, row_section

#: The legend's words for the map's extra sections (tensor_map_model.row_section).
SECTION_LABELS = {"draft": "draft model rows (-md)", "mmproj": "projector rows (--mmproj)"}
#: The hover text of the entries whose label is a single word.
ENTRY_TOOLTIPS = {
    "moved": MOVED_MEANING.capitalize(),
    # "not movable" alone said neither which tensors nor why
    "fixed": ("Hatched: tensors this command does not let you move, such as a NextN/MTP block, which "
              "llama.cpp loads only with --spec-type draft-mtp; hover one for its reason"),
}


class LegendBar(QWidget):
    def __init__(self, doc: PlanDocument, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._doc = doc
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        for signal in (doc.planChanged, doc.layoutChanged, doc.modelChanged):
            signal.connect(self._refit)  # devices or sections come and go

    def sizeHint(self) -> QSize:
        return QSize(400, self._height_for(self.width() or 400))

    def _height_for(self, width: int) -> int:
        boxes = self.layout_entries(width)
        lines = 1 + max((int(b.top() // self._line()) for _k, _l, b in boxes), default=0)
        return lines * self._line() + 6

    def _line(self) -> int:
        return self.fontMetrics().height() + 2

    def _refit(self) -> None:
        """One line of entries per line of the legend: as tall as the entries wrapped to its width."""
        h = self._height_for(self.width())
        if h != self.height():
            self.setFixedHeight(h)
        self.update()

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._refit()

    def layout_entries(self, width: int) -> list[tuple[str, str, QRectF]]:
        """Each entry with the rect of its swatch and label, wrapped to ``width`` pixels."""
        fm = self.fontMetrics()
        sw = fm.height() - 4
        out = []
        x, y = 2.0, 3.0
        for kind, label in self.entries():
            w = sw * 1.6 + 4 + fm.horizontalAdvance(label) + 2
            if x > 2.0 and x + w > width:
                x, y = 2.0, y + self._line()
            out.append((kind, label, QRectF(x, y, w, fm.height())))
            x += w + 12
        return out

    def entries(self) -> list[tuple[str, str]]:
        """(kind, label) in order: "device", "moved", "fixed", "section:<draft|mmproj>"."""
        names = self._doc.device_names()
        grid = self._doc.grid
        sections = dict.fromkeys(row_section(r) for r in grid.rows) if grid is not None else {}
        return ([("device", n) for n in names] + [("moved", "moved"), ("fixed", "not movable")]
                + [(f"section:{k}", SECTION_LABELS[k]) for k in sections if k in SECTION_LABELS])

    def tooltip_at(self, pos: QPointF) -> str:
        """What the entry under ``pos`` means, where its label alone does not say it ("" elsewhere)."""
        for kind, _label, r in self.layout_entries(self.width()):
            if r.contains(pos):
                return ENTRY_TOOLTIPS.get(kind, "")
        return ""

    def event(self, e: QEvent) -> bool:
        if e.type() == QEvent.Type.ToolTip and isinstance(e, QHelpEvent):
            tip = self.tooltip_at(QPointF(e.pos()))
            if tip:
                QToolTip.showText(e.globalPos(), tip, self)
            else:
                QToolTip.hideText()
                e.ignore()
            return True
        return super().event(e)

    def paintEvent(self, event: QPaintEvent) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        fm = self.fontMetrics()
        h = fm.height()
        sw = h - 4
        devices = self._doc.plan.devices if self._doc.has_plan else None
        text = self.palette().color(QPalette.ColorRole.Text)
        for kind, label, r in self.layout_entries(self.width()):
            box = QRectF(r.left(), r.top() + 2, sw * 1.6, sw)
            if kind == "device":
                p.fillRect(box, device_color(devices, label))
            elif kind == "moved":
                p.fillRect(box, self.palette().color(QPalette.ColorRole.AlternateBase))
                tr = QPointF(box.right(), box.top())
                p.setPen(QPen(QColor("#FFFFFF"), 1))
                p.setBrush(MOVED_MARK_COLOR)
                p.drawPolygon(
                    QPolygonF([tr, QPointF(tr.x() - sw * 0.8, tr.y()), QPointF(tr.x(), tr.y() + sw * 0.8)])
                )
            elif kind.startswith("section:"):
                p.fillRect(box, section_tint(kind.removeprefix("section:")))
                p.setPen(QPen(QColor("#B0B0B0"), 1))
                p.setBrush(Qt.BrushStyle.NoBrush)
                p.drawRect(box.adjusted(0.5, 0.5, -0.5, -0.5))
                p.fillRect(QRectF(box.left(), box.top(), box.width(), 2), SECTION_RULE_COLOR)
            else:
                p.fillRect(box, QColor("#999999"))
                p.fillRect(box, hatch_brush(QColor(255, 255, 255, 200)))
            p.setPen(text)
            p.drawText(QRectF(box.right() + 4, r.top(), r.right() - box.right() - 4 + 2, h),
                       Qt.AlignmentFlag.AlignVCenter, label)
