"""Per device, a horizontal stacked bar of weights, KV cache, compute and output against the device's
capacity, the margin hatched at its end and any overflow in red past it; the figures in GiB
beside it; hover gives the per-buffer breakdown with how each was computed. After a launch, a thin
bar under each device's bar marks the actual total llama.cpp logged; once the plan is edited it
describes another command and is drawn hollow and grey ("before your last edit") until the next
launch reports. The breakdown line under a bar abbreviates its labels as far as its width needs
(the tooltip keeps them whole); where even the shortest does not fit beside the status, the status
goes on a line of its own. A drop target for tensors dragged from the map."""

from __future__ import annotations

import html
from dataclasses import dataclass, replace

from PySide6.QtCore import QEvent, QPoint, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import (
    QBrush,
    QColor,
    QFont,
    QFontMetrics,
    QHelpEvent,
    QPainter,
    QPaintEvent,
    QPalette,
    QPen,
)
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from offload_planner.core.device_figures import BUFFER_KINDS, DeviceFigures, counted
from offload_planner.core.extra_context import DRAFT, MTP
from offload_planner.core.mapped_span import no_placement_fits, ram_sharers, unified_over
from offload_planner.core.memory import DeviceMemory
from offload_planner.core.plan import Plan
from offload_planner.core.speed.advice import FasterHints, expert_room, held_on_cpu
from offload_planner.core.units import GiB, MiB, fmt_bytes
from offload_planner.ui.document import PlanDocument
from offload_planner.ui.nothing_fits import nothing_fits_text
from offload_planner.ui.palette import (
    ACTUAL_COLOR,
    OVER_COLOR,
    contrast,
    device_color,
    hatch_brush,
    kind_brush,
    kind_overlay,
    readable,
)
from offload_planner.ui.room_hint import fill_action, gpus_left, ram_over_action

_OVERFLOW_SHARE = 0.16  # of the bar width, kept for overflow past capacity
FITS_COLOR = QColor("#007A3D")  # the verdict when every device fits
MARGIN_DARK = QColor(60, 60, 60, 170)  # the margin's hatch on a light background
MARGIN_LIGHT = QColor(200, 200, 200, 170)  # ... on a dark one
STALE_ACTUAL_COLOR = QColor("#8A8A8A")  # an actual marker from before the last edit, drawn hollow
STALE_NOTE = "before your last edit"
OVER_PATTERN = QBrush(QColor(255, 255, 255, 150), Qt.BrushStyle.DiagCrossPattern)

#: Extra contexts whose buffers (of any kind) the bars draw as segments of their own, after the main
#: model's kinds: a speculative draft model (-md) and the MTP context (--spec-type draft-mtp).
EXTRA_KINDS: tuple[tuple[str, str], ...] = ((DRAFT, "draft model"), (MTP, "MTP context"))
#: Every segment of a bar in order, with its label.
BAR_KINDS: tuple[tuple[str, str], ...] = BUFFER_KINDS + EXTRA_KINDS

#: The breakdown line's labels (in BAR_KINDS order) and the gap between its parts, from the
#: longest form to the shortest: the view draws the first that fits.
BREAKDOWN_FORMS: tuple[tuple[tuple[str, ...], str], ...] = (
    (tuple(label for _, label in BAR_KINDS), "  "),
    (("weights", "KV", "RS", "compute", "output", "mmproj", "draft", "MTP"), "  "),
    (("W", "KV", "RS", "C", "O", "P", "D", "MTP"), "  "),
    (("W", "KV", "RS", "C", "O", "P", "D", "MTP"), " "),
)
_FIRST_SHORT_FORM = 2  # the first form with one-letter labels


