"""The Problems tab: the plan's warnings (core.analysis.warnings_of: devices over capacity,
-ot rules that match nothing or are shadowed, placements that cost speed), projection errors and
notes from loading or pasting."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QListWidget, QListWidgetItem, QStyle, QWidget

from offload_planner.core.command_text import REFUSED
from offload_planner.core.mapped_span import unified_over
from offload_planner.ui.document import PlanDocument
from offload_planner.ui.palette import readable

UPDATING = "updating… (the problems below are from before the last edit)"
ERROR_COLOR = QColor("#B00000")
UNIFIED = "unified memory:"  # core.mapped_span.unified_note
STALE_COLOR = QColor("#8A8A8A")


class ProblemsPane(QListWidget):
    countChanged = Signal(int)

    def __init__(self, doc: PlanDocument, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._doc = doc
        self.setWordWrap(True)
        self.setAlternatingRowColors(True)
        self.setAccessibleName("Problems")
        doc.analysisChanged.connect(self.refresh)
        doc.modelChanged.connect(self.refresh)
        doc.notesChanged.connect(self.refresh)
        doc.planChanged.connect(self.refresh)

    def problems(self) -> list[tuple[str, str]]:
        """(severity, text): severity is error, warning or note."""
        out: list[tuple[str, str]] = []
        a = self._doc.analysis
        if a is not None and a.error:
            out.append(("error", a.error))
        if a is not None:
            out += [("error" if " over capacity" in w else "warning", w) for w in a.warnings]
        # a pasted command llama-server would refuse: planned anyway, but it would not start
        out += [("error" if n.startswith(REFUSED) else "note", n) for n in self._doc.notes]
        if a is not None:
            # a Mac's devices together over its RAM: plan names the CPU over capacity (exit 3)
            ram_over = a.projection is not None and unified_over(a.projection) > 0
            out += [("error" if ram_over and n.startswith(UNIFIED) else "note", n) for n in a.notes]
        order = ("error", "warning", "note")
        return sorted(out, key=lambda p: order.index(p[0]))  # errors first, each kind in its order

    def refresh(self) -> None:
        self.clear()
        icons = {
            "error": self.style().standardIcon(QStyle.StandardPixmap.SP_MessageBoxCritical),
            "warning": self.style().standardIcon(QStyle.StandardPixmap.SP_MessageBoxWarning),
            "note": self.style().standardIcon(QStyle.StandardPixmap.SP_MessageBoxInformation),
        }
        probs = self.problems()
        current = self._doc.analysis_current or not self._doc.has_plan
        if not current:
            self.addItem(QListWidgetItem(UPDATING))
        pal = self.palette()
        base, alternate = pal.color(QPalette.ColorRole.Base), pal.color(QPalette.ColorRole.AlternateBase)
        error_color = readable(readable(ERROR_COLOR, base), alternate)  # a dark palette too
        for sev, text in probs:
            item = QListWidgetItem(icons[sev], text)
            item.setToolTip(f"{sev}: {text}")
            if not current:
                item.setForeground(STALE_COLOR)
            elif sev == "error":
                item.setForeground(error_color)
            self.addItem(item)
        self.countChanged.emit(sum(1 for s, _ in probs if s != "note"))
