"""The window's three side-by-side panes (Devices/Options, tensor map, Memory): until the user drags
a handle, a change of the window's width shares it by :func:`~offload_planner.ui.window_size.pane_widths`,
which gives the tensor map priority in a small window."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QByteArray, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QSplitter, QWidget

from offload_planner.ui.window_size import PANE_DESIGN, pane_widths


class PaneSplitter(QSplitter):
    def __init__(self, centre_need: Callable[[], int], parent: QWidget | None = None) -> None:
        super().__init__(Qt.Orientation.Horizontal, parent)
        self._centre_need = centre_need
        #: The user dragged a handle (this session, or a restored one): the panes keep their widths.
        self.by_user = False
        self.splitterMoved.connect(self._on_moved)

    def _on_moved(self, _pos: int, _index: int) -> None:
        self.by_user = True

    def restoreState(self, state: QByteArray | bytes | bytearray | memoryview) -> bool:
        restored = super().restoreState(state)
        self.by_user = self.by_user or restored
        return restored

    def user_state(self) -> QByteArray:
        """What to save: the panes' state if the user sized them, else nothing (the next session
        fits the panes to its own window)."""
        return QByteArray(self.saveState()) if self.by_user else QByteArray()

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():
            self.refit()

    def refit(self) -> None:
        """:meth:`fit_panes` unless the user sized the panes (a new model's map is wider or narrower)."""
        if not self.by_user:
            self.fit_panes()

    def side_minimums(self) -> tuple[int, int]:
        def least(w: QWidget | None) -> int:
            return 0 if w is None else max(w.minimumWidth(), w.minimumSizeHint().width())

        return least(self.widget(0)), least(self.widget(2))

    def fit_panes(self) -> None:
        """Share the panes' width by :func:`pane_widths`."""
        sizes = self.sizes()
        if len(sizes) != len(PANE_DESIGN) or sum(sizes) <= 0:
            return
        self.setSizes(list(pane_widths(sum(sizes), self._centre_need(), self.side_minimums())))