def next_step_text(gpus_over: list[str], cpu_over: bool, moe: bool, shared_ram: str = "",
                   nothing_fits: int = 0, room: tuple[tuple[str, int], ...] = (), held: int = 0) -> str:
    """Under the legend while a device is over capacity: what to do about it ("" when all fit).
    ``shared_ram``: the devices of a Mac's one memory (``CPU + MTL0``) when together over it;
    ``nothing_fits``: by how many bytes, when they are all the devices there are: no placement fits
    (what moves off a Metal GPU lands in the same RAM), so no placement preset is suggested; ``room``: the
    GPUs with room for a routed expert the CPU holds (core.speed.advice.expert_room), bytes left; ``held``:
    of the CPU's experts, those the moves or -ot rules put there (advice.held_on_cpu)."""
    if nothing_fits and shared_ram:
        return "What next: " + nothing_fits_text(shared_ram, nothing_fits)
    parts = []
    names = ", ".join(gpus_over)
    if gpus_over and moe:
        parts.append(f"Presets ▸ Fastest plan puts on {names} the routed experts that fit and the rest "
                     "on the CPU (the Problems tab names a preset per GPU).")
    elif gpus_over:
        parts.append(f"Fewer GPU layers or a smaller context (Options), or Presets ▸ Move layers… to "
                     f"the CPU, free {names}.")
    if cpu_over and room and not gpus_over:  # it said "more GPU memory takes some" beside 35 GiB left
        parts.append(f"The CPU's share is more than its RAM, and {ram_over_action(room, held)}.")
    elif cpu_over:
        parts.append("The CPU's share is more than its RAM: more GPU memory takes some (+ Virtual GPU… "
                     "plans with one); with mmap on, llama.cpp reads the rest from disk, far slower.")
    elif shared_ram:
        parts.append(f"{shared_ram} share one RAM and together take more than it (Problems has the "
                     "figures): a smaller context or KV cache type (Options) or a smaller model.")
    return "What next: " + " ".join(parts) if parts else ""

def faster_text(h: FasterHints) -> str:
    """Under the legend while everything fits: what would make the plan faster, in the window's own
    controls (:mod:`core.speed.advice`; "" when nothing would). The pane said nothing while the plan fit,
    its speed line naming the CPU's 66% of a token and no way to lower it.

    What Presets ▸ Fastest plan does comes first, after its name (a short pane shows the first lines
    only; the tooltip has it all), then "Also:" what it does not: it keeps -ngl (always-active weights
    stay where the command puts them), mmap, the moves and the -ot rules."""
    if not h:
        return ""
    fastest: list[str] = []
    other: list[str] = []
    copied = "experts" if h.moe else "weights"  # what op offload copies
    if h.room:
        room = f"{gpus_left(h.room)} can take routed experts, now read from RAM ({h.tg_share:.0%} of a token)"
        (other if h.held else fastest).append(room + (f" — {fill_action(h.room[0][0])}" if h.held else ""))
    if h.pp_share:  # Fastest plan places routed experts: a dense model's -ub is the Options' alone
        (fastest if h.moe else other).append(
            f"a larger µbatch -ub (now {h.n_ubatch}) copies the {h.cpu}'s {copied} to the GPU fewer times "
            f"({h.pp_share:.0%} of a prompt; the Speed tab plots it)")
    if h.always_active_cpu:
        other.insert(0, f"{gib_unit(h.always_active_cpu)} of always-active weights (attention, shared "
                        "experts: every token reads them) are on the CPU, where routed experts cost less "
                        "(GPU layers: all, then Presets ▸ All routed experts → CPU)")
    if h.pin:
        other.append(f"the {h.cpu}'s {copied} are copied to the GPU from the mmap'd file, at half the rate "
                     "of pinned memory: unchecking “mmap the model” (Options) pins them")
    text = f"Faster, with Presets ▸ Fastest plan: {'; '.join(fastest)}." if fastest else ""
    if other:
        text += (" Also: " if text else "Faster: ") + "; ".join(other) + "."
    return text


#: The legend's last word on the breakdown lines' bare figures.
UNIT_NOTE = "figures without a unit: GiB"


def gib(n: float) -> str:
    """GiB with one decimal, the unit left to the reader; small sizes say MiB."""
    if 0 < abs(n) < GiB // 20:
        return f"{n / MiB:.0f} MiB" if abs(n) >= MiB else f"{n / 1024:.0f} KiB"
    return f"{n / GiB:.1f}"


def gib_unit(n: float) -> str:
    text = gib(n)
    return text if text.endswith("iB") else f"{text} GiB"


def bar_figures(dm: DeviceMemory) -> DeviceFigures:
    """What a bar shows: the device's figures with the draft model's and the MTP context's buffers
    taken out of the main model's kinds into segments of their own (same total)."""
    whole = DeviceFigures.of(dm)
    keys = {k for k, _ in EXTRA_KINDS}
    main = DeviceFigures.of(replace(dm, buffers=[b for b in dm.buffers if b.owner not in keys]))
    extra = tuple((k, sum(counted(b) for b in dm.buffers if b.owner == k)) for k, _ in EXTRA_KINDS)
    return replace(whole, by_kind=main.by_kind + extra)


def figures_text(f: DeviceFigures) -> str:
    if f.capacity is None:
        return f"{gib_unit(f.used)} (capacity unknown)"
    return f"{gib(f.used)} / {gib_unit(f.capacity)}"


