"""Projection off the GUI thread, coalesced: any number of edits in one event-loop turn cost one
projection, and a result is only shown if it belongs to the newest plan."""

from __future__ import annotations

from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot

from offload_planner.core.analysis import Analysis, analyse
from offload_planner.core.compute import record_at_first_sight
from offload_planner.core.device_figures import CapacityHint, DeviceFigures
from offload_planner.core.mapped_span import no_placement_fits, ram_sharers
from offload_planner.core.memory import DeviceMemory, Projection
from offload_planner.core.plan import Plan
from offload_planner.core.remote import Cancel, cancel_scope
from offload_planner.core.speed.advice import expert_room, held_on_cpu
from offload_planner.ui.nothing_fits import nothing_fits_text
from offload_planner.ui.room_hint import ram_over_action


def fill_preset_hint(plan: Plan) -> CapacityHint:
    """For a GPU holding a MoE model's routed experts: the preset that fixes its over-capacity. On a Mac
    where no placement fits (:func:`~offload_planner.core.mapped_span.no_placement_fits`; Fill would
    move nothing), for any GPU over: what helps instead, as the Memory pane's "What next" says it."""

    def hint(dm: DeviceMemory, projection: Projection) -> str:
        if not dm.device.is_gpu:
            return _ram_over_hint(plan, dm, projection)
        short = no_placement_fits(projection)
        if short:
            return ": " + nothing_fits_text(ram_sharers(projection), short, figures="",
                                            cannot="Presets ▸ Fill, Fastest plan or moving layers")
        if not plan.model.summary.is_moe:
            return ""
        return (f": Presets ▸ Fill {dm.device.name} with routed experts keeps as many expert layers "
                "there as fit and sends the rest to the CPU")

    return hint


def _ram_over_hint(plan: Plan, dm: DeviceMemory, projection: Projection) -> str:
    """The RAM over while GPUs have room for the routed experts it holds: the Memory pane's "What next"
    says it, but a short pane (1024x640 with three devices) draws none, and the Problems line said only
    "CPU is over capacity by 1.25 GiB" beside 35 GiB free on two GPUs."""
    if not plan.model.summary.is_moe:
        return ""
    room = expert_room(plan, projection)
    if not room or sum(b for _, b in room) < DeviceFigures.of(dm).over:
        return ""
    return f": {ram_over_action(room, held_on_cpu(plan))}"


#: Projectors alive (windows open): while any is, a topology's reference is recorded at its first
#: simulation (every edit is re-projected and replayed against it); the last one to shut down turns
#: that off again, so no window leaves the process's simulations recording.
_LIVE = 0


def _hold(on: bool) -> None:
    global _LIVE
    _LIVE += 1 if on else -1
    record_at_first_sight(_LIVE > 0)


def window_analysis(plan: Plan) -> Analysis:
    """The core's analysis of ``plan``, its over-capacity lines naming the window's preset."""
    return analyse(plan, capacity_hint=fill_preset_hint(plan))


def failure_text(plan: Plan, e: Exception) -> str:
    """What a projection that raised says: the model's file and the error (a bug: the plan stays)."""
    return f"{plan.model.path}: cannot project the plan: {type(e).__name__}: {e}"


class _Worker(QObject):
    done = Signal(object, int)  # an Analysis, or the text of the error that stopped it

    def __init__(self) -> None:
        super().__init__()
        self.cancel = Cancel()  # cuts a projector URL's reads (-mmu) when the window closes

    @Slot(object, int)
    def run(self, plan: Plan, generation: int) -> None:
        try:
            with cancel_scope(self.cancel):
                result: Analysis | str = window_analysis(plan)
        except Exception as e:  # a bug: said, and the projector stays usable (it waited for ever)
            result = failure_text(plan, e)
        self.done.emit(result, generation)


class Projector(QObject):
    """``request(plan)`` as often as you like; ``ready(analysis)`` fires for the newest plan, or
    ``failed(text)`` when its projection raised (a bug: the window says it and keeps the plan; the next
    edit is projected again)."""

    ready = Signal(object)
    failed = Signal(str)
    _start = Signal(object, int)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        _hold(True)  # every edit is re-projected: replay it against the first projection
        self._held = True
        self._thread = QThread(self)
        self._thread.setObjectName("offload-planner projection")
        self._worker = _Worker()
        self._worker.moveToThread(self._thread)
        self._start.connect(self._worker.run)
        self._worker.done.connect(self._on_done)
        self._thread.finished.connect(self._worker.deleteLater)
        self._thread.start()
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(0)
        self._timer.timeout.connect(self._dispatch)
        self._pending: Plan | None = None
        self._generation = 0
        self._busy = False

    @property
    def idle(self) -> bool:
        return not self._busy and self._pending is None

    def request(self, plan: Plan) -> None:
        self._pending = plan
        self._generation += 1
        self._timer.start()

    def cancel(self) -> None:
        self._pending = None
        self._generation += 1

    def _dispatch(self) -> None:
        if self._busy or self._pending is None:
            return
        plan, self._pending = self._pending, None
        self._busy = True
        self._start.emit(plan, self._generation)

    @Slot(object, int)
    def _on_done(self, analysis: Analysis | str, generation: int) -> None:
        self._busy = False
        if generation == self._generation:
            if isinstance(analysis, str):
                self.failed.emit(analysis)
            else:
                self.ready.emit(analysis)
        elif self._pending is not None:
            self._dispatch()

    def shutdown(self) -> None:
        if self._held:
            self._held = False
            _hold(False)
        self._pending = None
        self._worker.cancel.cancel()  # a silent server held the close 10 s, then Qt aborted ("QThread:
        self._thread.quit()  # Destroyed while thread ... is still running")
        self._thread.wait(10_000)
