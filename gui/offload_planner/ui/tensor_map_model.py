"""Qt table model over the document's :class:`TensorGrid`: rows = layers, columns = role groups."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QFont

from offload_planner.core import move_preview
from offload_planner.core.device_figures import DeviceFigures
from offload_planner.core.draft_moves import DRAFT_PREFIX, is_draft_name
from offload_planner.core.extra_context import DRAFT, MMPROJ
from offload_planner.core.move_preview import move_deltas
from offload_planner.core.plan import Plan
from offload_planner.core.recurrent_state import layer_cache_note
from offload_planner.core.tensor_grid import EMPTY, Cell, Row, TensorGrid
from offload_planner.core.units import fmt_bytes
from offload_planner.ui.document import PlanDocument
from offload_planner.ui.palette import section_tint
from offload_planner.ui.rates import change_text, rate_text

CELL_ROLE = Qt.ItemDataRole.UserRole + 1  # the Cell
FRACTION_ROLE = Qt.ItemDataRole.UserRole + 2  # bytes / the column's largest cell, 0..1
SECTION_ROLE = Qt.ItemDataRole.UserRole + 3  # "" (the main model), DRAFT or MMPROJ
SECTION_START_ROLE = Qt.ItemDataRole.UserRole + 4  # the first row of a draft / projector section

#: What the moved mark means: a tensor the plan puts elsewhere than llama.cpp's default placement, moved
#: by hand or by a preset (Presets ▸ Fastest plan moves tensors too)
MOVED_MEANING = "moved from llama.cpp's default placement, by you or a preset"


_Index = QModelIndex | QPersistentModelIndex


def _shape(shape: tuple[int, ...]) -> str:
    return " x ".join(str(d) for d in shape)


def row_section(row: Row) -> str:
    """Which model a map row belongs to: "" (the main model), DRAFT (-md) or MMPROJ (--mmproj)."""
    if row.key.startswith(DRAFT_PREFIX):
        return DRAFT
    return MMPROJ if row.key.startswith("mm.") else ""


def row_place(row: Row) -> str:
    """What a row holds, in words: "layer 7", "input layer", "vision block 3", ..."""
    if row.layer is not None:
        return f"layer {row.layer}"
    key = row.key.removeprefix(DRAFT_PREFIX)
    if key.startswith("blk."):
        return f"layer {key.removeprefix('blk.')}"
    if key.startswith("mm.blk."):
        return f"vision block {key.removeprefix('mm.blk.')}"
    return {
        "embd": "input layer",
        "output": "output layer",
        "mm.in": "patch and position embeddings",
        "mm.out": "final norm and projection into the text model",
    }.get(key, row.label)


def _flag_value(argv: list[str], flags: tuple[str, ...]) -> str:
    for i, a in enumerate(argv):
        if a in flags and i + 1 < len(argv):
            return argv[i + 1]
        for f in flags:
            if a.startswith(f + "="):
                return a.split("=", 1)[1]
    return ""


def section_file(plan: Plan, section: str) -> str:
    """The file name of the plan's draft model or projector ("" when unknown)."""
    argv = list(plan.extra_args)
    if section == DRAFT:
        loc = _flag_value(argv, ("-md", "--model-draft"))
    else:
        setup = plan.mmproj()
        loc = setup.location if setup is not None else ""
    return Path(loc).name if loc else ""


def row_tooltip(grid: TensorGrid, section: int, plan: Plan | None,
                left: Mapping[str, int] | None = None) -> str:
    """The row header's tooltip: which model, what the row holds, on which devices, what a click does,
    and (a layer of the main model) what moving it would change; ``left``: as in
    :func:`names_preview_html`."""
    row = grid.rows[section]
    cells = (grid.cell(section, c) for c in range(len(grid.columns)))
    devs = sorted({d for cell in cells for d, _ in cell.device_bytes}, key=str)
    where = f"{html.escape(row_place(row))}: {html.escape(', '.join(d or 'not loaded' for d in devs))}"
    kind = row_section(row)
    if not kind:
        cache = layer_cache_note(plan.model, row.layer) if plan is not None and row.layer is not None else ""
        tip = f"{where}<br>{html.escape(cache)}<br>" if cache else f"{where}<br>"
        tip += "Click: select the whole layer"
        if plan is None:
            return tip
        movable = [n for c in range(len(grid.columns)) for n in grid.cell(section, c).movable_names]
        preview = names_preview_html(plan, movable, set(devs), left)  # the whole layer, as a click selects
        return f"{tip}<br>{preview.replace('Moving it', 'Moving the layer', 1)}" if preview else tip
    name = section_file(plan, kind) if plan is not None else ""
    of = f" {html.escape(name)}" if name else ""
    if kind == DRAFT:
        return (f"<b>Draft model</b>{of} (-md), speculative decoding: {where}<br>"
                "Click: select the whole layer; moving it writes an -otd rule")
    return (f"<b>Multimodal projector</b>{of} (--mmproj): {where}<br>"
            "Not movable tensor by tensor: llama.cpp loads the whole projector on one device "
            "(--no-mmproj-offload: the CPU)")


