"""The speed estimate under the memory bars: one line, live for every edit, the details on hover.

Thin over :mod:`offload_planner.core.speed`: figures from the devices' declarations, the cached RAM
probe of this machine (never measured from the GUI thread) and the efficiencies measured here.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QLabel, QWidget

from offload_planner.backend.speed_store import plan_speed
from offload_planner.core.errors import PlannerError
from offload_planner.core.speed.report import speed_label, speed_lines
from offload_planner.ui.document import PlanDocument


class SpeedLabel(QLabel):
    def __init__(self, doc: PlanDocument, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._doc = doc
        self.setAccessibleName("Speed estimate")
        self.setWordWrap(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # coalesced: the edit returns at once, the line follows in the same event-loop turn
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(0)
        self._timer.timeout.connect(self.refresh)
        doc.planChanged.connect(self._timer.start)
        doc.modelChanged.connect(self._timer.start)
        self.refresh()

    def refresh(self) -> None:
        if not self._doc.has_plan:
            self.setText("")
            self.setToolTip("")
            return
        try:
            est = plan_speed(self._doc.plan, probe=False, placement=self._doc.placement)
        except (PlannerError, ValueError, KeyError, ZeroDivisionError) as e:
            self.setText(f"speed estimate unavailable: {e}")
            return
        self.setText(speed_label(est))
        self.setToolTip("<pre>" + "\n".join(speed_lines(est)).replace("&", "&amp;").replace("<", "&lt;")
                        + "</pre>")
