"""Live memory over time (pyqtgraph): each GPU's used memory, the server's RAM, GPU utilisation,
with every device's projected total drawn as a dashed line in the device's colour.

Embed :class:`TelemetryView`, give it the projection (:meth:`TelemetryView.set_projection`, bytes per
device name) and a :class:`~offload_planner.backend.telemetry.TelemetrySampler`
(:meth:`TelemetryView.attach`); the launcher panel starts and stops the sampler with the server.
Without NVML only the RAM plot fills, and the message above the plots says why.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping

os.environ.setdefault("PYQTGRAPH_QT_LIB", "PySide6")  # before pyqtgraph picks a Qt binding

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from offload_planner.backend.runner import guard_pyside_emit_refcount
from offload_planner.backend.telemetry import Sample, TelemetrySampler
from offload_planner.core.units import GiB
from offload_planner.ui.palette import CPU_COLOR, GPU_COLORS

guard_pyside_emit_refcount()

DEFAULT_KEEP = 2400  # 10 minutes at 4 Hz


#: The plots' left axis titles (with their units), left to right.
AXIS_TITLES = ("GPU memory GiB", "RAM GiB", "GPU busy %")
TIP = (
    "Left: the memory in use on each GPU (GiB), its projected total dashed. Middle: the RAM of the "
    "llama-server process and of the whole system (dotted), the CPU's projected total dashed. Right: "
    "each GPU's utilisation (%). All against the seconds since the launch."
)
PROJECTED = "projected (dashed)"  # the legend's entry for the projected totals, in each device's colour
SYSTEM_COLOR = (160, 160, 160)  # the whole machine's RAM in use: thin and dotted beside the server's


def device_color(name: str, gpu_index: int) -> tuple[int, int, int]:
    """The window's colours (the map, the bars, the device list): CPU grey, the n-th GPU the n-th of
    the Okabe-Ito GPU colours."""
    c = CPU_COLOR if name == "CPU" else GPU_COLORS[gpu_index % len(GPU_COLORS)]
    return (c.red(), c.green(), c.blue())


class _Series:
    def __init__(self, keep: int) -> None:
        self.t: deque[float] = deque(maxlen=keep)
        self.v: deque[float] = deque(maxlen=keep)

    def add(self, t: float, v: float) -> None:
        self.t.append(t)
        self.v.append(v)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.fromiter(self.t, float, len(self.t)), np.fromiter(self.v, float, len(self.v))


#: What the tab says before a launch sends its first sample (instead of three empty plots).
IDLE_HINT = (
    "Nothing to plot yet: press Launch (Launch tab) to start llama-server with this plan. While it "
    "loads and runs, this tab plots each GPU's memory and the server's RAM (GiB) against the "
    "projection (dashed), and GPU utilisation (%), over time (s)."
)


class TelemetryView(QWidget):
    """Three plots side by side (the tab is wide and short): GPU memory (GiB), RAM (GiB) and GPU
    utilisation (%); before the first sample, a line saying how to get one."""

    def __init__(self, parent: QWidget | None = None, *, keep: int = DEFAULT_KEEP) -> None:
        super().__init__(parent)
        self.keep = keep
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.hide()
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setBackground(None)
        self.idle = QLabel(IDLE_HINT)
        self.idle.setWordWrap(True)
        self.idle.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.idle.setAccessibleName("Telemetry: nothing to plot yet")
        # side by side and named by their left axis, not by a title row: stacked, the three plots
        # shared the bottom tab's ~150 px and the third was not on screen
        self.gpu_plot = self.graphics.addPlot(row=0, col=0)
        self.ram_plot = self.graphics.addPlot(row=0, col=1)
        self.util_plot = self.graphics.addPlot(row=0, col=2)
        self.graphics.setToolTip(TIP)
        for p, title in zip((self.gpu_plot, self.ram_plot, self.util_plot), AXIS_TITLES, strict=True):
            p.setLabel("left", title)
            p.setLabel("bottom", "time (s)")
            p.showGrid(x=True, y=True, alpha=0.2)
            p.addLegend(offset=(-5, -5), colCount=2)  # bottom right: the curves climb from bottom left
        self.util_plot.setYRange(0, 100)
        self.ram_plot.setXLink(self.gpu_plot)
        self.util_plot.setXLink(self.gpu_plot)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.message)
        lay.addWidget(self.idle, 1)
        lay.addWidget(self.graphics, 1)
        self.graphics.hide()
        self._series: dict[str, _Series] = {}
        self._curves: dict[str, pg.PlotDataItem] = {}
        self._projected: dict[str, int] = {}
        self._lines: dict[str, pg.InfiniteLine] = {}
        self._colors: dict[str, tuple[int, int, int]] = {}
        self.samples_seen = 0

    # --- inputs ---------------------------------------------------------------------------------

    def attach(self, sampler: TelemetrySampler) -> None:
        sampler.sampled.connect(self.add_sample)
        sampler.messageChanged.connect(self.set_message)
        self.set_message(sampler.message)

    def set_message(self, text: str) -> None:
        self.message.setText(text)
        self.message.setVisible(bool(text))

    def set_projection(self, totals: Mapping[str, int]) -> None:
        """Projected bytes per device (``CUDA0``, ``RPC0``, ``CPU``): dashed horizontal lines."""
        for name, line in self._lines.items():
            (self.ram_plot if name == "CPU" else self.gpu_plot).removeItem(line)
        self._lines.clear()
        self._projected = dict(totals)
        for name, value in totals.items():
            plot = self.ram_plot if name == "CPU" else self.gpu_plot
            pen = pg.mkPen(self._color(name), width=1, style=Qt.PenStyle.DashLine)
            # named in the legend, not by a label on the line: in the tab's ~100 px of plot height
            # the labels were cut by the axes and covered each other
            line = pg.InfiniteLine(pos=value / GiB, angle=0, pen=pen, movable=False)
            plot.addItem(line, ignoreBounds=False)
            self._lines[name] = line
        for plot in (self.gpu_plot, self.ram_plot):
            legend = plot.legend
            legend.removeItem(PROJECTED)
            if any((n == "CPU") == (plot is self.ram_plot) for n in totals):
                dashed = pg.mkPen(SYSTEM_COLOR, width=1, style=Qt.PenStyle.DashLine)
                legend.addItem(pg.PlotDataItem(pen=dashed), PROJECTED)

    def projected(self) -> dict[str, int]:
        return dict(self._projected)

    def clear(self) -> None:
        for key, curve in self._curves.items():
            self._plot_for(key).removeItem(curve)
        self._curves.clear()
        self._series.clear()
        self.samples_seen = 0
        self._show_plots(False)

    def _show_plots(self, on: bool) -> None:
        self.idle.setVisible(not on)
        self.graphics.setVisible(on)

    def add_sample(self, sample: Sample) -> None:
        if not self.samples_seen:
            self._show_plots(True)
        self.samples_seen += 1
        for g in sample.gpus:
            self._add(f"mem:{g.name}", g.name, sample.t, g.used / GiB)
            if g.util is not None:
                self._add(f"util:{g.name}", g.name, sample.t, float(g.util))
        if sample.rss is not None:
            self._add("mem:CPU", "CPU", sample.t, sample.rss / GiB, label="llama-server RSS")
        self._add("ram:used", "system", sample.t, sample.ram_used / GiB, label="system RAM used")

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """``mem:CUDA0``, ``util:CUDA0``, ``mem:CPU`` (the server's RSS), ``ram:used``."""
        s = self._series.get(key)
        return s.arrays() if s else (np.array([]), np.array([]))

    # --- drawing --------------------------------------------------------------------------------

    def _color(self, name: str) -> tuple[int, int, int]:
        if name not in self._colors:
            gpus = sum(1 for n in self._colors if n not in ("CPU", "system"))  # in the plan's order
            self._colors[name] = SYSTEM_COLOR if name == "system" else device_color(name, gpus)
        return self._colors[name]

    def _plot_for(self, key: str) -> pg.PlotItem:
        if key.startswith("util:"):
            return self.util_plot
        if key in ("mem:CPU", "ram:used"):
            return self.ram_plot
        return self.gpu_plot

    def _add(self, key: str, device: str, t: float, v: float, *, label: str | None = None) -> None:
        s = self._series.get(key)
        if s is None:
            s = self._series[key] = _Series(self.keep)
            system = device == "system"
            pen = pg.mkPen(self._color(device), width=1 if system else 2,
                           style=Qt.PenStyle.DotLine if system else Qt.PenStyle.SolidLine)
            self._curves[key] = self._plot_for(key).plot(name=label or device, pen=pen)
        s.add(t, v)
        x, y = s.arrays()
        self._curves[key].setData(x, y)