def cell_summary(grid: TensorGrid, row: int, col: int) -> str:
    cell = grid.cell(row, col)
    r, c = grid.rows[row], grid.columns[col]
    where = f"layer {r.layer}" if r.layer is not None else r.label
    if not cell.items:
        return f"{where}, {c.label}: empty"
    devs = ", ".join(f"{d or 'not loaded'} {fmt_bytes(b)}" for d, b in cell.device_bytes)
    return f"{where}, {c.label}: {len(cell.items)} tensors, {devs}"


def cell_tooltip(grid: TensorGrid, row: int, col: int) -> str:
    cell = grid.cell(row, col)
    r, c = grid.rows[row], grid.columns[col]
    where = row_place(r)
    owner = {DRAFT: "draft model, ", MMPROJ: "projector, "}.get(row_section(r), "")
    head = f"<b>{html.escape(owner + where)} · {html.escape(c.label)}</b> — {fmt_bytes(cell.nbytes)}"
    lines = [head]
    if cell.moved:
        lines.append(f"◆ {MOVED_MEANING}")
    if not cell.movable and cell.items:
        lines.append(f"<i>not movable: {html.escape(cell.not_movable_reason)}</i>")
    rows = []
    for item in cell.items[:24]:
        p = item.placed
        t = p.tensor
        dev = p.device or "not loaded"
        buft = f" ({p.buft})" if p.buft and p.buft != p.device else ""
        rows.append(
            f"<tr><td>{html.escape(p.name)}</td><td>{t.type.name}</td><td>{_shape(t.shape)}</td>"
            f"<td align=right>{fmt_bytes(t.nbytes)}</td><td><b>{html.escape(dev)}</b>{html.escape(buft)}</td>"
            f"<td>{html.escape(p.rule)}</td></tr>"
        )
    if len(cell.items) > 24:
        rows.append(f"<tr><td colspan=6>… {len(cell.items) - 24} more</td></tr>")
    lines.append(
        "<table cellspacing=0 cellpadding=2><tr><th align=left>tensor</th><th>type</th><th>shape</th>"
        "<th>bytes</th><th>device</th><th align=left>placed by</th></tr>" + "".join(rows) + "</table>"
    )
    return "<br>".join(lines)


def _signed(n: int) -> str:
    return f"{'+' if n > 0 else '−'}{fmt_bytes(abs(n))}" if n else "no change"


def move_tg(plan: Plan, names: Sequence[str]) -> dict[str, tuple[float, float]]:
    """Per device: estimated tg now and if ``names`` moved there, on this machine's cached figures
    (never probes from here)."""
    from offload_planner.backend.speed_store import efficiencies_for, machine_hardware

    if not names:
        return {}
    hw = machine_hardware(plan, probe=False)
    return move_preview.move_tg(plan, names, hw, efficiencies_for(plan.dialect, plan.devices))


def _spec_note(plan: Plan) -> str:
    """", with MTP" / ", with the draft model": what the tg of a preview includes, as the speed line."""
    spec = plan.spec
    if spec is None or not spec.active or spec.n_max < 1:
        return ""
    if spec.draft is not None:
        return ", with the draft model"
    return ", with MTP" if plan.model.summary.n_nextn else ""


def move_preview_html(plan: Plan, cell: Cell, left: Mapping[str, int] | None = None) -> str:
    """Per device: the change in its projected total if the cell's movable tensors moved there."""
    return names_preview_html(plan, cell.movable_names, {d for d, _ in cell.device_bytes}, left)


def _over(delta: int, room: int | None) -> str:
    """" over by 2.3 GiB" in red when ``delta`` bytes more do not fit in ``room`` ("" when they do)."""
    if room is None or delta <= 0 or delta <= room:
        return ""
    return f"<br><span style='color:#D00000'>over by {fmt_bytes(delta - max(room, 0))}</span>"


def names_preview_html(plan: Plan, movable: Sequence[str], here: set[str | None],
                       left: Mapping[str, int] | None = None) -> str:
    """Per device: the change in its projected total and in tg if ``movable`` moved there; ``here``:
    the devices holding them now (one: that device's row says "here now"); ``left``: bytes each
    device has left now (capacity less margin and projection): a move beyond them says "over by"."""
    names = [n for n in movable if not is_draft_name(n)]  # draft moves: -otd rules, no preview
    if not names:
        return ""
    try:
        tg = move_tg(plan, names)
    except Exception:  # the estimate is a hint: never let it take the tooltip down
        tg = {}
    rows = []
    for m in move_deltas(plan, names):
        if m.target in here and len(here) == 1:
            rows.append(f"<tr><td><b>{html.escape(m.target)}</b></td><td colspan=3>(here now)</td></tr>")
            continue
        others = ", ".join(f"{html.escape(d)} {_signed(n)}" for d, n in m.others)
        speed = ""
        if m.target in tg:
            now, then = tg[m.target]
            speed = f"{rate_text(then)} t/s ({change_text(now, then)})"
        rows.append(
            f"<tr><td><b>{html.escape(m.target)}</b></td><td align=right>{_signed(m.delta)}"
            f"{_over(m.delta, (left or {}).get(m.target))}</td>"
            f"<td>{others}</td><td align=right>{speed}</td></tr>"
        )
    return (
        "<b>Moving it would change</b> (projected totals; weights with their buffer padding, "
        "<i>compute buffers not included</i>; est. tg at depth 0" + _spec_note(plan) + ", as the speed line)"
        "<table cellspacing=0 cellpadding=2><tr><th align=left>to</th><th>that device</th>"
        "<th align=left>elsewhere</th><th>tg</th></tr>" + "".join(rows) + "</table>"
    )


