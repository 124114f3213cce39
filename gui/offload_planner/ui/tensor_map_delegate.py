"""Paints one tensor-map cell: a bar as wide as the cell's bytes relative to its column's largest
cell, coloured by device (split when the cell's tensors are on several devices), hatched when not
movable, with a corner mark when the user moved it."""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPalette, QPen, QPolygonF
from PySide6.QtWidgets import QStyle, QStyledItemDelegate, QStyleOptionViewItem, QWidget

from offload_planner.core.tensor_grid import Cell
from offload_planner.ui.document import PlanDocument
from offload_planner.ui.palette import (
    MOVED_MARK_COLOR,
    SECTION_RULE_COLOR,
    device_color,
    hatch_brush,
    section_tint,
)
from offload_planner.ui.tensor_map_model import CELL_ROLE, FRACTION_ROLE, SECTION_ROLE, SECTION_START_ROLE

_Index = QModelIndex | QPersistentModelIndex


class TensorCellDelegate(QStyledItemDelegate):
    def __init__(self, doc: PlanDocument, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._doc = doc

    def sizeHint(self, option: QStyleOptionViewItem, index: _Index) -> QSize:
        h = option.fontMetrics.height()
        return QSize(4 * h, h + 2)

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: _Index) -> None:
        cell = index.data(CELL_ROLE)
        rect = QRectF(option.rect)
        pal: QPalette = option.palette
        state = option.state
        selected = bool(state & QStyle.StateFlag.State_Selected)
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, False)
        section = index.data(SECTION_ROLE)
        if section:  # a draft model's or a projector's row: its own tint
            tint = section_tint(str(section))
            painter.fillRect(rect, tint.darker(104) if index.row() % 2 else tint)
        elif index.row() % 2:
            painter.fillRect(rect, pal.color(QPalette.ColorRole.AlternateBase))
        if selected:
            hl = QColor(pal.color(QPalette.ColorRole.Highlight))
            hl.setAlpha(90)
            painter.fillRect(rect, hl)
        if isinstance(cell, Cell) and cell.items:
            self._paint_bar(painter, rect, cell, float(index.data(FRACTION_ROLE) or 0.0))
        if index.data(SECTION_START_ROLE):  # a rule between the main model and the section below it
            painter.fillRect(QRectF(rect.left(), rect.top(), rect.width(), 2), SECTION_RULE_COLOR)
        if selected:
            painter.setPen(QPen(pal.color(QPalette.ColorRole.Highlight), 1.0))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRect(rect.adjusted(0.5, 0.5, -0.5, -0.5))
        painter.restore()

    def _paint_bar(self, painter: QPainter, rect: QRectF, cell: Cell, fraction: float) -> None:
        devices = self._doc.plan.devices if self._doc.has_plan else None
        bar = rect.adjusted(3, 2, -3, -2)
        width = max(3.0, bar.width() * min(1.0, fraction))
        x = bar.left()
        total = cell.nbytes or 1
        segments = cell.device_bytes
        for i, (dev, nbytes) in enumerate(segments):
            w = bar.left() + width - x if i == len(segments) - 1 else width * nbytes / total
            painter.fillRect(QRectF(x, bar.top(), w, bar.height()), device_color(devices, dev))
            x += w
        filled = QRectF(bar.left(), bar.top(), width, bar.height())
        if not cell.movable:
            painter.fillRect(filled, hatch_brush(QColor(255, 255, 255, 200)))
            painter.setPen(QPen(QColor(90, 90, 90), 1.0))
            painter.drawRect(filled.adjusted(0.5, 0.5, -0.5, -0.5))
        if cell.moved:
            s = min(rect.height() * 0.7, 9.0)
            tr = QPointF(rect.right() - 1, rect.top() + 1)
            tri = QPolygonF([tr, QPointF(tr.x() - s, tr.y()), QPointF(tr.x(), tr.y() + s)])
            painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
            painter.setPen(QPen(QColor("#FFFFFF"), 1.0))
            painter.setBrush(MOVED_MARK_COLOR)
            painter.drawPolygon(tri)
