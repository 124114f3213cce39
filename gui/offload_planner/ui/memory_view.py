"""Per device, a horizontal stacked bar of weights, KV cache, compute and output against the device's
capacity, the margin hatched at its end and any overflow in red past it; the figures in GiB
beside it; hover gives the per-buffer breakdown with how each was computed. After a launch, a thin
bar under each device's bar marks the actual total llama.cpp logged. A drop target for tensors
dragged from the map."""

from __future__ import annotations

import html

from PySide6.QtCore import QEvent, QPoint, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QHelpEvent, QPainter, QPaintEvent, QPalette, QPen
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from offload_planner.core.memory import DeviceMemory
from offload_planner.core.units import GiB, MiB, fmt_bytes
from offload_planner.ui.device_figures import BUFFER_KINDS, DeviceFigures, counted
from offload_planner.ui.document import PlanDocument
from offload_planner.ui.palette import ACTUAL_COLOR, OVER_COLOR, device_color, hatch_brush, kind_brush

_OVERFLOW_SHARE = 0.16  # of the bar width, kept for overflow past capacity


def gib(n: float) -> str:
    """GiB with one decimal, the unit left to the reader; small sizes say MiB."""
    if 0 < abs(n) < GiB // 20:
        return f"{n / MiB:.0f} MiB" if abs(n) >= MiB else f"{n / 1024:.0f} KiB"
    return f"{n / GiB:.1f}"


def gib_unit(n: float) -> str:
    text = gib(n)
    return text if text.endswith("iB") else f"{text} GiB"


def figures_text(f: DeviceFigures) -> str:
    if f.capacity is None:
        return f"{gib_unit(f.used)} (capacity unknown)"
    return f"{gib(f.used)} / {gib_unit(f.capacity)}"


def device_tooltip(dm: DeviceMemory, actual: int | None = None) -> str:
    f = DeviceFigures.of(dm)
    lines = [f"<b>{html.escape(f.name)}</b> {html.escape(f.description)}"]
    cap = "unknown" if f.capacity is None else fmt_bytes(f.capacity)
    lines.append(
        f"projected {fmt_bytes(f.used)} of {cap}" + (f", margin {fmt_bytes(f.margin)}" if f.margin else "")
    )
    if f.over:
        lines.append(f"<span style='color:#D00000'><b>{fmt_bytes(f.over)} over</b></span>")
    elif f.left is not None:
        lines.append(f"{fmt_bytes(f.left)} left")
    if f.unread_span:
        lines.append(f"not counted: {fmt_bytes(f.unread_span)} of mmap span that is never read")
    if actual is not None:
        diff = actual - dm.total()
        lines.append(
            f"<b>actual at the last launch: {fmt_bytes(actual)}</b> as llama.cpp logged it "
            f"({'+' if diff >= 0 else '−'}{fmt_bytes(abs(diff))} against {fmt_bytes(dm.total())} projected "
            "the same way)"
        )
    rows = "".join(
        f"<tr><td>{html.escape(b.kind)}</td><td>{html.escape(b.name)}</td>"
        f"<td align=right>{counted(b) / 2**20:,.1f} MiB</td><td>{html.escape(b.why)}</td></tr>"
        for b in dm.buffers
    )
    lines.append(
        "<table cellspacing=0 cellpadding=2><tr><th align=left>kind</th><th align=left>buffer</th>"
        f"<th>size</th><th align=left>how</th></tr>{rows}</table>"
    )
    return "<br>".join(lines)


