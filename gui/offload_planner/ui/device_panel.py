"""DEVICES: CPU RAM, detected GPUs and virtual GPUs, each with its size and safety margin (both
editable, each edit one undo step); add and remove virtual GPUs; a drop target for tensors."""

from __future__ import annotations

import html

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, QPoint, Qt, Signal
from PySide6.QtGui import QColor, QPainter, QPaintEvent, QPalette, QPen, QResizeEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSizePolicy,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from offload_planner.core.devices import (
    Device,
    DeviceKind,
    canonical_device_name,
    declared_name_problem,
    kind_of,
)
from offload_planner.core.errors import PlannerError
from offload_planner.core.plan_edits import next_gpu_name
from offload_planner.core.speed.catalogue import CARDS, Card, card
from offload_planner.core.units import GiB, fmt_bytes
from offload_planner.ui.document import PlanDocument
from offload_planner.ui.palette import device_color
from offload_planner.ui.settings import card_label, virtual_description

_Index = QModelIndex | QPersistentModelIndex

COL_NAME, COL_SIZE, COL_MARGIN = range(3)
_HEADERS = ("Device", "Size", "Margin")
_TIPS = (
    "llama.cpp's device order: offload devices first, then the CPU",
    "What the plan may use: free memory when known, else the total (double-click to set)",
    "Kept free on the device (double-click to set)",
)


