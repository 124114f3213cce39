"""The Speed tab: estimated prompt processing (t/s) and the GPUs' compute buffers (GiB) against
``-ub``, for the open plan (computed off the GUI thread on request; thin over core.speed.sweep)."""

from __future__ import annotations

import contextlib
import math
import os
import threading
from dataclasses import replace

os.environ.setdefault("PYQTGRAPH_QT_LIB", "PySide6")  # before pyqtgraph picks a Qt binding

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from offload_planner.backend.speed_store import efficiencies_for, machine_hardware
from offload_planner.core.plan import Plan
from offload_planner.core.speed.bottleneck import HOST_KV_PART
from offload_planner.core.speed.sweep import UBATCHES, UbPoint, fastest_fitting, ubatch_tradeoff
from offload_planner.core.speed.tps import tps_fixed
from offload_planner.core.units import GiB
from offload_planner.ui.document import PlanDocument
from offload_planner.ui.eliding_label import ElidingLabel
from offload_planner.ui.speed_view import IF_IT_FIT

PP_COLOR = "#2878DC"  # prompt processing: solid, left axis
BUF_COLOR = "#DC7828"  # GPU compute buffers: dashed, right axis
BUF_TITLE = "GPU GiB"  # the right axis: the compute buffers llama.cpp reserves on the GPUs
UB_TICKS: tuple[int, ...] = tuple(UBATCHES)  # the -ub values ubatch_tradeoff projects


#: What the tab says before its first plot (instead of an empty plot with made-up axes).
IDLE_HINT = (
    "Which -ub (micro-batch) is fastest for this plan? Press “Plot the -ub trade-off”: it projects the "
    "plan at -ub 64 … 4096 (a few seconds) and plots the estimated prompt processing (t/s, solid, left "
    "axis) against the compute buffers llama.cpp reserves on the GPUs (GiB, dashed, right axis). A "
    "larger -ub is faster on long prompts and costs GPU memory; set it under Options."
)


#: Before the status line while the curves are of another plan than the one on screen.
STALE = "Plot of the plan before your last edit (press the button again): "


class StatusLine(ElidingLabel):
    """The tab's one line, elided at its width (it ran off the window at 1024 px), whole in its
    tooltip; ``text()`` is the whole line."""

    def setText(self, text: str) -> None:
        self.set_full_text(text)

    def text(self) -> str:
        return self.full_text


def ub_ticks(values: tuple[int, ...]) -> list[tuple[float, str]]:
    """Ticks of the log -ub axis: at each value, labelled with the value itself."""
    return [(math.log10(v), str(v)) for v in values]


