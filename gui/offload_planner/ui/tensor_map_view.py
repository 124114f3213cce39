"""The tensor map: a table view with selection by click, shift/ctrl, sweep, row header (a whole layer)
and column header (a role in every layer); moves by dragging the selection onto a device (device
panel or memory bars), by keys (0 = CPU, 1..9 = the n-th GPU) and from the context menu.

A drag of many tensors is one undo step, pushed on release.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import (
    QEvent,
    QItemSelection,
    QItemSelectionModel,
    QModelIndex,
    QObject,
    QPoint,
    Qt,
    Signal,
)
from PySide6.QtGui import QContextMenuEvent, QCursor, QKeyEvent, QMouseEvent, QResizeEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QHeaderView,
    QMenu,
    QTableView,
    QToolTip,
    QWidget,
)

from offload_planner.ui.document import PlanDocument
from offload_planner.ui.drop_target import DeviceDropTarget, drop_target_at
from offload_planner.ui.role_header import RoleHeader, shortest_form
from offload_planner.ui.tensor_map_delegate import TensorCellDelegate
from offload_planner.ui.tensor_map_model import TensorMapModel


@dataclass
class _Drag:
    press: QPoint
    index: QModelIndex
    names: list[str]
    started: bool = False
    target: DeviceDropTarget | None = None
    device: str | None = None


def squeezed_widths(need: list[int], least: list[int], room: int) -> list[int]:
    """Column widths filling ``room``: with room to spare every column gets its ``need`` and a
    share of the rest; short of room the widest columns shrink first (all above a common cap are cut
    to it), none below its ``least`` (the sum then exceeds ``room``)."""
    n = len(need)
    spare = room - sum(need)
    if spare >= 0:
        return [w + spare * (c + 1) // n - spare * c // n for c, w in enumerate(need)]
    if sum(least) >= room:
        return list(least)
    lo, hi = 0, max(need)  # the largest cap whose widths still fit
    while lo < hi:
        cap = (lo + hi + 1) // 2
        if sum(max(lo_c, min(w, cap)) for w, lo_c in zip(need, least, strict=True)) <= room:
            lo = cap
        else:
            hi = cap - 1
    widths = [max(lo_c, min(w, lo)) for w, lo_c in zip(need, least, strict=True)]
    left = room - sum(widths)  # < one pixel per capped column: hand it out
    for c in range(n):
        if left <= 0:
            break
        if widths[c] < need[c]:
            widths[c] += 1
            left -= 1
    return widths


class TensorMapView(QTableView):
    #: Emitted with a short message for the status bar.
    message = Signal(str)

    def __init__(self, doc: PlanDocument, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._doc = doc
        self._model = TensorMapModel(doc)
        self.setModel(self._model)
        self.setItemDelegate(TensorCellDelegate(doc, self))
        self.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectItems)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setShowGrid(False)
        self.setWordWrap(False)
        self.setMouseTracking(True)
        self.setCornerButtonEnabled(True)
        self.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.setAccessibleName("Tensor map")
        fm = self.fontMetrics()
        vh = self.verticalHeader()
        vh.setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        vh.setDefaultSectionSize(fm.height() + 3)
        vh.setMinimumSectionSize(fm.height())
        vh.setMinimumWidth(fm.horizontalAdvance("0000"))
        vh.setDefaultAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        hh = RoleHeader(self)
        self.setHorizontalHeader(hh)
        hh.setSectionResizeMode(QHeaderView.ResizeMode.Fixed)  # see _fit_sections
        hh.setMinimumSectionSize(1)  # _fit_sections keeps each column at least column_floor() wide
        hh.setHighlightSections(True)
        self._drag: _Drag | None = None
        self.drag_tip = ""  # the tooltip of the drag in progress
        for header in (hh, vh):  # press and drag a layer number or role header: move it all
            header.viewport().installEventFilter(self)
        self._fit_sections()
        self._model.modelReset.connect(self._fit_sections)

    def _column_needs(self) -> tuple[list[int], list[int]]:
        """Per column: the width for its whole label, and the width it may shrink to (its shortest
        label form, not below :meth:`column_floor`)."""
        hh = self.horizontalHeader()
        fm = hh.fontMetrics()
        h = Qt.Orientation.Horizontal
        pad = fm.horizontalAdvance("  ")
        labels = [str(self._model.headerData(c, h)) for c in range(self._model.columnCount())]
        floor = self.column_floor()
        need = [fm.horizontalAdvance(t) + pad for t in labels]
        least = [min(n, max(floor, fm.horizontalAdvance(shortest_form(t)) + pad))
                 for t, n in zip(labels, need, strict=True)]
        return need, least

    def column_floor(self) -> int:
        """The narrowest a role column gets when the map is squeezed (below it, it scrolls)."""
        return self.horizontalHeader().fontMetrics().horizontalAdvance("0000")

    def full_width(self) -> int:
        """The view's width with every column at its whole label (the map's comfortable width)."""
        need, _ = self._column_needs()
        return (sum(need) + self.verticalHeader().sizeHint().width()
                + self.verticalScrollBar().sizeHint().width() + 2 * self.frameWidth())

    def _fit_sections(self) -> None:
        """Columns share the width, none narrower than its label; in a narrow map (a small window)
        the widest columns give way first, down to their short labels (:mod:`role_header`) and no
        narrower than :meth:`column_floor`: only then (many columns, split attention) does the map
        scroll sideways."""
        need, least = self._column_needs()
        if not need:
            return
        widths = squeezed_widths(need, least, self.viewport().width())
        hh = self.horizontalHeader()
        for c, w in enumerate(widths):
            hh.resizeSection(c, w)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_sections()

    @property
    def tensor_model(self) -> TensorMapModel:
        return self._model

    # --- selection ---------------------------------------------------------------------------

    def selected_positions(self) -> list[tuple[int, int]]:
        return sorted((i.row(), i.column()) for i in self.selectionModel().selectedIndexes())

    def selected_names(self) -> list[str]:
        grid = self._model.grid
        return grid.names(self.selected_positions()) if grid is not None else []

    def select_cells(
        self,
        positions: list[tuple[int, int]],
        flags: QItemSelectionModel.SelectionFlag = QItemSelectionModel.SelectionFlag.ClearAndSelect,
    ) -> None:
        sel = QItemSelection()
        for r, c in positions:
            idx = self._model.index(r, c)
            if self._model.flags(idx) & Qt.ItemFlag.ItemIsSelectable:
                sel.select(idx, idx)
        self.selectionModel().select(sel, flags)

    def select_same_roles(self) -> None:
        """Select the roles (columns) of the selection in every layer."""
        cols = {c for _, c in self.selected_positions()}
        self.select_cells([(r, c) for c in cols for r in range(self._model.rowCount())])

    def select_whole_layers(self) -> None:
        rows = {r for r, _ in self.selected_positions()}
        self.select_cells([(r, c) for r in rows for c in range(self._model.columnCount())])

    def select_layers_below(self) -> None:
        pos = self.selected_positions()
        if not pos:
            return
        first = min(r for r, _ in pos)
        cols = {c for _, c in pos}
        self.select_cells([(r, c) for r in range(first, self._model.rowCount()) for c in cols])

    # --- moves -------------------------------------------------------------------------------

    def move_selection(self, device: str | None) -> bool:
        names = self.selected_names()
        if not names:
            self.message.emit("Nothing movable is selected")
            return False
        moved = self._doc.move(names, device)
        if not moved:
            self.message.emit(f"The selection is already on {device or 'its default device'}")
        else:  # a key (0-9, Del) moved it with no other sign than the map's colours
            self.message.emit(f"{self._doc.undo_stack.undoText()} (Edit ▸ Undo takes it back)")
        return moved

    def _mover(self, device: str | None) -> Callable[[], None]:
        def run() -> None:
            self.move_selection(device)

        return run

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if self._drag is not None and event.key() == Qt.Key.Key_Escape:
            self._end_drag(drop=False)
            return
        key = event.key()
        mods = event.modifiers() & ~Qt.KeyboardModifier.KeypadModifier
        if (
            Qt.Key.Key_0 <= key <= Qt.Key.Key_9
            and mods == Qt.KeyboardModifier.NoModifier
            and self._doc.has_plan
        ):
            n = key - Qt.Key.Key_0
            device = self._doc.gpu_name(n - 1)
            if device is None:
                self.message.emit(f"There is no GPU {n}: add one in Devices")
            else:
                self.move_selection(device)
            return
        if key in (Qt.Key.Key_Delete, Qt.Key.Key_Backspace) and self._doc.has_plan:
            self.move_selection(None)
            return
        super().keyPressEvent(event)

    def contextMenuEvent(self, event: QContextMenuEvent) -> None:
        if not self._doc.has_plan:
            return
        idx = self.indexAt(event.pos())
        if idx.isValid() and not self.selectionModel().isSelected(idx):
            self.select_cells([(idx.row(), idx.column())])
        menu = QMenu(self)
        names = self.selected_names()
        move = menu.addMenu("Move to")
        move.setEnabled(bool(names))
        for i, dev in enumerate(self._doc.device_names()):
            key = "0" if dev == "CPU" else str(i + 1) if i < 9 else ""
            act = move.addAction(f"{dev}\t{key}")
            act.triggered.connect(self._mover(dev))
        back = menu.addAction("Back to the command's default\tDel")
        back.setEnabled(any(n in self._doc.plan.moves for n in names))
        back.triggered.connect(lambda: self.move_selection(None))
        menu.addSeparator()
        menu.addAction("Select same role in all layers", self.select_same_roles)
        menu.addAction("Select whole layers", self.select_whole_layers)
        menu.addAction("Select layers below", self.select_layers_below)
        menu.exec(event.globalPos())

    # --- dragging the selection onto a device ------------------------------------------------

    def mousePressEvent(self, event: QMouseEvent) -> None:
        idx = self.indexAt(event.position().toPoint())
        if (
            event.button() == Qt.MouseButton.LeftButton
            and idx.isValid()
            and event.modifiers() == Qt.KeyboardModifier.NoModifier
            and self.selectionModel().isSelected(idx)
            and self.selected_names()
        ):
            self._drag = _Drag(event.position().toPoint(), QModelIndex(idx), self.selected_names())
            event.accept()
            return
        super().mousePressEvent(event)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        d = self._drag
        if d is None:
            super().mouseMoveEvent(event)
            return
        pos = event.position().toPoint()
        if not d.started and (pos - d.press).manhattanLength() < QApplication.startDragDistance():
            return
        d.started = True
        self._update_drop(event.globalPosition().toPoint())

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:
        d = self._drag
        if d is None:
            super().mouseReleaseEvent(event)
            return
        if d.started:
            self._update_drop(event.globalPosition().toPoint())
            self._end_drag(drop=True)
        else:
            self._drag = None
            self.selectionModel().setCurrentIndex(d.index, QItemSelectionModel.SelectionFlag.ClearAndSelect)
        event.accept()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        """A header section (a layer number or a role) pressed and dragged moves what it selects,
        as a drag from a selected cell does; a click still selects it."""
        header = watched.parent() if isinstance(watched, QWidget) else None
        if not isinstance(header, QHeaderView) or not isinstance(event, QMouseEvent):
            return super().eventFilter(watched, event)
        t = event.type()
        pos = event.position().toPoint()
        if (t == QEvent.Type.MouseButtonPress and event.button() == Qt.MouseButton.LeftButton
                and event.modifiers() == Qt.KeyboardModifier.NoModifier and self._doc.has_plan):
            section = header.logicalIndexAt(pos)
            if section < 0:
                return False
            cells = self._section_cells(header, section)
            if not set(cells) <= set(self.selected_positions()):
                self.select_cells(cells)
            names = self.selected_names()
            if names:
                self._drag = _Drag(pos, self._model.index(*cells[0]) if cells else QModelIndex(), names)
            return True
        if self._drag is None:
            return False
        if t == QEvent.Type.MouseMove:
            if self._drag.started or (pos - self._drag.press).manhattanLength() >= \
                    QApplication.startDragDistance():
                self._drag.started = True
                self._update_drop(event.globalPosition().toPoint())
            return True
        if t == QEvent.Type.MouseButtonRelease:
            if self._drag.started:
                self._update_drop(event.globalPosition().toPoint())
                self._end_drag(drop=True)
            else:
                self._drag = None
            return True
        return False

    def _section_cells(self, header: QHeaderView, section: int) -> list[tuple[int, int]]:
        if header.orientation() == Qt.Orientation.Horizontal:
            return [(r, section) for r in range(self._model.rowCount())]
        return [(section, c) for c in range(self._model.columnCount())]

    def _update_drop(self, global_pos: QPoint) -> None:
        d = self._drag
        assert d is not None
        hit = drop_target_at(self.window(), global_pos)
        target, device = hit if hit is not None else (None, None)
        if d.target is not None and d.target is not target:
            d.target.set_drop_highlight(None)
        d.target, d.device = target, device
        doc = self._doc
        if target is not None:
            target.set_drop_highlight(device)
            self.viewport().setCursor(QCursor(Qt.CursorShape.DragMoveCursor))
            moving = list(doc.moves_for(d.names, device))  # what would actually change
            self.drag_tip = (f"Move {doc.describe_tensors(moving)} to <b>{device}</b>" if moving
                             else f"Already on <b>{device}</b>")
        else:
            self.viewport().setCursor(QCursor(Qt.CursorShape.ForbiddenCursor))
            movable = [n for n in d.names if doc.plan.movable(n)[0]]
            self.drag_tip = f"{doc.describe_tensors(movable)}: drop on a device in Devices or Memory"
        QToolTip.showText(global_pos, self.drag_tip, self)

    def _end_drag(self, *, drop: bool) -> None:
        d, self._drag = self._drag, None
        if d is None:
            return
        self.viewport().unsetCursor()
        QToolTip.hideText()
        if d.target is not None:
            d.target.set_drop_highlight(None)
        if drop and d.device is not None:
            self._doc.move(d.names, d.device)