class DeviceListModel(QAbstractTableModel):
    """Thin adapter over the plan's DeviceSet, in llama.cpp order (GPUs, then CPU)."""

    refused = Signal(str)  # an edit not taken, and why

    def __init__(self, doc: PlanDocument) -> None:
        super().__init__(doc)
        self._doc = doc
        self._devices: list[Device] = []
        doc.planChanged.connect(self._refresh)
        doc.modelChanged.connect(self._refresh)
        self._refresh()

    def _refresh(self) -> None:
        devs = list(self._doc.plan.devices) if self._doc.has_plan else []
        if [d.name for d in devs] != [d.name for d in self._devices]:
            self.beginResetModel()
            self._devices = devs
            self.endResetModel()
        else:
            self._devices = devs
            if devs:
                self.dataChanged.emit(self.index(0, 0), self.index(len(devs) - 1, 2))

    def device(self, row: int) -> Device | None:
        return self._devices[row] if 0 <= row < len(self._devices) else None

    def row_of(self, name: str) -> int | None:
        return next((i for i, d in enumerate(self._devices) if d.name == name), None)

    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._devices)

    def columnCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else 3

    def headerData(
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> object:
        if orientation == Qt.Orientation.Horizontal and 0 <= section < 3:
            if role == Qt.ItemDataRole.DisplayRole:
                return _HEADERS[section]
            if role == Qt.ItemDataRole.ToolTipRole:
                return _TIPS[section]
        return None

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> object:
        d = self.device(index.row()) if index.isValid() else None
        if d is None:
            return None
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            if col == COL_NAME:
                return d.name + ("  (virtual)" if d.source == "declared" and d.is_gpu else "")
            if col == COL_SIZE:
                return "?" if d.capacity is None else f"{d.capacity / GiB:.1f} GiB"
            return f"{d.margin / GiB:.1f} GiB"
        if role == Qt.ItemDataRole.EditRole:
            if col == COL_SIZE:
                return round((d.capacity or 0) / GiB, 2)
            if col == COL_MARGIN:
                return round(d.margin / GiB, 2)
        if role == Qt.ItemDataRole.DecorationRole and col == COL_NAME:
            devices = self._doc.plan.devices if self._doc.has_plan else None
            return device_color(devices, d.name)
        if role == Qt.ItemDataRole.TextAlignmentRole and col != COL_NAME:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ToolTipRole:
            parts = [f"<b>{d.name}</b> {d.description}", f"source: {d.source}"]
            if d.total is not None:
                parts.append(f"total {fmt_bytes(d.total)}")
            elif d.capacity is None:  # an --rpc server: its memory is not asked of it
                parts.append("size unknown (?): double-click Size to type it (on the command line: "
                             f"--device {d.name}=SIZE), and the bars say whether the plan fits it")
            if d.free is not None:
                parts.append(f"free {fmt_bytes(d.free)}")
            parts.append(f"margin {fmt_bytes(d.margin)}")
            c = card(dict(d.hardware).get("card", ""))
            if c is not None:  # what the speed estimate takes for this GPU
                parts.append(f"speeds of the {html.escape(card_label(c.key))} (catalogue): {card_figures(c)}")
            parts.append("Drop tensors here to move them to this device")
            return "<br>".join(parts)
        return None

    def flags(self, index: _Index) -> Qt.ItemFlag:
        f = Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
        if index.isValid() and index.column() in (COL_SIZE, COL_MARGIN):
            f |= Qt.ItemFlag.ItemIsEditable
        return f

    def setData(self, index: _Index, value: object, role: int = Qt.ItemDataRole.EditRole) -> bool:
        d = self.device(index.row()) if index.isValid() else None
        if d is None or role != Qt.ItemDataRole.EditRole or not isinstance(value, int | float):
            return False
        nbytes = round(float(value) * GiB)
        if index.column() == COL_MARGIN:
            room = d.capacity
            if room is not None and nbytes >= room > 0:  # as --device CUDA0=24GiB,margin=30GiB is refused
                self.refused.emit(f"{d.name}: a margin of {fmt_bytes(nbytes)} leaves nothing of its "
                                  f"{fmt_bytes(room)}; the margin is what the plan keeps free, make it "
                                  "smaller than the size")
                return False
            self._doc.set_device_margin(d.name, max(0, nbytes))
            return True
        if index.column() == COL_SIZE and nbytes > 0:
            if nbytes <= d.margin:
                self.refused.emit(f"{d.name}: a size of {fmt_bytes(nbytes)} leaves nothing after its margin "
                                  f"of {fmt_bytes(d.margin)}; lower the margin first")
                return False
            self._doc.set_device_size(d.name, nbytes)
            return True
        return False


class DeviceListView(QTableView):
    """The device list; a :class:`DeviceDropTarget` for tensors dragged from the map."""

    def __init__(self, model: DeviceListModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setModel(model)
        self._model = model
        self._highlight: str | None = None
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setEditTriggers(
            QAbstractItemView.EditTrigger.DoubleClicked | QAbstractItemView.EditTrigger.EditKeyPressed
        )
        self.setShowGrid(False)
        self.verticalHeader().hide()
        self.setAccessibleName("Devices")
        hh = self.horizontalHeader()
        hh.setSectionResizeMode(COL_NAME, QHeaderView.ResizeMode.Stretch)
        hh.setSectionResizeMode(COL_SIZE, QHeaderView.ResizeMode.ResizeToContents)
        hh.setSectionResizeMode(COL_MARGIN, QHeaderView.ResizeMode.ResizeToContents)
        self.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 8)

    def device_at(self, global_pos: QPoint) -> str | None:
        idx = self.indexAt(self.viewport().mapFromGlobal(global_pos))
        d = self._model.device(idx.row()) if idx.isValid() else None
        return d.name if d is not None else None

    def set_drop_highlight(self, device: str | None) -> None:
        if device != self._highlight:
            self._highlight = device
            self.viewport().update()

    def device_rect_center(self, name: str) -> QPoint:
        """Global position of a device's row (for tests and keyboard users)."""
        row = self._model.row_of(name)
        assert row is not None
        rect = self.visualRect(self._model.index(row, COL_NAME))
        return self.viewport().mapToGlobal(rect.center())

    def paintEvent(self, event: QPaintEvent) -> None:
        super().paintEvent(event)
        row = self._model.row_of(self._highlight) if self._highlight else None
        if row is None:
            return
        r = self.visualRect(self._model.index(row, 0)).united(self.visualRect(self._model.index(row, 2)))
        p = QPainter(self.viewport())
        hl = QColor(self.palette().color(QPalette.ColorRole.Highlight))
        p.setPen(QPen(hl, 2))
        hl.setAlpha(50)
        p.setBrush(hl)
        p.drawRect(r.adjusted(1, 1, -1, -1))


def card_figures(c: Card) -> str:
    """A catalogue card's figures as the speed estimate takes them."""
    out = [f"{c.bandwidth_gbs:g} GB/s memory"]
    out.append(f"PCIe {c.pcie[0]}.0 x{c.pcie[1]}" if c.pcie is not None else "unified memory (no host copy)")
    if c.tflops is not None:
        out.append(f"{c.tflops:g} TFLOPS")
    return ", ".join(out)


#: The dialog's line under "Card" when none is picked.
NO_CARD = ("Default speeds (the estimate's assumptions name them). Pick a card for its memory bandwidth, "
           "PCIe link and compute, and its memory size.")


GPU_KINDS = (DeviceKind.CUDA, DeviceKind.ROCM, DeviceKind.VULKAN, DeviceKind.METAL, DeviceKind.SYCL)


class AddGpuDialog(QDialog):
    """Name and size of a virtual GPU."""

    def __init__(self, doc: PlanDocument, default_margin: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Add a virtual GPU")
        self._doc = doc
        self.kind = QComboBox()
        for k in GPU_KINDS:
            self.kind.addItem(k.value, k.value)
        self.card = QComboBox()  # speed figures (and size) from the catalogue of spec sheets
        self.card.addItem("(none: default speeds)", "")
        for c in CARDS:  # with the word --device takes for it, as the command line writes it
            self.card.addItem(f"{c.name} ({c.key})", c.key)
        self.card.currentIndexChanged.connect(self._card_chosen)
        self.card.setToolTip("A card of the catalogue sets the GPU's memory and the speeds of the tg/pp "
                             "estimate; (none): default speeds. In brackets: its name on the command "
                             "line, e.g. --device CUDA1=rtx3090")
        self.card_info = QLabel(NO_CARD)  # what picking the card sets
        self.card_info.setWordWrap(True)
        self.card_info.setEnabled(False)  # greyed, a hint
        self.name = QLineEdit(next_gpu_name(doc.plan.devices))
        self.size_spin = QDoubleSpinBox()
        self.size_spin.setRange(0.5, 4096)
        self.size_spin.setDecimals(1)
        self.size_spin.setSuffix(" GiB")
        self.size_spin.setValue(24.0)
        self.margin_spin = QDoubleSpinBox()
        self.margin_spin.setRange(0, 256)
        self.margin_spin.setDecimals(2)
        self.margin_spin.setSingleStep(0.25)
        self.margin_spin.setSuffix(" GiB")
        self.margin_spin.setValue(default_margin / GiB)
        self.error = QLabel()
        self.error.setStyleSheet("color: #D00000")
        self.kind.currentTextChanged.connect(lambda k: self.name.setText(next_gpu_name(doc.plan.devices, k)))
        form = QFormLayout(self)
        form.addRow("Card", self.card)
        form.addRow("", self.card_info)
        form.addRow("Backend", self.kind)
        form.addRow("Name", self.name)
        form.addRow("Memory", self.size_spin)
        form.addRow("Margin", self.margin_spin)
        form.addRow(self.error)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)

    def _card_chosen(self) -> None:
        c = card(str(self.card.currentData() or ""))
        if c is None:
            self.card_info.setText(NO_CARD)
            return
        self.card_info.setText(card_figures(c) + ("" if c.vram_gib is not None else
                                                  "; comes in several memory sizes: set Memory"))
        if c.vram_gib is not None:
            self.size_spin.setValue(c.vram_gib)
        kind = {"Metal": "Metal", "ROCm": "ROCm"}.get(c.kind, "CUDA")
        if self.kind.findData(kind) >= 0:
            self.kind.setCurrentIndex(self.kind.findData(kind))

    def device(self) -> Device | None:
        name = self.name.text().strip()
        try:
            kind = kind_of(name)
        except PlannerError as e:
            self.error.setText(str(e))
            return None
        if kind is DeviceKind.CPU or kind is DeviceKind.RPC:
            self.error.setText("a virtual GPU needs a GPU name such as CUDA1, ROCm0 or Vulkan0")
            return None
        if declared_name_problem(name):  # CUDA01, CUDA: a device llama.cpp never has
            self.error.setText(declared_name_problem(name))
            return None
        if self._doc.plan.devices.by_name(name) is not None:
            self.error.setText(f"{name} is already there")
            return None
        canonical = canonical_device_name(name)  # cuda1: CUDA1; Metal0 / mtl0: MTL0, as llama.cpp names it
        size = int(self.size_spin.value() * GiB)
        if int(self.margin_spin.value() * GiB) >= size:  # as --device ...,margin= and the list refuse it
            self.error.setText("the margin leaves nothing of the memory: make it smaller than the memory")
            return None
        hardware = (("card", key),) if (key := str(self.card.currentData() or "")) else ()
        return Device(
            canonical,
            kind,
            size,
            None,
            description=virtual_description(size, hardware),
            source="declared",
            margin=int(self.margin_spin.value() * GiB),
            margin_given=True,  # the dialog's margin, 0 included
            hardware=hardware,
        )

    def accept(self) -> None:
        if self.device() is not None:
            super().accept()


class DevicePanel(QWidget):
    """The DEVICES box: list, notice about detection, add/remove buttons."""

    message = Signal(str)

    def __init__(self, doc: PlanDocument, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._doc = doc
        self.default_margin = 1 * GiB
        self.model = DeviceListModel(doc)
        self.model.refused.connect(self.message)
        self.view = DeviceListView(self.model)
        # the list grows into the room there is; its own size hint (ten rows) must not push the
        # panel's height-for-width minimum past the column (the notice wraps), squeezing the options
        policy = self.view.sizePolicy()
        policy.setVerticalPolicy(QSizePolicy.Policy.Ignored)
        self.view.setSizePolicy(policy)
        self._fit_rows()
        for sig in (self.model.modelReset, self.model.rowsInserted, self.model.rowsRemoved):
            sig.connect(self._fit_rows)
        self.notice = QLabel()
        self.notice.setWordWrap(True)
        self.notice.setTextFormat(Qt.TextFormat.RichText)
        self.notice.setStyleSheet("QLabel { background: palette(alternate-base); padding: 4px; }")
        self.notice.hide()
        self.add_button = QPushButton("+ Virtual GPU…")
        self.add_button.setToolTip("Plan for a GPU this machine does not have (or NVML cannot see)")
        self.remove_button = QPushButton("Remove")
        self.remove_button.setToolTip("Remove the selected GPU (its moved tensors go back to default)")
        self.add_button.clicked.connect(self.add_virtual_gpu)
        self.remove_button.clicked.connect(self.remove_selected)
        buttons = QHBoxLayout()
        buttons.addWidget(self.add_button)
        buttons.addWidget(self.remove_button)
        buttons.addStretch(1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.view, 1)
        lay.addWidget(self.notice)
        lay.addLayout(buttons)
        self.view.selectionModel().selectionChanged.connect(self._update_buttons)
        self.model.modelReset.connect(self._update_buttons)
        self._update_buttons()

    def _fit_rows(self) -> None:
        """The list never shows fewer than all its devices."""
        row = self.view.verticalHeader().defaultSectionSize()
        n = max(2, self.model.rowCount())
        self.view.setMinimumHeight(
            self.view.horizontalHeader().sizeHint().height() + n * row + 2 * self.view.frameWidth() + 2
        )

    def show_notice(self, text: str) -> None:
        self.notice.setText(text)
        self.notice.setVisible(bool(text))
        self._fit_notice()

    def _fit_notice(self) -> None:
        """A wrapped label's minimum is one line; make it the wrapped height at its width, so that a
        short column scrolls (the window's left pane) instead of drawing the notice over the list."""
        if self.notice.isVisible() or self.notice.text():
            w = max(self.notice.width(), 100)
            self.notice.setMinimumHeight(self.notice.heightForWidth(w))

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_notice()

    def _selected(self) -> Device | None:
        rows = self.view.selectionModel().selectedRows()
        return self.model.device(rows[0].row()) if rows else None

    def _update_buttons(self) -> None:
        d = self._selected()
        self.remove_button.setEnabled(d is not None and d.is_gpu)
        self.add_button.setEnabled(self._doc.has_plan)

    def add_virtual_gpu(self) -> None:
        if not self._doc.has_plan:
            return
        dlg = AddGpuDialog(self._doc, self.default_margin, self)
        if dlg.exec() == QDialog.DialogCode.Accepted:
            dev = dlg.device()
            if dev is not None:
                self._doc.add_device(dev)

    def remove_selected(self) -> None:
        d = self._selected()
        if d is not None and d.is_gpu:
            self._doc.remove_device(d.name)