class TensorMapModel(QAbstractTableModel):
    def __init__(self, doc: PlanDocument) -> None:
        super().__init__(doc)
        self._doc = doc
        self._grid: TensorGrid | None = doc.grid
        doc.modelChanged.connect(self._reset)
        doc.layoutChanged.connect(self._reset)
        doc.planChanged.connect(self._refresh)

    @property
    def grid(self) -> TensorGrid | None:
        return self._grid

    def _reset(self) -> None:
        self.beginResetModel()
        self._grid = self._doc.grid
        self.endResetModel()

    def _refresh(self) -> None:
        grid = self._doc.grid
        if (
            grid is None
            or self._grid is None
            or len(grid.rows) != len(self._grid.rows)
            or grid.columns != self._grid.columns
        ):
            self._reset()
            return
        self._grid = grid
        if self.rowCount() and self.columnCount():
            self.dataChanged.emit(self.index(0, 0), self.index(self.rowCount() - 1, self.columnCount() - 1))
        self.headerDataChanged.emit(Qt.Orientation.Vertical, 0, self.rowCount() - 1)

    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() or self._grid is None else len(self._grid.rows)

    def columnCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() or self._grid is None else len(self._grid.columns)

    def _left(self) -> dict[str, int]:
        """Bytes each device has left in the projection on screen (none while it is not current)."""
        a = self._doc.analysis
        if a is None or a.projection is None or not self._doc.analysis_current:
            return {}
        figures = (DeviceFigures.of(dm) for dm in a.projection.devices)
        return {f.name: f.left for f in figures if f.left is not None}

    def cell(self, index: _Index) -> Cell:
        if self._grid is None or not index.isValid():
            return EMPTY
        return self._grid.cell(index.row(), index.column())

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> object:
        g = self._grid
        if g is None or not index.isValid():
            return None
        r, c = index.row(), index.column()
        if role == CELL_ROLE:
            return g.cell(r, c)
        if role == FRACTION_ROLE:
            m = g.column_max[c]
            return g.cell(r, c).nbytes / m if m else 0.0
        if role == Qt.ItemDataRole.ToolTipRole:
            cell = g.cell(r, c)
            if not cell.items:
                return None
            tip = cell_tooltip(g, r, c)
            preview = move_preview_html(self._doc.plan, cell, self._left()) if self._doc.has_plan else ""
            return f"{tip}<br>{preview}" if preview else tip
        if role == Qt.ItemDataRole.AccessibleTextRole:
            return cell_summary(g, r, c)
        if role == SECTION_ROLE:
            return row_section(g.rows[r])
        if role == SECTION_START_ROLE:
            kind = row_section(g.rows[r])
            return bool(kind) and (r == 0 or row_section(g.rows[r - 1]) != kind)
        return None

    def headerData(
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> object:
        g = self._grid
        if g is None:
            return None
        if orientation == Qt.Orientation.Horizontal and 0 <= section < len(g.columns):
            col = g.columns[section]
            if role == Qt.ItemDataRole.DisplayRole:
                return col.label
            if role == Qt.ItemDataRole.ToolTipRole:
                # the header may show a short form of the label (role_header): the tooltip names it whole
                return f"<b>{col.label}</b>: {col.description}<br>Click: select this role in every layer"
        if orientation == Qt.Orientation.Vertical and 0 <= section < len(g.rows):
            row = g.rows[section]
            if role == Qt.ItemDataRole.DisplayRole:
                return row.label
            if role == Qt.ItemDataRole.ToolTipRole:
                return row_tooltip(g, section, self._doc.plan if self._doc.has_plan else None, self._left())
            kind = row_section(row)
            if kind and role == Qt.ItemDataRole.BackgroundRole:
                return section_tint(kind)
            if kind and role == Qt.ItemDataRole.FontRole:
                font = QFont()
                font.setItalic(True)
                return font
            if role == Qt.ItemDataRole.TextAlignmentRole:
                return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    def flags(self, index: _Index) -> Qt.ItemFlag:
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        if not self.cell(index).items:
            return Qt.ItemFlag.ItemIsEnabled
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
