"""Garbage is collected on the GUI thread only once a window exists: a worker thread that allocates
past every threshold triggers no collection, and the collector's timer collects Qt objects caught in
reference cycles on the GUI thread (PySide6 can deadlock when a worker destroys them)."""

from __future__ import annotations

import gc
import threading
import weakref

from PySide6.QtCore import QObject
from pytestqt.qtbot import QtBot

from offload_planner.ui.gui_thread_gc import GuiThreadCollector, install
from offload_planner.ui.main_window import MainWindow


class _Cycle:
    def __init__(self) -> None:
        self.me = self
        self.obj = QObject()


def test_collection_happens_on_the_gui_thread_only(qtbot: QtBot, window: MainWindow) -> None:
    assert not gc.isenabled()
    collectors = _app().findChildren(GuiThreadCollector)
    assert len(collectors) == 1 and install() is collectors[0]
    threads: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            threads.append(threading.get_ident())

    gc.callbacks.append(seen)
    try:
        def allocate() -> None:  # ten times over every generation's threshold
            junk = [[i] for i in range(20 * sum(gc.get_threshold()) * 10)]
            del junk

        worker = threading.Thread(target=allocate)
        worker.start()
        worker.join()
        assert threads == [], "a worker thread ran the cycle collector"
        cycle = _Cycle()
        ref = weakref.ref(cycle.obj)
        del cycle
        # pass generation 0's threshold with live tracked objects (freed ones lower the count again)
        alive = [[i] for i in range(2 * gc.get_threshold()[0])]
        qtbot.waitUntil(lambda: ref() is None, timeout=5_000)
        del alive
        assert threads and set(threads) == {threading.main_thread().ident}
    finally:
        gc.callbacks.remove(seen)


def _app() -> QObject:
    from PySide6.QtCore import QCoreApplication

    app = QCoreApplication.instance()
    assert app is not None
    return app