def breakdown_forms(f: DeviceFigures) -> list[str]:
    """The breakdown line (the non-empty kinds with their GiB) in its forms, longest first."""
    keys = [k for k, _ in BAR_KINDS]  # a form's labels by kind (a figure may list fewer kinds)
    return [
        gap.join(f"{dict(zip(keys, labels, strict=True))[k]} {gib(n)}" for k, n in f.by_kind if n)
        for labels, gap in BREAKDOWN_FORMS
    ]


def fit_breakdown(f: DeviceFigures, fm: QFontMetrics, width: int, first: int = 0) -> tuple[str, int]:
    """The longest form of the breakdown line from ``first`` on that fits ``width`` pixels and its index
    in :data:`BREAKDOWN_FORMS`; if none fits, the shortest elided (index: the number of forms)."""
    forms = breakdown_forms(f)
    for i, text in enumerate(forms):
        if i >= first and fm.horizontalAdvance(text) <= width:
            return text, i
    return fm.elidedText(forms[-1], Qt.TextElideMode.ElideRight, width), len(forms)


def full_breakdown(f: DeviceFigures) -> str:
    """The breakdown with whole labels and units, for the tooltip."""
    labels = dict(BAR_KINDS)
    return ", ".join(f"{labels[k]} {gib_unit(n)}" for k, n in f.by_kind if n)


def actual_line(dm: DeviceMemory, actual: int, stale: bool) -> str:
    if stale:
        return (
            f"<b>actual at the last launch ({STALE_NOTE}): {fmt_bytes(actual)}</b> as llama.cpp logged "
            "it for the command as it was then; the projection above is for the edited plan"
        )
    diff = actual - dm.total()
    return (
        f"<b>actual at the last launch: {fmt_bytes(actual)}</b> as llama.cpp logged it "
        f"({'+' if diff >= 0 else '−'}{fmt_bytes(abs(diff))} against {fmt_bytes(dm.total())} projected "
        "the same way)"
    )


def device_tooltip(dm: DeviceMemory, actual: int | None = None, stale: bool = False) -> str:
    """``stale``: ``actual`` was logged for the plan before the last edit."""
    f = bar_figures(dm)
    lines = [f"<b>{html.escape(f.name)}</b> {html.escape(f.description)}"]
    cap = "unknown" if f.capacity is None else fmt_bytes(f.capacity)
    lines.append(
        f"projected {fmt_bytes(f.used)} of {cap}" + (f", margin {fmt_bytes(f.margin)}" if f.margin else "")
    )
    if f.used:
        lines.append(html.escape(full_breakdown(f)))
    if f.over:
        lines.append(f"<span style='color:#D00000'><b>{fmt_bytes(f.over)} over</b></span>")
    elif f.left is not None:
        lines.append(f"{fmt_bytes(f.left)} left")
    if f.unread_span:
        lines.append(f"not counted: {fmt_bytes(f.unread_span)} of mmap span that is never read")
    if actual is not None:
        lines.append(actual_line(dm, actual, stale))
    rows = "".join(
        f"<tr><td>{html.escape(b.kind)}</td><td>{html.escape(b.name)}</td>"
        f"<td align=right>{counted(b) / MiB:,.1f} MiB</td><td>{html.escape(b.why)}</td></tr>"
        for b in dm.buffers
    )
    lines.append(
        "<table cellspacing=0 cellpadding=2><tr><th align=left>kind</th><th align=left>buffer</th>"
        f"<th>size</th><th align=left>how</th></tr>{rows}</table>"
    )
    return "<br>".join(lines)


#: The space below each device's row where the pane has room (:meth:`MemoryView._row_gap`).
ROW_GAP = 16


