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

guard_pyside_emit_refcount()

DEFAULT_KEEP = 2400  # 10 minutes at 4 Hz


def device_color(name: str, index: int) -> tuple[int, int, int]:
    if name == "CPU":
        return (90, 90, 90)
    c = pg.intColor(index, hues=8, values=1, maxValue=220)
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


class TelemetryView(QWidget):
    """Three stacked plots: GPU memory (GiB), RAM (GiB) and GPU utilisation (%)."""

    def __init__(self, parent: QWidget | None = None, *, keep: int = DEFAULT_KEEP) -> None:
        super().__init__(parent)
        self.keep = keep
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.hide()
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setBackground(None)
        self.gpu_plot = self.graphics.addPlot(row=0, col=0, title="GPU memory")
        self.ram_plot = self.graphics.addPlot(row=1, col=0, title="RAM")
        self.util_plot = self.graphics.addPlot(row=2, col=0, title="GPU utilisation")
        for p, unit in ((self.gpu_plot, "GiB"), (self.ram_plot, "GiB"), (self.util_plot, "%")):
            p.setLabel("left", unit)
            p.setLabel("bottom", "s")
            p.showGrid(x=True, y=True, alpha=0.2)
            p.addLegend(offset=(5, 5))
        self.util_plot.setYRange(0, 100)
        self.ram_plot.setXLink(self.gpu_plot)
        self.util_plot.setXLink(self.gpu_plot)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.message)
        lay.addWidget(self.graphics, 1)
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
            line = pg.InfiniteLine(pos=value / GiB, angle=0, pen=pen, movable=False,
                                   label=f"{name} projected",
                                   labelOpts={"position": 0.05, "color": pen.color()})
            plot.addItem(line, ignoreBounds=False)
            self._lines[name] = line

    def projected(self) -> dict[str, int]:
        return dict(self._projected)

    def clear(self) -> None:
        for key, curve in self._curves.items():
            self._plot_for(key).removeItem(curve)
        self._curves.clear()
        self._series.clear()
        self.samples_seen = 0

    def add_sample(self, sample: Sample) -> None:
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
            grey = (160, 160, 160)
            self._colors[name] = grey if name == "system" else device_color(name, len(self._colors))
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
            pen = pg.mkPen(self._color(device), width=2 if device != "system" else 1)
            self._curves[key] = self._plot_for(key).plot(name=label or device, pen=pen)
        s.add(t, v)
        x, y = s.arrays()
        self._curves[key].setData(x, y)
