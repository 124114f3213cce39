"""Python's cycle collector, run on the GUI thread only.

Automatic collection runs in whichever thread happens to allocate when a threshold is crossed.  When
that is a worker thread (the projector, the model loader, the speed bench) and the garbage holds Qt
objects (a closed window's menus and actions, a rebuilt Recent menu), their C++ destructors run in
the worker, and shiboken's deferred deletion on the GUI thread can deadlock against them.  Seen in
the test suite with PySide6 6.11: the projector thread in ``QObject::~QObject`` waiting for the GIL,
the GUI thread holding the GIL in ``~QMenu`` waiting for a Qt mutex; the window froze for good.

So the window turns automatic collection off and a timer on the GUI thread collects whenever the
allocation counts pass the collector's own thresholds, the generations it would have collected.
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QCoreApplication, QObject, QTimer

INTERVAL_MS = 250
_PROPERTY = "offload_planner_gui_thread_gc"


class GuiThreadCollector(QObject):
    def __init__(self, parent: QObject, interval_ms: int = INTERVAL_MS) -> None:
        super().__init__(parent)
        self.thresholds = gc.get_threshold()
        gc.disable()
        self.timer = QTimer(self)
        self.timer.timeout.connect(self.check)
        self.timer.start(interval_ms)

    def check(self) -> int:
        """Collect the oldest generation whose count passed its threshold; returns it (-1: none)."""
        counts = gc.get_count()
        generation = -1
        for g in range(3):
            if counts[g] > self.thresholds[g]:
                generation = g
        if generation >= 0:
            gc.collect(generation)
        return generation


def install() -> GuiThreadCollector | None:
    """Once per application, from the GUI thread (idempotent); None without a QCoreApplication."""
    app = QCoreApplication.instance()
    if app is None:
        return None
    existing = app.findChild(GuiThreadCollector)
    if existing is not None:
        return existing
    collector = GuiThreadCollector(app)
    collector.setObjectName(_PROPERTY)
    return collector
