"""A one-line label that elides its text at its width instead of widening its parent or being cut off
mid-word; the whole text stays available (``full_text``, and the tooltip when elided)."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget


class ElidingLabel(QLabel):
    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._full = text
        self._tip = ""
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self._elide()

    @property
    def full_text(self) -> str:
        return self._full

    def set_full_text(self, text: str, tooltip: str = "") -> None:
        """Show ``text`` (elided to the width); ``tooltip`` goes first in the tooltip."""
        self._full, self._tip = text, tooltip
        self._elide()

    def minimumSizeHint(self) -> QSize:
        return QSize(0, super().minimumSizeHint().height())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        width = max(0, self.width() - 2)
        shown = self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight, width)
        super().setText(shown)
        elided = shown != self._full
        self.setToolTip("\n".join(t for t in (self._tip, self._full if elided else "") if t))
