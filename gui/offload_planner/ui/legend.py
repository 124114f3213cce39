"""The tensor map's legend: each device's colour with its name, the moved mark, the not-movable hatch."""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QPalette, QPen, QPolygonF
from PySide6.QtWidgets import QSizePolicy, QWidget

from offload_planner.ui.document import PlanDocument
from offload_planner.ui.palette import MOVED_MARK_COLOR, device_color, hatch_brush


class LegendBar(QWidget):
    def __init__(self, doc: PlanDocument, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._doc = doc
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        doc.planChanged.connect(self.update)

    def sizeHint(self) -> QSize:
        return QSize(400, self.fontMetrics().height() + 6)

    def _entries(self) -> list[tuple[str, str]]:
        names = self._doc.device_names()
        return [("device", n) for n in names] + [("moved", "moved by you"), ("fixed", "not movable")]

    def paintEvent(self, event: QPaintEvent) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        fm = self.fontMetrics()
        h = fm.height()
        sw = h - 4
        x = 2.0
        y = (self.height() - h) / 2
        devices = self._doc.plan.devices if self._doc.has_plan else None
        text = self.palette().color(QPalette.ColorRole.Text)
        for kind, label in self._entries():
            box = QRectF(x, y + 2, sw * 1.6, sw)
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
            else:
                p.fillRect(box, QColor("#999999"))
                p.fillRect(box, hatch_brush(QColor(255, 255, 255, 200)))
            p.setPen(text)
            w = fm.horizontalAdvance(label)
            p.drawText(QRectF(box.right() + 4, y, w + 2, h), Qt.AlignmentFlag.AlignVCenter, label)
            x = box.right() + 4 + w + 14
