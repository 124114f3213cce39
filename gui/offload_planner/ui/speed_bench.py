"""The Launch tab's Bench: :func:`~offload_planner.backend.speed_check.run_speed_check` off the GUI
thread; ``done(SpeedCheck)`` or ``failed(str)`` arrive on the GUI thread."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal

from offload_planner.core.errors import PlannerError


class _Signals(QObject):
    done = Signal(object)
    failed = Signal(str)


class _BenchTask(QRunnable):
    def __init__(self, url: str, plan: Any, signals: _Signals, api_key: str | None = None) -> None:
        super().__init__()
        self._url = url
        self._plan = plan
        self._signals = signals
        self._api_key = api_key

    def run(self) -> None:
        from offload_planner.backend.speed_check import run_speed_check

        try:
            self._signals.done.emit(run_speed_check(self._url, self._plan, api_key=self._api_key))
        except (PlannerError, OSError) as e:
            self._signals.failed.emit(str(e))
        except Exception as e:  # any failure must come back: else Bench stayed off, "Measuring…" for good
            self._signals.failed.emit(f"{type(e).__name__}: {e}")


class SpeedBench(QObject):
    """One measurement at a time against the running server."""

    started = Signal()
    done = Signal(object)  # SpeedCheck
    failed = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(1)
        self._signals = _Signals(self)
        self._signals.done.connect(self._finish_ok)
        self._signals.failed.connect(self._finish_failed)
        self.busy = False

    def start(self, url: str, plan: Any, api_key: str | None = None) -> bool:
        """``api_key``: the running server's ``--api-key`` (its requests need it)."""
        if self.busy:
            return False
        self.busy = True
        self.started.emit()
        self._pool.start(_BenchTask(url, plan, self._signals, api_key))
        return True

    def _finish_ok(self, check: object) -> None:
        self.busy = False
        self.done.emit(check)

    def _finish_failed(self, message: str) -> None:
        self.busy = False
        self.failed.emit(message)

    def shutdown(self) -> None:
        self._pool.waitForDone(60_000)