class MemoryView(QWidget):
    def __init__(self, doc: PlanDocument, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._doc = doc
        self._highlight: str | None = None
        self._actuals: dict[str, int] = {}  # device -> actual bytes logged by the last launch
        self.setMouseTracking(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.setAccessibleName("Memory per device")
        doc.analysisChanged.connect(self.update)
        doc.modelChanged.connect(lambda: self.set_actuals({}))

    # --- geometry ----------------------------------------------------------------------------

    def _line(self) -> int:
        return self.fontMetrics().height()

    def _bar_height(self) -> int:
        return int(self._line() * 1.3)

    def _actual_height(self) -> int:
        return max(3, self._line() // 5)

    def _row_height(self) -> int:
        return self._line() * 2 + self._bar_height() + self._actual_height() + 16

    def _top(self) -> int:
        return 8 + self._line() + 8  # below the verdict line

    def _rows(self) -> list[DeviceMemory]:
        a = self._doc.analysis
        return list(a.projection.devices) if a is not None and a.projection is not None else []

    def _row_rect(self, i: int) -> QRectF:
        h = self._row_height()
        return QRectF(8, self._top() + i * h, self.width() - 16, h - 8)

    def device_at(self, global_pos: QPoint) -> str | None:
        p = self.mapFromGlobal(global_pos)
        for i, dm in enumerate(self._rows()):
            if self._row_rect(i).adjusted(-4, -4, 4, 4).contains(QPointF(p)):
                return dm.device.name
        return None

    def set_drop_highlight(self, device: str | None) -> None:
        if device != self._highlight:
            self._highlight = device
            self.update()

    def set_actuals(self, actuals: dict[str, int]) -> None:
        """Actual total bytes per device from a launch ({}: none); drawn as a thin bar under each bar."""
        self._actuals = dict(actuals)
        self.update()

    @property
    def actuals(self) -> dict[str, int]:
        return dict(self._actuals)

    def _bar_rect(self, r: QRectF) -> QRectF:
        return QRectF(r.left(), r.top() + self._line() + 3, r.width(), self._bar_height())

    def actual_rect(self, i: int) -> QRectF | None:
        """The thin actual-total bar of row ``i`` (None without an actual for that device)."""
        rows = self._rows()
        if not 0 <= i < len(rows) or rows[i].device.name not in self._actuals:
            return None
        dm = rows[i]
        f = DeviceFigures.of(dm)
        bar = self._bar_rect(self._row_rect(i))
        cap_w = bar.width() * (1 - _OVERFLOW_SHARE)
        px = cap_w / (f.capacity if f.capacity else max(f.used, 1))
        # as the bar: mmap span that is never read is not counted
        shown = max(0, self._actuals[dm.device.name] - f.unread_span)
        w = min(shown * px, bar.width())
        return QRectF(bar.left(), bar.bottom() + 1, max(w, 1.0), self._actual_height())

    def sizeHint(self) -> QSize:
        n = max(3, len(self._rows()))
        return QSize(320, self._top() + n * self._row_height() + 3 * self._line())

    def minimumSizeHint(self) -> QSize:
        return QSize(240, self._top() + 3 * self._row_height())

    # --- painting ----------------------------------------------------------------------------

    def paintEvent(self, event: QPaintEvent) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        pal = self.palette()
        p.fillRect(self.rect(), pal.color(QPalette.ColorRole.Base))
        rows = self._rows()
        if not rows:
            a = self._doc.analysis
            msg = (
                a.error
                if a is not None and a.error
                else ("Projecting…" if self._doc.has_plan else "No model")
            )
            p.setPen(pal.color(QPalette.ColorRole.PlaceholderText))
            p.drawText(self.rect().adjusted(8, 8, -8, -8), Qt.TextFlag.TextWordWrap, msg)
            return
        figures = [DeviceFigures.of(dm) for dm in rows]
        self._paint_verdict(p, QRectF(8, 8, self.width() - 16, self._line()), figures)
        devices = self._doc.plan.devices if self._doc.has_plan else None
        for i, f in enumerate(figures):
            self._paint_row(p, self._row_rect(i), f, device_color(devices, f.name))
            actual = self.actual_rect(i)
            if actual is not None:
                p.fillRect(actual, ACTUAL_COLOR)
                tick = QRectF(actual.right() - 1.5, actual.top() - 3, 1.5, actual.height() + 3)
                p.fillRect(tick, ACTUAL_COLOR)
        y = self._top() + len(rows) * self._row_height()
        self._paint_legend(p, QRectF(8, y, self.width() - 16, self._line() * 2.5))

    def _paint_verdict(self, p: QPainter, r: QRectF, figures: list[DeviceFigures]) -> None:
        over = [f for f in figures if f.over]
        bold = QFont(self.font())
        bold.setBold(True)
        p.setFont(bold)
        if over:
            p.setPen(OVER_COLOR)
            names = ", ".join(f.name for f in over)
            text = f"✖ over capacity: {names}"
        else:
            p.setPen(QColor("#007A3D"))
            text = "✔ fits on every device"
        p.drawText(
            r,
            Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
            p.fontMetrics().elidedText(text, Qt.TextElideMode.ElideRight, int(r.width())),
        )
        p.setFont(self.font())
        if not self._doc.analysis_current:
            p.setPen(self.palette().color(QPalette.ColorRole.PlaceholderText))
            p.drawText(r, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, "updating…")

    def _paint_row(self, p: QPainter, r: QRectF, f: DeviceFigures, color: QColor) -> None:
        pal = self.palette()
        fm = self.fontMetrics()
        lh = self._line()
        text = pal.color(QPalette.ColorRole.Text)
        grey = pal.color(QPalette.ColorRole.PlaceholderText)
        left_mid = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
        right_mid = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
        if self._highlight == f.name:
            hl = QColor(pal.color(QPalette.ColorRole.Highlight))
            p.setPen(QPen(hl, 2))
            hl.setAlpha(40)
            p.setBrush(hl)
            p.drawRoundedRect(r.adjusted(-4, -3, 4, 3), 4, 4)
        bold = QFont(self.font())
        bold.setBold(True)
        # line 1: chip, name, description ... used / capacity
        right = figures_text(f)
        right_w = fm.horizontalAdvance(right) + 4
        chip = QRectF(r.left(), r.top() + 3, lh - 6, lh - 6)
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(color)
        p.drawRoundedRect(chip, 2, 2)
        p.setFont(bold)
        p.setPen(text)
        name_x = chip.right() + 5
        name_w = p.fontMetrics().horizontalAdvance(f.name)
        p.drawText(QRectF(name_x, r.top(), name_w + 2, lh), left_mid, f.name)
        p.setFont(self.font())
        desc_w = r.right() - right_w - (name_x + name_w + 8) - 6
        if f.description and desc_w > 24:
            p.setPen(grey)
            p.drawText(
                QRectF(name_x + name_w + 8, r.top(), desc_w, lh),
                left_mid,
                fm.elidedText(f.description, Qt.TextElideMode.ElideRight, int(desc_w)),
            )
        p.setPen(OVER_COLOR if f.over else text)
        p.drawText(QRectF(r.right() - right_w, r.top(), right_w, lh), right_mid, right)
        # line 2: the bar, capacity at (1 - overflow share) of the width
        bar = self._bar_rect(r)
        cap_w = bar.width() * (1 - _OVERFLOW_SHARE)
        scale_to = f.capacity if f.capacity else max(f.used, 1)
        px = cap_w / scale_to
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(pal.color(QPalette.ColorRole.AlternateBase))
        p.drawRect(QRectF(bar.left(), bar.top(), cap_w, bar.height()))
        x = bar.left()
        for kind, nbytes in f.by_kind:
            w = nbytes * px
            if w <= 0 or x >= bar.right():
                continue
            p.fillRect(QRectF(x, bar.top(), min(w, bar.right() - x), bar.height()), kind_brush(color, kind))
            x += w
        if f.capacity and f.margin:
            m = QRectF(bar.left() + cap_w - f.margin * px, bar.top(), f.margin * px, bar.height())
            p.fillRect(m, hatch_brush(QColor(60, 60, 60, 170)))
        if f.capacity and f.used > f.capacity:
            room = bar.width() - cap_w
            over = QRectF(bar.left() + cap_w, bar.top(), min((f.used - f.capacity) * px, room), bar.height())
            p.fillRect(over, OVER_COLOR)
            if (f.used - f.capacity) * px > room:  # clipped: a torn end
                p.setPen(QPen(pal.color(QPalette.ColorRole.Base), 2))
                xr = over.right() - 5
                p.drawLine(QPointF(xr + 2, bar.top()), QPointF(xr - 2, bar.bottom()))
        if f.capacity:
            p.setPen(QPen(text, 1.5))
            p.drawLine(
                QPointF(bar.left() + cap_w, bar.top() - 2), QPointF(bar.left() + cap_w, bar.bottom() + 2)
            )
        # line 3: breakdown ... left / over
        y3 = bar.bottom() + self._actual_height() + 3
        if f.over:
            status = f"+{gib_unit(f.over)} over"
            p.setFont(bold)
            p.setPen(OVER_COLOR)
        else:
            status = "" if f.left is None else f"{gib_unit(f.left)} left"
            p.setPen(text)
        status_w = p.fontMetrics().horizontalAdvance(status) + 4
        p.drawText(QRectF(r.right() - status_w, y3, status_w, lh), right_mid, status)
        p.setFont(self.font())
        p.setPen(grey)
        parts = [
            f"{label} {gib(n)}" for (_k, n), (_, label) in zip(f.by_kind, BUFFER_KINDS, strict=True) if n
        ]
        avail = int(r.width() - status_w - 8)
        p.drawText(
            QRectF(r.left(), y3, avail, lh),
            left_mid,
            fm.elidedText("  ".join(parts), Qt.TextElideMode.ElideRight, avail),
        )

    def _paint_legend(self, p: QPainter, r: QRectF) -> None:
        fm = self.fontMetrics()
        lh = fm.height()
        sw = lh - 4
        base = QColor("#6F6F6F")
        items: list[tuple[str, str]] = [(label, kind) for kind, label in BUFFER_KINDS]
        items += [("margin", "margin"), ("over", "over")]
        if self._actuals:
            items.append(("actual (last launch)", "actual"))
        x, y = r.left(), r.top()
        p.setPen(self.palette().color(QPalette.ColorRole.Text))
        for label, kind in items:
            w = sw + 4 + fm.horizontalAdvance(label) + 12
            if x + w > r.right():
                x, y = r.left(), y + lh + 2
            box = QRectF(x, y + 2, sw, sw)
            if kind == "margin":
                p.fillRect(box, hatch_brush(QColor(60, 60, 60, 170)))
            elif kind == "over":
                p.fillRect(box, OVER_COLOR)
            elif kind == "actual":
                p.fillRect(QRectF(box.left(), box.center().y() - 1.5, box.width(), 3), ACTUAL_COLOR)
            else:
                p.fillRect(box, kind_brush(base, kind))
            p.drawText(
                QRectF(x + sw + 4, y, w, lh),
                Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                label,
            )
            x += w

    # --- hover -------------------------------------------------------------------------------

    def event(self, e: QEvent) -> bool:
        if e.type() == QEvent.Type.ToolTip and isinstance(e, QHelpEvent):
            rows = self._rows()
            for i, dm in enumerate(rows):
                if self._row_rect(i).contains(QPointF(e.pos())):
                    actual = self._actuals.get(dm.device.name)
                    QToolTip.showText(e.globalPos(), device_tooltip(dm, actual), self)
                    return True
            QToolTip.hideText()
            e.ignore()
            return True
        return super().event(e)