class MemoryView(QWidget):
    def __init__(self, doc: PlanDocument, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._doc = doc
        self._highlight: str | None = None
        self._actuals: dict[str, int] = {}  # device -> actual bytes logged by the last launch
        self._actuals_plan: Plan | None = None  # the plan that launch ran
        self._next_step_rect: QRectF | None = None
        self._next_step_shown = ""
        self._faster = ""  # what would make the plan faster (SpeedLabel's estimate)
        self._legend_hidden: list[str] = []  # the legend's labels a short pane left out
        self._legend_drawn: list[QRectF] = []
        self.setMouseTracking(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.setAccessibleName("Memory per device")
        doc.analysisChanged.connect(self.update)
        doc.analysisChanged.connect(self.updateGeometry)  # the minimum width follows the figures
        doc.planChanged.connect(self.update)  # an edit makes the actual markers stale
        doc.modelChanged.connect(lambda: self.set_actuals({}))

    # --- geometry ----------------------------------------------------------------------------

    def _line(self) -> int:
        return self.fontMetrics().height()

    def _bar_height(self) -> int:
        return int(self._line() * 1.3)

    def _actual_height(self) -> int:
        return max(3, self._line() // 5)

    def _row_height(self, gap: int | None = None) -> int:
        """A row's lines, bar and actual bar, and ``gap`` (default: :meth:`_row_gap`)."""
        lines = 3 if self.status_wrapped() else 2
        return self._line() * lines + self._bar_height() + self._actual_height() + (
            self._row_gap() if gap is None else gap)

    def _row_gap(self) -> int:
        """The space below each row: 16 px, less (down to 6) where the pane is too short for every
        row and a line of the legend under them (1024x640 with three devices cut the legend off)."""
        n = len(self._rows())
        need = self._top() + n * self._row_height(ROW_GAP) + self._line() + 4
        if not n or self.height() >= need:
            return ROW_GAP
        return max(6, ROW_GAP - -(-(need - self.height()) // n))

    def status_wrapped(self) -> bool:
        """Some row's status ("N left", "+N over") does not fit beside even the shortest form of its
        breakdown at the view's width: then every row draws its status on a line of its own under the
        breakdown (a narrow pane grows taller, not wider: a draft model and a projector add segments
        to the breakdown, and a pane as wide as their one-line breakdown squeezed the tensor map)."""
        width = self.width() - 16
        fm = self.fontMetrics()
        for dm in self._rows():
            f = bar_figures(dm)
            status, status_fm = self._status(f)
            room = width - status_fm.horizontalAdvance(status) - 12
            if fm.horizontalAdvance(breakdown_forms(f)[-1]) > room:
                return True
        return False

    def _top(self) -> int:
        return 8 + self._line() + 8  # below the verdict line

    def _rows(self) -> list[DeviceMemory]:
        a = self._doc.analysis
        return list(a.projection.devices) if a is not None and a.projection is not None else []

    def _row_rect(self, i: int) -> QRectF:
        h = self._row_height()
        return QRectF(8, self._top() + i * h, self.width() - 16, h - self._row_gap() // 2)

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

    def set_actuals(self, actuals: dict[str, int], plan: Plan | None = None) -> None:
        """Actual total bytes per device from a launch ({}: none); drawn as a thin bar under each bar.
        ``plan``: the plan that was launched (default: the document's current plan); once the
        document's plan is another, the markers are stale."""
        self._actuals = dict(actuals)
        self._actuals_plan = plan if plan is not None else self._current_plan()
        self.update()

    @property
    def actuals(self) -> dict[str, int]:
        return dict(self._actuals)

    @property
    def actuals_stale(self) -> bool:
        """The actual markers were logged for a plan other than the current one (an edit since)."""
        return bool(self._actuals) and self._current_plan() is not self._actuals_plan

    def _current_plan(self) -> Plan | None:
        return self._doc.plan if self._doc.has_plan else None

    def _bar_rect(self, r: QRectF) -> QRectF:
        return QRectF(r.left(), r.top() + self._line() + 3, r.width(), self._bar_height())

    def bar_rect(self, i: int) -> QRectF:
        """The bar of row ``i``; its last :data:`_OVERFLOW_SHARE` holds the overflow past capacity."""
        return self._bar_rect(self._row_rect(i))

    def actual_rect(self, i: int) -> QRectF | None:
        """The thin actual-total bar of row ``i`` (None without an actual for that device)."""
        rows = self._rows()
        if not 0 <= i < len(rows) or rows[i].device.name not in self._actuals:
            return None
        dm = rows[i]
        f = bar_figures(dm)
        bar = self._bar_rect(self._row_rect(i))
        cap_w = bar.width() * (1 - _OVERFLOW_SHARE)
        px = cap_w / (f.capacity if f.capacity else max(f.used, 1))
        # as the bar: mmap span that is never read is not counted
        shown = max(0, self._actuals[dm.device.name] - f.unread_span)
        w = min(shown * px, bar.width())
        return QRectF(bar.left(), bar.bottom() + 1, max(w, 1.0), self._actual_height())

    def sizeHint(self) -> QSize:
        n = max(3, len(self._rows()))
        return QSize(320, self._top() + n * self._row_height(ROW_GAP) + 3 * self._line())

    def minimumSizeHint(self) -> QSize:
        """Wide enough for every row's shortest breakdown and, on a line of its own if need be, its
        status: never elided."""
        need = 240
        for dm in self._rows():
            f = bar_figures(dm)
            status, status_fm = self._status(f)
            text_w = self.fontMetrics().horizontalAdvance(breakdown_forms(f)[-1])
            need = max(need, max(text_w, status_fm.horizontalAdvance(status) + 4) + 16 + 2)
        return QSize(need, self._top() + 3 * self._row_height(ROW_GAP))

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
        figures = [bar_figures(dm) for dm in rows]
        self._paint_verdict(p, QRectF(8, 8, self.width() - 16, self._line()), figures)
        devices = self._doc.plan.devices if self._doc.has_plan else None
        for i, f in enumerate(figures):
            self._paint_row(p, self._row_rect(i), f, device_color(devices, f.name))
            actual = self.actual_rect(i)
            if actual is not None:
                self._paint_actual(p, actual)
        y = self._top() + len(rows) * self._row_height()
        bottom = self._paint_legend(p, QRectF(8, y, self.width() - 16, max(self.height() - 2 - y, 0)))
        self._paint_next_step(p, bottom)

    def _paint_actual(self, p: QPainter, r: QRectF) -> None:
        """The actual-total bar with a tick at its end: solid, or hollow and grey when stale."""
        stale = self.actuals_stale
        color = STALE_ACTUAL_COLOR if stale else ACTUAL_COLOR
        p.fillRect(r, color)
        if stale and r.width() > 2:
            p.fillRect(r.adjusted(1, 1, -1, -1), self.palette().color(QPalette.ColorRole.Base))
        p.fillRect(QRectF(r.right() - 1.5, r.top() - 3, 1.5, r.height() + 3), color)

    def unified_over(self) -> int:
        """Bytes a Mac's CPU and Metal GPUs together take beyond its RAM (core.mapped_span.unified_over:
        ``plan`` exits 3 and names the CPU over capacity); 0 elsewhere.  Each bar can fit on its own."""
        a = self._doc.analysis
        return unified_over(a.projection) if a is not None and a.projection is not None else 0

    def _ram_sharers(self) -> str:
        """``CPU + MTL0``: the devices of one unified memory."""
        a = self._doc.analysis
        return ram_sharers(a.projection) if a is not None and a.projection is not None else ""

    def verdict(self) -> str:
        """The line above the bars as drawn at the view's width: the devices over capacity by name,
        or by number when their names do not fit (each bar says "over" in red); a Mac's devices that
        together take more than its RAM as "RAM (CPU + MTL0)" (the window said "fits on every device"
        where ``plan`` exits 3)."""
        over = [dm.device.name for dm in self._rows() if bar_figures(dm).over]
        if self.unified_over():
            over.append(f"RAM ({self._ram_sharers()})")
        if not over:
            # an --rpc server's size is not known until declared: its bar says "capacity unknown", and
            # "fits on every device" claimed what no figure showed
            unknown = any(dm.device.capacity is None for dm in self._rows())
            return "✔ fits the devices of known size" if unknown else "✔ fits on every device"
        bold = QFont(self.font())
        bold.setBold(True)
        fm = QFontMetrics(bold)
        text = f"✖ over capacity: {', '.join(over)}"
        if fm.horizontalAdvance(text) > self.width() - 16:
            text = f"✖ {len(over)} devices over capacity" if len(over) > 1 else "✖ over capacity"
        return fm.elidedText(text, Qt.TextElideMode.ElideRight, self.width() - 16)

    def _readable(self, color: QColor) -> QColor:
        """``color`` as text on the pane's background (a dark palette lightens it)."""
        return readable(color, self.palette().color(QPalette.ColorRole.Base))

    def margin_color(self) -> QColor:
        """The margin's hatch: dark grey on a light background, light grey on a dark one (where the dark
        grey hatch did not show, in the bars nor in the legend)."""
        base = self.palette().color(QPalette.ColorRole.Base)
        return MARGIN_DARK if contrast(MARGIN_DARK, base) >= 3 else MARGIN_LIGHT

    def verdict_color(self, figures: list[DeviceFigures] | None = None) -> QColor:
        """Red over capacity, green when everything fits, as text on the pane's background."""
        figures = [bar_figures(dm) for dm in self._rows()] if figures is None else figures
        over = any(f.over for f in figures) or self.unified_over() > 0
        return self._readable(OVER_COLOR if over else FITS_COLOR)

    def _paint_verdict(self, p: QPainter, r: QRectF, figures: list[DeviceFigures]) -> None:
        bold = QFont(self.font())
        bold.setBold(True)
        p.setFont(bold)
        p.setPen(self.verdict_color(figures))
        p.drawText(r, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, self.verdict())
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
        p.setPen(self._readable(OVER_COLOR) if f.over else text)
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
            seg = QRectF(x, bar.top(), min(w, bar.right() - x), bar.height())
            p.fillRect(seg, kind_brush(color, kind))
            overlay = kind_overlay(kind)
            if overlay is not None:
                p.fillRect(seg, overlay)
            x += w
        if f.capacity and f.margin:
            m = QRectF(bar.left() + cap_w - f.margin * px, bar.top(), f.margin * px, bar.height())
            p.fillRect(m, hatch_brush(self.margin_color()))
        if f.capacity and f.used > f.capacity:
            room = bar.width() - cap_w
            over = QRectF(bar.left() + cap_w, bar.top(), min((f.used - f.capacity) * px, room), bar.height())
            p.fillRect(over, OVER_COLOR)
            p.fillRect(over, OVER_PATTERN)  # texture: a red-orange GPU's bar stays apart from its overflow
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
        line3 = self._breakdown_line(r, f, self._common_form())
        if f.over:
            p.setFont(bold)
            p.setPen(self._readable(OVER_COLOR))
        else:
            p.setPen(text)
        p.drawText(line3.status_rect, right_mid, line3.status)
        p.setFont(self.font())
        p.setPen(grey)
        p.drawText(line3.text_rect, left_mid, line3.text)

    # --- the breakdown line ----------------------------------------------------------------------

    def _breakdown_line(self, r: QRectF, f: DeviceFigures, first: int = 0) -> _BreakdownLine:
        """What line 3 of a row in ``r`` shows: the status (left / over, bold when over) at the right,
        the breakdown in the longest form from ``first`` on that fits the rest."""
        y3 = self._bar_rect(r).bottom() + self._actual_height() + 3
        lh = self._line()
        status, status_fm = self._status(f)
        status_w = status_fm.horizontalAdvance(status) + 4
        if self.status_wrapped():  # the status on the next line, the breakdown across the row
            avail, status_y = max(0, int(r.width())), y3 + lh
        else:
            avail, status_y = max(0, int(r.width() - status_w - 8)), y3
        text, form = fit_breakdown(f, self.fontMetrics(), avail, first)
        status_rect = QRectF(r.right() - status_w, status_y, status_w, lh)
        return _BreakdownLine(status, status_rect, text, QRectF(r.left(), y3, avail, lh), form)

    def _status(self, f: DeviceFigures) -> tuple[str, QFontMetrics]:
        """The end of line 3, "N left" or "+N over" (bold), and the metrics of its font."""
        if f.over:
            bold = QFont(self.font())
            bold.setBold(True)
            return f"+{gib_unit(f.over)} over", QFontMetrics(bold)
        return ("" if f.left is None else f"{gib_unit(f.left)} left"), self.fontMetrics()

    def _common_form(self) -> int:
        """The form every row's breakdown takes: the shortest any row needs, so the labels read alike
        (at 1024x700 the GPUs' rows said "weights 180.9 KV 1.1 compute 0.7" and the CPU's, with its
        output too, "W 0.5 C 0.3 O 2 MiB")."""
        rows = self._rows()
        forms = [self._breakdown_line(self._row_rect(i), bar_figures(dm)).form for i, dm in enumerate(rows)]
        return min(max(forms, default=0), len(BREAKDOWN_FORMS) - 1)

    def _breakdown_lines(self) -> list[_BreakdownLine]:
        rows, first = self._rows(), self._common_form()
        return [self._breakdown_line(self._row_rect(i), bar_figures(dm), first) for i, dm in enumerate(rows)]

    def breakdown(self, i: int) -> tuple[str, QRectF] | None:
        """The breakdown text row ``i`` draws and the rect it is drawn in (None: no such row)."""
        lines = self._breakdown_lines()
        return (lines[i].text, lines[i].text_rect) if 0 <= i < len(lines) else None

    def abbreviated(self) -> bool:
        """Some row shows the one-letter labels (the legend then names them)."""
        return any(line.form >= _FIRST_SHORT_FORM for line in self._breakdown_lines())

    def legend_items(self) -> list[tuple[str, str]]:
        """The legend under the bars: (label, kind) in order."""
        if self.abbreviated():
            short = BREAKDOWN_FORMS[-1][0]
            items = [(label if label.split()[0] == s else f"{label} ({s})", kind)
                     for (kind, label), s in zip(BAR_KINDS, short, strict=True)]
        else:
            items = [(label, kind) for kind, label in BAR_KINDS]
        # a hybrid model's recurrent state, the projector, the draft model and the MTP context are
        # named only when some bar has them
        shown = {k for dm in self._rows() for k, n in bar_figures(dm).by_kind if n}
        optional = {"rs", "mmproj"} | {k for k, _ in EXTRA_KINDS}
        items = [(label, kind) for label, kind in items if kind not in optional or kind in shown]
        items += [("margin", "margin"), ("over", "over")]
        figures = [n for dm in self._rows() for _k, n in bar_figures(dm).by_kind if n]
        bare = any(not gib(n).endswith("iB") for n in figures)
        if bare:  # some figure under a bar is in GiB without saying so
            items.append((UNIT_NOTE, "note"))
        if self._actuals:
            stale = self.actuals_stale
            items.append((f"actual ({STALE_NOTE})" if stale else "actual (last launch)", "actual"))
        return items

    def legend_layout(self, r: QRectF) -> tuple[list[tuple[str, str, QRectF]], list[str]]:
        """Each legend item (label, kind, rect) wrapped to ``r``'s width, on as many lines as ``r``'s
        height holds (at least one), and the labels left out: a short pane (1024x640 with three
        devices) cut the second line off; the last line shown then ends with "… N more" and the
        legend's tooltip names them all."""
        fm = self.fontMetrics()
        lh = fm.height()
        sw = lh - 4
        placed: list[tuple[str, str, QRectF]] = []
        x, y = r.left(), r.top()
        for label, kind in self.legend_items():
            w = sw + 4 + fm.horizontalAdvance(label) + 12
            if x + w > r.right() and x > r.left():
                x, y = r.left(), y + lh + 2
            placed.append((label, kind, QRectF(x, y, w, lh)))
            x += w
        last_top = r.top() + max(0, int((r.height() + 2) // (lh + 2)) - 1) * (lh + 2)
        if placed[-1][2].top() <= last_top:
            return placed, []
        kept = [item for item in placed if item[2].top() <= last_top]
        more_w = fm.horizontalAdvance(f"… {len(placed)} more")
        while len(kept) > 1 and kept[-1][2].top() == last_top and kept[-1][2].right() + more_w > r.right():
            kept.pop()
        return kept, [label for label, _k, _r in placed[len(kept):]]

    def legend_hidden(self) -> list[str]:
        """The legend's labels left out at the view's size as last drawn ([] when all are shown)."""
        return list(self._legend_hidden)

    def legend_drawn(self) -> list[QRectF]:
        """The rects of the legend's items (and its "… N more") as last drawn."""
        return list(self._legend_drawn)

    def _paint_legend(self, p: QPainter, r: QRectF) -> float:
        """Draws the legend from the top of ``r``, wrapped to its width and cut to its height (see
        :meth:`legend_layout`); returns its bottom."""
        fm = self.fontMetrics()
        lh = fm.height()
        sw = lh - 4
        base = QColor("#6F6F6F")
        placed, hidden = self.legend_layout(r)
        self._legend_hidden, self._legend_drawn = hidden, [rect for _l, _k, rect in placed]
        text = self.palette().color(QPalette.ColorRole.Text)
        grey = self.palette().color(QPalette.ColorRole.PlaceholderText)
        left_mid = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
        p.setPen(text)
        for label, kind, rect in placed:
            x, y, w = rect.left(), rect.top(), rect.width()
            box = QRectF(x, y + 2, sw, sw)
            if kind == "margin":
                p.fillRect(box, hatch_brush(self.margin_color()))
            elif kind == "over":
                p.fillRect(box, OVER_COLOR)
                p.fillRect(box, OVER_PATTERN)
            elif kind == "note":
                p.setPen(grey)
                p.drawText(QRectF(x, y, w, lh), left_mid, label)
                p.setPen(text)
                continue
            elif kind == "actual":
                self._paint_actual(p, QRectF(box.left(), box.center().y() - 1.5, box.width(), 3))
            else:
                p.fillRect(box, kind_brush(base, kind))
                overlay = kind_overlay(kind)
                if overlay is not None:
                    p.fillRect(box, overlay)
            p.drawText(QRectF(x + sw + 4, y, w, lh), left_mid, label)
        bottom = placed[-1][2].top() + lh
        if hidden:
            more = f"… {len(hidden)} more"
            last = placed[-1][2]
            at = QRectF(last.right(), last.top(), fm.horizontalAdvance(more) + 2, lh)
            if at.right() > r.right() + 1:  # one item alone on its line: under it, if at all
                at = QRectF(r.left(), last.top(), at.width(), lh)
            p.setPen(grey)
            p.drawText(at, left_mid, more)
            p.setPen(text)
            self._legend_drawn.append(at)
        return bottom

    # --- what next -----------------------------------------------------------------------------

    def set_faster(self, text: str) -> None:
        """What would make the plan faster (:func:`faster_text`), shown while nothing is over capacity."""
        if text != self._faster:
            self._faster = text
            self.update()

    def next_step(self) -> str:
        """Under the legend while a device is over capacity: where the way out is; while all fit, what
        would make the plan faster (:meth:`set_faster`; "" when nothing would)."""
        return self._over_step() or self._faster

    def _over_step(self) -> str:
        over = [dm.device for dm in self._rows() if bar_figures(dm).over]
        moe = self._doc.has_plan and bool(self._doc.plan.model.summary.n_expert)
        a = self._doc.analysis
        short = self.unified_over()
        shared = self._ram_sharers() if short else ""
        gpus = [d.name for d in over if d.is_gpu]
        nothing = no_placement_fits(a.projection) if a is not None and a.projection is not None else 0
        cpu_over = any(not d.is_gpu for d in over)
        current = a is not None and a.projection is not None and self._doc.analysis_current
        room = expert_room(self._doc.plan, a.projection, self._doc.placement) if (
            cpu_over and moe and current and a is not None and a.projection is not None) else ()
        short = sum(bar_figures(dm).over for dm in self._rows() if not dm.device.is_gpu)
        room = room if sum(b for _, b in room) >= short else ()  # else more GPU memory is what helps
        held = held_on_cpu(self._doc.plan, self._doc.placement) if room else 0
        return next_step_text(gpus, cpu_over, moe, shared, nothing, room, held)

    def next_step_rect(self) -> QRectF | None:
        """Where :meth:`next_step` is drawn (None when it is not)."""
        return self._next_step_rect

    def _paint_next_step(self, p: QPainter, top: float) -> None:
        text = self.next_step()
        self._next_step_rect = None
        if not text:
            return
        width = self.width() - 16
        y = top + self._line() // 2
        shown = self._fit_words(text, width, self.height() - 4 - y)  # a short pane: the tooltip has it all
        if not shown:
            return
        flags = int(Qt.TextFlag.TextWordWrap | Qt.AlignmentFlag.AlignLeft)
        need = self.fontMetrics().boundingRect(0, 0, width, 10_000, flags, shown).height()
        r = QRectF(8, y, width, need)
        p.setPen(self.palette().color(QPalette.ColorRole.Text))
        p.drawText(r, flags, shown)
        self._next_step_rect = r
        self._next_step_shown = shown

    def _fit_words(self, text: str, width: int, height: float) -> str:
        """``text`` wrapped to ``width``, cut after the last word that keeps it within ``height``
        (with "…"); "" if not even one line fits."""
        flags = int(Qt.TextFlag.TextWordWrap | Qt.AlignmentFlag.AlignLeft)
        fm = self.fontMetrics()
        words = text.split(" ")
        for n in range(len(words), 0, -1):
            candidate = " ".join(words[:n]) + ("" if n == len(words) else " …")
            if fm.boundingRect(0, 0, width, 10_000, flags, candidate).height() <= height:
                return candidate
        return ""

    def next_step_shown(self) -> str:
        """The part of :meth:`next_step` drawn at the view's size ("" when none is)."""
        return self._next_step_shown if self._next_step_rect is not None else ""

    # --- hover -------------------------------------------------------------------------------

    def event(self, e: QEvent) -> bool:
        if e.type() == QEvent.Type.ToolTip and isinstance(e, QHelpEvent):
            rows = self._rows()
            for i, dm in enumerate(rows):
                if self._row_rect(i).contains(QPointF(e.pos())):
                    actual = self._actuals.get(dm.device.name)
                    tip = device_tooltip(dm, actual, self.actuals_stale)
                    QToolTip.showText(e.globalPos(), tip, self)
                    return True
            r = self._next_step_rect
            if r is not None and r.contains(QPointF(e.pos())):
                QToolTip.showText(e.globalPos(), self.next_step(), self)
                return True
            if self._legend_hidden and any(x.contains(QPointF(e.pos())) for x in self._legend_drawn):
                every = ", ".join(lab for lab, _k in self.legend_items())
                QToolTip.showText(e.globalPos(), f"Legend: {every}", self)
                return True
            QToolTip.hideText()
            e.ignore()
            return True
        return super().event(e)


@dataclass(frozen=True)
class _BreakdownLine:
    status: str
    status_rect: QRectF
    text: str
    text_rect: QRectF
    form: int  # index in BREAKDOWN_FORMS; len(BREAKDOWN_FORMS): the shortest, elided
