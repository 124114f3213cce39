"""Opening a model off the GUI thread, with progress; only the newest request's result is delivered."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal

from offload_planner.bundled import demo_model_path
from offload_planner.core.errors import PlannerError
from offload_planner.core.model import Model
from offload_planner.core.remote import Cancel, cancel_scope


def demo_model() -> Path:
    """The bundled DeepSeek-V3 header, from an installed package or a source checkout."""
    return demo_model_path()


def normalize_location(location: str | Path) -> str:
    s = str(location)
    if s.startswith(("http://", "https://")):
        return s
    return str(Path(s).expanduser().resolve())


class _Signals(QObject):
    progress = Signal(int, int, int)  # generation, done, total
    loaded = Signal(int, object)  # generation, Model
    failed = Signal(int, str)


class _LoadTask(QRunnable):
    def __init__(self, location: str, generation: int, signals: _Signals, cancel: Cancel) -> None:
        super().__init__()
        self._location = location
        self._generation = generation
        self._signals = signals
        self._cancel = cancel

    def run(self) -> None:
        from offload_planner.core.loadable import open_loadable

        g = self._generation
        try:
            # a model llama.cpp refuses to load: said when opened, not planned; a URL's reads end when
            # the load is replaced or the window closes
            with cancel_scope(self._cancel):
                model = open_loadable(self._location,
                                      progress=lambda d, t: self._signals.progress.emit(g, d, t))
            _ = model.summary  # computed here, not lazily on the GUI or projection thread
        except PlannerError as e:
            self._signals.failed.emit(g, str(e))
            return
        except OSError as e:
            self._signals.failed.emit(g, f"{self._location}: {e.strerror or e}")
            return
        except Exception as e:  # a reader bug: report it, keep the window
            self._signals.failed.emit(g, f"{self._location}: {type(e).__name__}: {e}")
            return
        self._signals.loaded.emit(g, model)


class ModelLoader(QObject):
    """``load(location, context)``; ``loaded(model, context)`` or ``failed(message, context)``."""

    started = Signal(str)
    progress = Signal(int, int)
    loaded = Signal(object, object)
    failed = Signal(str, object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(2)
        self._signals = _Signals(self)
        self._signals.progress.connect(self._on_progress)
        self._signals.loaded.connect(self._on_loaded)
        self._signals.failed.connect(self._on_failed)
        self._generation = 0
        self._context: object = None
        self._busy = False
        self._cancel = Cancel()  # the newest load's

    @property
    def busy(self) -> bool:
        return self._busy

    def load(self, location: str | Path, context: object = None) -> None:
        """Open ``location`` off the GUI thread; a load still under way is replaced (its network reads
        cut: two silent servers held both of the pool's threads, and the next file waited a minute)."""
        self._generation += 1
        self._context = context
        self._busy = True
        self._cancel.cancel()
        self._cancel = Cancel()
        loc = normalize_location(location)
        self.started.emit(loc)
        self._pool.start(_LoadTask(loc, self._generation, self._signals, self._cancel))

    def _on_progress(self, g: int, done: int, total: int) -> None:
        if g == self._generation:
            self.progress.emit(done, total)

    def _on_loaded(self, g: int, model: Model) -> None:
        if g == self._generation:
            self._busy = False
            self.loaded.emit(model, self._context)

    def _on_failed(self, g: int, message: str) -> None:
        if g == self._generation:
            self._busy = False
            self.failed.emit(message, self._context)

    def shutdown(self) -> None:
        """Drop the load under way, cutting its network reads (a silent server held the window's close
        for 30 s), and wait for the pool."""
        self._generation += 1
        self._cancel.cancel()
        self._pool.waitForDone(30_000)