class UbatchPlot(QWidget):
    done = Signal(object, object)  # points (or None), error text

    def __init__(self, doc: PlanDocument, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._doc = doc
        self.button = QPushButton("Plot the -ub trade-off")
        self.button.setToolTip("Project the plan at -ub 64..4096: estimated prompt processing against "
                               "the compute buffers llama.cpp reserves (a few projections)")
        self.status = StatusLine()
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setBackground(None)
        self.plot = self.graphics.addPlot(row=0, col=0)
        self.plot.setLabel("bottom", "-ub (tokens per micro-batch)")
        # short axis titles in their curve's colour (the tab is short: long titles were cut and a
        # legend covered the curves); the -ub axis is labelled at the swept values, 64 ... 4096
        self.plot.setLabel("left", "pp t/s", color=PP_COLOR)
        self.plot.setLogMode(x=True, y=False)
        self.plot.getAxis("bottom").setTicks([ub_ticks(UB_TICKS)])
        self.plot.showGrid(x=True, y=True, alpha=0.2)
        self.buffers = pg.ViewBox()
        self.plot.showAxis("right")
        self.plot.scene().addItem(self.buffers)
        self.plot.getAxis("right").linkToView(self.buffers)
        # "compute GiB" was longer than the right axis is tall at 1280x800 (65 px); the tooltip, the
        # hint and the status line say these are the GPUs' compute buffers
        self.plot.getAxis("right").setLabel(BUF_TITLE, color=BUF_COLOR)
        self.buffers.setXLink(self.plot)
        self.plot.vb.sigResized.connect(lambda: self.buffers.setGeometry(self.plot.vb.sceneBoundingRect()))
        self.pp_curve = self.plot.plot([], [], pen=pg.mkPen(PP_COLOR, width=2), symbol="o",
                                       symbolBrush=PP_COLOR, name="pp t/s")
        dash = pg.mkPen(BUF_COLOR, width=2, style=Qt.PenStyle.DashLine)
        self.buf_curve = pg.PlotDataItem([], [], pen=dash, symbol="s", symbolBrush=BUF_COLOR)
        self.buffers.addItem(self.buf_curve)
        tip = ("Solid, left axis: estimated prompt processing (t/s). Dashed, right axis: the compute "
               "buffers llama.cpp reserves on the GPUs (GiB). Both against -ub.")
        self.graphics.setToolTip(tip + " The dotted line: the plan's -ub now.")
        # where the plan is now (moves with every -ub edit, the curves only with a new plot)
        self.now_line = pg.InfiniteLine(angle=90, movable=False,
                                        pen=pg.mkPen("#808080", width=1, style=Qt.PenStyle.DotLine))
        self.plot.addItem(self.now_line)
        self.points: list[UbPoint] = []
        self._plotted: Plan | None = None  # the plan the curves are of (its -ub aside)
        self._status = ""  # the plot's own line, without the stale note
        self.idle = QLabel(IDLE_HINT)
        self.idle.setWordWrap(True)
        self.idle.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.idle.setAccessibleName("Speed: nothing plotted yet")
        top = QHBoxLayout()
        top.addWidget(self.button)
        top.addWidget(self.status, 1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(top)
        lay.addWidget(self.idle, 1)
        lay.addWidget(self.graphics, 1)
        self.graphics.hide()
        self.button.clicked.connect(self.start)
        self.done.connect(self._show)
        doc.modelChanged.connect(self._clear)
        doc.planChanged.connect(self._plan_changed)

    def _plan_changed(self) -> None:
        """The dotted line follows the plan's -ub; curves of another plan say so (they were shown
        as if current after any edit)."""
        if not self._doc.has_plan:
            return
        c = self._doc.plan.context
        ub = c.n_ubatch or c.n_batch  # llama.cpp: -ub 0 is -b, and -ub is at most -b
        self.now_line.setValue(math.log10(max(1, min(ub, c.n_batch) if c.n_batch else ub)))
        if not self.points:
            return
        if _sweep_key(self._doc.plan) == self._plotted:  # -ub alone: the same curves
            self.status.setText(self._status)
        else:
            self.status.setText(STALE + self._status)

    def _clear(self) -> None:
        self.points = []
        self._plotted = None
        self.pp_curve.setData([], [])
        self.buf_curve.setData([], [])
        self.status.setText("")
        self.graphics.hide()
        self.idle.show()

    def start(self) -> None:
        if not self._doc.has_plan:
            return
        plan = self._doc.plan
        self._plotted = _sweep_key(plan)
        self.button.setEnabled(False)
        self.status.setText("projecting…")

        def run() -> None:
            try:
                hw = machine_hardware(plan, probe=False)
                eff = efficiencies_for(plan.dialect, plan.devices)
                points, error = ubatch_tradeoff(plan, hw, eff=eff), ""
            except Exception as e:  # the plot is a view: a core error becomes a message
                points, error = None, f"{type(e).__name__}: {e}"
            with contextlib.suppress(RuntimeError):  # the window closed while the sweep ran
                self.done.emit(points, error)

        threading.Thread(target=run, name="offload-planner ub sweep", daemon=True).start()

    def _show(self, points: list[UbPoint] | None, error: str) -> None:
        self.button.setEnabled(True)
        if points is None:
            self.status.setText(f"could not plot: {error}")
            return
        self.points = points
        self.idle.hide()
        self.graphics.show()
        for side in ("left", "right"):  # laid out while hidden: place the axis titles again
            self.plot.getAxis(side).resizeEvent()
        self.plot.getAxis("bottom").setTicks([ub_ticks(tuple(p.n_ubatch for p in points))])
        xs = [math.log10(p.n_ubatch) for p in points]
        # points whose plan does not fit at that -ub are drawn hollow
        self.pp_curve.setData([p.n_ubatch for p in points], [p.pp_tps for p in points],
                              symbolBrush=[pg.mkBrush(PP_COLOR if p.fits else None) for p in points])
        # no GPU compute buffer at any -ub (a CPU-only plan): no right axis of zeros, which pyqtgraph
        # ranged -400 ... 400 with a cut "GPU GiB (x0.001)" title
        gpu = any(p.gpu_compute_bytes for p in points)
        self.plot.showAxis("right", gpu)
        self.buffers.setVisible(gpu)
        self.buf_curve.setData(xs if gpu else [], [p.gpu_compute_bytes / GiB for p in points] if gpu else [])
        self._status = ub_status(points)
        self.status.setText(self._status)
        self._plan_changed()  # an edit while the sweep ran: these curves are of the plan before it


def _sweep_key(plan: Plan) -> Plan:
    """What the curves depend on: the plan but its -ub, which the sweep sets itself."""
    return replace(plan, context=replace(plan.context, n_ubatch=0))


def ub_status(points: list[UbPoint]) -> str:
    """The Speed tab's line: the fastest ``-ub`` that fits every device, and a faster one that would
    not fit (its compute buffer); "if it fit:" before the fastest of all when none fits."""
    best_fit, faster = fastest_fitting(points)
    if best_fit is not None and not any(p.gpu_compute_bytes for p in points):  # a CPU-only plan
        return (f"fastest prompt processing that fits at -ub {best_fit.n_ubatch}: "
                f"{tps_fixed(best_fit.pp_tps, 0)} t/s (no GPU compute buffers: nothing of the plan on a GPU)")
    if best_fit is None:
        best = max(points, key=lambda p: p.pp_tps)
        return (f"{IF_IT_FIT}fastest prompt processing at -ub {best.n_ubatch}: "
                f"{tps_fixed(best.pp_tps, 0)} t/s, "
                f"{best.gpu_compute_bytes / GiB:.2f} GiB of GPU compute buffers (no -ub fits: "
                f"{', '.join(best.over)} over capacity)")
    text = (f"fastest prompt processing that fits at -ub {best_fit.n_ubatch}: "
            f"{tps_fixed(best_fit.pp_tps, 0)} t/s, "
            f"{best_fit.gpu_compute_bytes / GiB:.2f} GiB of GPU compute buffers")
    if best_fit.pp_bottleneck.startswith(HOST_KV_PART):  # -nkvo: say what holds it back
        text += f" (bottleneck: {best_fit.pp_bottleneck})"
    if faster is not None:
        text += (f"; -ub {faster.n_ubatch} would give {tps_fixed(faster.pp_tps, 0)} t/s but does not fit: "
                 f"{', '.join(faster.over)} cannot hold its {faster.gpu_compute_bytes / GiB:.2f} GiB of "
                 "compute buffers")
    return text
