"""The server log: a bounded list model fed in batches, and a view that follows the tail.

:class:`LogModel` keeps at most ``max_lines`` lines, each made printable and cut to
:data:`~offload_planner.backend.log_lines.LINE_LIMIT` characters
(:func:`~offload_planner.backend.log_lines.safe_lines`: a backend printing escape codes or binary
garbage shows them as ``\x1b``, ``\xff``, ...).  :meth:`LogModel.append_lines` only queues;
a 100 ms timer moves the queue into the model in one insert (and one removal at the top when the
cap is reached), so a server printing hundreds of thousands of lines cannot stall the event loop or
grow memory.  Levels (``E``/``W``/``I``/``D`` from the ``M.SS.mmm.uuu L`` prefix, ik's ``INFO [``,
or keywords) are worked out only for rows that are shown or filtered, and coloured.

:class:`LogView` adds a filter box, a "warnings and errors only" switch, Copy and Save, and follows
the tail only while it is scrolled to the bottom.  Embed it and connect
``server.linesReceived`` to :meth:`LogView.append_lines` (or call :meth:`LogView.attach`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import (
    QAbstractListModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    QRegularExpression,
    QSortFilterProxyModel,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import QColor, QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListView,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from offload_planner.backend.log_lines import safe_lines
from offload_planner.backend.log_parser import line_level
from offload_planner.backend.runner import ServerProcess, guard_pyside_emit_refcount

guard_pyside_emit_refcount()

LEVEL_ROLE = int(Qt.ItemDataRole.UserRole) + 1
DEFAULT_MAX_LINES = 20_000
FLUSH_MS = 100
#: Most lines moved into the model per tick; the rest wait for the next tick (the queue is capped).
BATCH_MAX = 5_000

LEVEL_COLORS = {
    "E": QColor(200, 40, 40),
    "W": QColor(176, 112, 0),
    "D": QColor(128, 128, 128),
    "T": QColor(128, 128, 128),
}
LEVEL_NAMES = {"E": "error", "W": "warning", "I": "info", "D": "debug", "T": "trace"}

_Index = QModelIndex | QPersistentModelIndex


class LogModel(QAbstractListModel):
    """At most ``max_lines`` lines; appends are queued and inserted on a ``flush_ms`` timer."""

    aboutToFlush = Signal()
    flushed = Signal(int)  # rows added

    def __init__(self, max_lines: int = DEFAULT_MAX_LINES, flush_ms: int = FLUSH_MS,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.max_lines = max(1, max_lines)
        self._rows: list[str] = []
        self._levels: list[str | None] = []
        self._pending: list[str] = []
        self.received = 0  # lines ever appended
        self.dropped = 0  # lines that left the buffer (or never entered it)
        self._timer = QTimer(self)
        self._timer.setInterval(flush_ms)
        self._timer.timeout.connect(self.flush)

    # --- feeding --------------------------------------------------------------------------------

    def append_lines(self, lines: Sequence[str]) -> None:
        if not lines:
            return
        self.received += len(lines)
        self._pending.extend(safe_lines(lines))
        over = len(self._pending) - self.max_lines
        if over > 0:  # they would be evicted before anyone saw them
            del self._pending[:over]
            self.dropped += over
        if not self._timer.isActive():
            self._timer.start()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def flush(self) -> int:
        """Move queued lines into the model (at most :data:`BATCH_MAX`); returns how many."""
        if not self._pending:
            self._timer.stop()
            return 0
        batch = self._pending[:BATCH_MAX]
        del self._pending[:BATCH_MAX]
        self.aboutToFlush.emit()
        n = len(batch)
        over = len(self._rows) + n - self.max_lines
        if over >= len(self._rows) and self._rows:
            self.beginResetModel()
            self.dropped += len(self._rows) + max(0, n - self.max_lines)
            self._rows = batch[-self.max_lines:]
            self._levels = [None] * len(self._rows)
            self.endResetModel()
        else:
            if over > 0:
                self.beginRemoveRows(QModelIndex(), 0, over - 1)
                del self._rows[:over]
                del self._levels[:over]
                self.dropped += over
                self.endRemoveRows()
            first = len(self._rows)
            self.beginInsertRows(QModelIndex(), first, first + n - 1)
            self._rows.extend(batch)
            self._levels.extend([None] * n)
            self.endInsertRows()
        if not self._pending:
            self._timer.stop()
        self.flushed.emit(n)
        return n

    def clear(self) -> None:
        self.beginResetModel()
        self._rows, self._levels, self._pending = [], [], []
        self.received = self.dropped = 0
        self.endResetModel()
        self._timer.stop()

    # --- reading --------------------------------------------------------------------------------

    def lines(self) -> list[str]:
        return list(self._rows)

    def level(self, row: int) -> str:
        lv = self._levels[row]
        if lv is None:
            lv = self._levels[row] = line_level(self._rows[row])
        return lv

    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> object:
        row = index.row()
        if not index.isValid() or row >= len(self._rows):
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            return self._rows[row]
        if role == LEVEL_ROLE:
            return self.level(row)
        if role == Qt.ItemDataRole.ForegroundRole:
            return LEVEL_COLORS.get(self.level(row))
        if role == Qt.ItemDataRole.ToolTipRole:
            return LEVEL_NAMES.get(self.level(row), "")
        return None


class LogView(QWidget):
    """Log model + filter box + follow-tail list view; Copy and Save act on the visible lines or the
    selection (Save writes everything kept when nothing is filtered)."""

    def __init__(self, parent: QWidget | None = None, *, max_lines: int = DEFAULT_MAX_LINES,
                 flush_ms: int = FLUSH_MS) -> None:
        super().__init__(parent)
        self.model = LogModel(max_lines, flush_ms, self)
        self.level_proxy = QSortFilterProxyModel(self)
        self.level_proxy.setSourceModel(self.model)
        self.level_proxy.setFilterRole(LEVEL_ROLE)
        self.text_proxy = QSortFilterProxyModel(self)
        self.text_proxy.setSourceModel(self.level_proxy)
        self.text_proxy.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)

        self.filter_edit = QLineEdit()
        self.filter_edit.setPlaceholderText("Filter (text)")
        self.filter_edit.setClearButtonEnabled(True)
        self.filter_edit.textChanged.connect(self.set_filter)
        self.problems_only = QCheckBox("Warnings and errors only")
        self.problems_only.toggled.connect(self.set_problems_only)
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy the selected lines (all shown lines when none is selected)")
        self.copy_button.clicked.connect(self.copy)
        self.save_button = QPushButton("Save…")
        self.save_button.clicked.connect(self.save_dialog)
        self.clear_button = QPushButton("Clear")
        self.clear_button.clicked.connect(self.clear)
        self.status = QLabel()

        self.view = QListView()
        self.view.setModel(self.text_proxy)
        self.view.setUniformItemSizes(True)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.view.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.view.setAccessibleName("Server log")

        bar = QHBoxLayout()
        bar.addWidget(self.filter_edit, 1)
        bar.addWidget(self.problems_only)
        bar.addWidget(self.copy_button)
        bar.addWidget(self.save_button)
        bar.addWidget(self.clear_button)
        bar.addWidget(self.status)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(bar)
        lay.addWidget(self.view, 1)

        self._follow = True
        self.model.aboutToFlush.connect(self._before_flush)
        self.model.flushed.connect(self._after_flush)
        self.model.modelReset.connect(self._update_status)

    # --- feeding ------------------------------------------------------------------------------

    def append_lines(self, lines: list[str]) -> None:
        self.model.append_lines(lines)

    def append_line(self, line: str) -> None:
        self.model.append_lines([line])

    def attach(self, server: ServerProcess) -> None:
        """Show ``server``'s output from now on (its notices too, as ``[launcher]`` lines)."""
        server.linesReceived.connect(self.append_lines)
        server.notice.connect(lambda text: self.append_line(f"[launcher] {text}"))

    def clear(self) -> None:
        self.model.clear()
        self._follow = True
        self._update_status()

    # --- following the tail --------------------------------------------------------------------

    def at_bottom(self) -> bool:
        sb = self.view.verticalScrollBar()
        return bool(sb.value() >= sb.maximum() - 1)

    def _before_flush(self) -> None:
        self._follow = self.at_bottom()

    def _after_flush(self, _n: int) -> None:
        if self._follow:
            self.view.scrollToBottom()
        self._update_status()

    def _update_status(self) -> None:
        m = self.model
        shown = self.text_proxy.rowCount()
        text = f"{m.rowCount():,} lines"
        if shown != m.rowCount():
            text = f"{shown:,} of {m.rowCount():,} lines"
        if m.dropped:
            text += f" ({m.dropped:,} older dropped)"
        self.status.setText(text)

    # --- filters ----------------------------------------------------------------------------------

    def set_filter(self, text: str) -> None:
        self.text_proxy.setFilterFixedString(text)
        self._update_status()
        if self._follow:
            self.view.scrollToBottom()

    def set_problems_only(self, on: bool) -> None:
        self.level_proxy.setFilterRegularExpression(QRegularExpression("^[EW]$" if on else ""))
        self._update_status()
        if self._follow:
            self.view.scrollToBottom()

    # --- copy and save ----------------------------------------------------------------------------

    def shown_lines(self) -> list[str]:
        p = self.text_proxy
        return [str(p.data(p.index(r, 0))) for r in range(p.rowCount())]

    def selected_lines(self) -> list[str]:
        rows = sorted(i.row() for i in self.view.selectionModel().selectedIndexes())
        p = self.text_proxy
        return [str(p.data(p.index(r, 0))) for r in rows]

    def copy(self) -> str:
        text = "\n".join(self.selected_lines() or self.shown_lines())
        QGuiApplication.clipboard().setText(text)
        return text

    def save(self, path: str | Path) -> int:
        """Write the shown lines (all kept lines when nothing is filtered); returns the count."""
        filtered = self.text_proxy.rowCount() != self.model.rowCount()
        lines = self.shown_lines() if filtered else self.model.lines()
        Path(path).write_text("".join(ln + "\n" for ln in lines), encoding="utf-8")
        return len(lines)

    def save_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save log", "llama-server.log", "Log files (*.log *.txt)")
        if path:
            self.save(path)
