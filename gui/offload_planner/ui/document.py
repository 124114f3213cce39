"""The open plan: the one place that holds state. Views read it and call its edit methods; every
edit is an undo command on :attr:`PlanDocument.undo_stack`.

Signals: ``modelChanged`` (a new model or plan file: views rebuild their layout), ``planChanged``
(any edit, undo or redo: placement and grid are current), ``analysisChanged`` (projection, command
and problems for the current plan are ready; computed off the GUI thread).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QUndoCommand, QUndoStack

from offload_planner.backend import qt_compat
from offload_planner.core import plan_edits
from offload_planner.core.analysis import Analysis, quick_analysis
from offload_planner.core.devices import DECLARED_RAM, Device
from offload_planner.core.dialects import Dialect
from offload_planner.core.draft_moves import (
    DRAFT_PREFIX,
    draft_moves_for,
    draft_placement,
    is_draft_name,
    with_draft_moves,
)
from offload_planner.core.placement import CPU, Placement
from offload_planner.core.plan import Plan
from offload_planner.core.tensor_grid import (
    Column,
    Row,
    TensorGrid,
    build_grid,
    layout,
    plan_projector_placed,
    with_draft_rows,
)
from offload_planner.core.units import fmt_bytes
from offload_planner.ui import commands
from offload_planner.ui.projector import Projector

qt_compat.apply()  # PySide6 6.12.0 on Python 3.11: see qt_compat


class PlanDocument(QObject):
    modelChanged = Signal()
    planChanged = Signal()
    analysisChanged = Signal()
    notesChanged = Signal()
    layoutChanged = Signal()  # the map's columns changed (split attention): the grid is rebuilt

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.undo_stack = QUndoStack(self)
        self.file_path: str | None = None  # the plan file, once saved or loaded
        self.notes: list[str] = []  # about how the plan was made (loading, pasting)
        self._plan: Plan | None = None
        self._layout: tuple[list[Row], list[Column]] | None = None
        self._placement: Placement | None = None
        self._base: Placement | None = None
        self._grid: TensorGrid | None = None
        self._analysis: Analysis | None = None
        self._split_attention = False
        self._projector = Projector(self)
        self._projector.ready.connect(self._on_analysis)

    # --- state ------------------------------------------------------------------------------

    @property
    def has_plan(self) -> bool:
        return self._plan is not None

    @property
    def plan(self) -> Plan:
        if self._plan is None:
            raise RuntimeError("no model is open")
        return self._plan

    @property
    def placement(self) -> Placement:
        assert self._placement is not None
        return self._placement

    @property
    def base_placement(self) -> Placement:
        assert self._base is not None
        return self._base

    @property
    def grid(self) -> TensorGrid | None:
        return self._grid

    @property
    def analysis(self) -> Analysis | None:
        """The newest analysis; it may belong to an older plan while a projection runs."""
        return self._analysis

    @property
    def analysis_current(self) -> bool:
        a = self._analysis
        return a is not None and a.plan is self._plan and not a.preliminary

    @property
    def busy(self) -> bool:
        return not self._projector.idle

    def reset(self, plan: Plan, *, file_path: str | None = None, notes: Sequence[str] = ()) -> None:
        """A new document: new model or plan file; the undo history starts empty."""
        self.undo_stack.clear()
        self.file_path = file_path
        self.notes = list(notes)
        self._layout = (
            layout(plan.model, split_attention=self._split_attention)
            if self._plan is None or self._plan.model is not plan.model else self._layout
        )
        self._analysis = None
        self._update(plan)
        self.undo_stack.setClean()
        self.modelChanged.emit()
        self.planChanged.emit()

    @property
    def split_attention(self) -> bool:
        return self._split_attention

    def set_split_attention(self, on: bool) -> None:
        """Show the attention column as one column per tensor kind (a view choice, not an edit)."""
        if on == self._split_attention:
            return
        self._split_attention = on
        if self._plan is not None:
            self._layout = layout(self._plan.model, split_attention=on)
            self._build_grid(self._plan)
        self.layoutChanged.emit()

    def set_notes(self, notes: Sequence[str]) -> None:
        """Notes about how the plan was made (loading, pasting), for the Problems tab."""
        self.notes = list(notes)
        self.notesChanged.emit()

    def set_plan(self, plan: Plan) -> None:
        """For undo commands: swap in a plan state."""
        self._update(plan)
        self.planChanged.emit()

    def _update(self, plan: Plan) -> None:
        self._plan = plan
        self._base = plan.base_placement()  # cached by core
        self._placement = plan.placement()
        self._build_grid(plan)
        quick = quick_analysis(plan, self._analysis)
        if quick is not None:  # the bars answer the edit at once; the full analysis follows
            self._analysis = quick
            self.analysisChanged.emit()
        self._projector.request(plan)

    def _build_grid(self, plan: Plan) -> None:
        movable = [(t.name, plan.movable(t.name)) for t in plan.model.tensors]
        self._grid = build_grid(plan.model, self.placement, self.base_placement, movable, self._layout,
                                projector=plan_projector_placed(plan))
        draft = plan.spec.draft if plan.spec is not None else None
        placed = draft_placement(plan)
        if draft is not None and placed is not None:  # a speculative-decoding draft model: rows below
            self._grid = with_draft_rows(self._grid, draft.model, placed)

    def _on_analysis(self, analysis: Analysis) -> None:
        self._analysis = analysis
        self.analysisChanged.emit()

    def shutdown(self) -> None:
        self._projector.shutdown()

    # --- edits (each one undo step) ---------------------------------------------------------

    def push(self, command: QUndoCommand) -> None:
        self.undo_stack.push(command)

    def moves_for(self, names: Sequence[str], device: str | None) -> dict[str, str | None]:
        """What moving ``names`` to ``device`` (None: back to the command's placement) changes:
        tensor -> its move (None: no move left), only for the movable tensors that would change."""
        if not self.has_plan or not names:
            return {}
        base = {p.tensor.name: p.device for p in self.base_placement.items if not p.copy}
        current = {p.tensor.name: p.device for p in self.placement.items if not p.copy}
        moves: dict[str, str | None] = dict(draft_moves_for(self.plan, list(names), device))
        for n in dict.fromkeys(names):
            if is_draft_name(n) or not self.plan.movable(n)[0]:
                continue
            target = base.get(n) if device is None else device
            if target == current.get(n) and (device is not None or n not in self.plan.moves):
                continue
            moves[n] = None if target == base.get(n) else target
        return moves

    def describe_tensors(self, names: Sequence[str]) -> str:
        """``1 tensor (1.20 GiB)``, ``58 tensors (138.55 GiB)``."""
        draft = self.plan.spec.draft if self.plan.spec is not None else None
        nbytes = sum(draft.model.tensor(n[len(DRAFT_PREFIX):]).nbytes if is_draft_name(n) and draft
                     else self.plan.model.tensor(n).nbytes for n in names)
        return f"{len(names)} tensor{'s' if len(names) != 1 else ''} ({fmt_bytes(nbytes)})"

    def move(self, names: Sequence[str], device: str | None, text: str | None = None) -> bool:
        """Move tensors to ``device`` (None: back to the command's placement) as one undo step.
        Returns False when nothing would change."""
        moves = self.moves_for(names, device)
        if not moves:
            return False
        where = "the command's placement" if device is None else device
        label = text or f"Move {self.describe_tensors(list(moves))} to {where}"
        draft = {n: d for n, d in moves.items() if is_draft_name(n) and d is not None}
        if draft:  # draft tensors move by -otd rules: the plan is rebuilt (one undo step)
            main = {n: d for n, d in moves.items() if not is_draft_name(n)}
            plan = with_draft_moves(self.plan, draft)
            if main:
                plan = plan.with_moves({n: d for n, d in main.items() if d is not None})
            self.push(commands.ReplacePlan(self, plan, label))
            return True
        self.push(commands.MoveTensors(self, moves, label))
        return True

    def apply_preset(self, moves: Mapping[str, str | None], text: str) -> bool:
        if not moves:
            return False
        base = {p.tensor.name: p.device for p in self.base_placement.items if not p.copy}
        norm = {n: (None if d is None or base.get(n) == d else d) for n, d in moves.items()}
        self.push(commands.MoveTensors(self, norm, text))
        return True

    def set_option(self, key: str, value: object, label: str) -> None:
        if self.has_plan and plan_edits.option_value(self.plan, key) != value:
            self.push(commands.SetOption(self, key, value, label))

    def set_options(self, values: dict[str, object], text: str) -> None:
        """Several options in one undo step (``text`` names it)."""
        if self.has_plan and any(plan_edits.option_value(self.plan, k) != v for k, v in values.items()):
            self.push(commands.SetOptions(self, values, text))

    def set_dialect(self, dialect: Dialect, label: str) -> None:
        if self.has_plan and self.plan.dialect != dialect:
            self.push(commands.SetDialect(self, dialect, label))

    def add_device(self, device: Device) -> None:
        self.push(commands.AddDevice(self, device))

    def remove_device(self, name: str) -> None:
        dev = self.plan.devices.by_name(name)
        if dev is not None and dev.is_gpu:
            self.push(commands.RemoveDevice(self, name))

    def set_device_margin(self, name: str, margin: int) -> None:
        dev = self.plan.devices.by_name(name)
        if dev is not None and (dev.margin != margin or not dev.margin_given):  # 0 given is no margin
            self.push(
                # the window's margin is set: 0 there keeps nothing free (core.speed.candidate.margin_of)
                commands.SetDevice(self, dev.name, f"{dev.name} margin {fmt_bytes(margin)}", margin=margin,
                                   margin_given=True)
            )

    def set_device_size(self, name: str, total: int) -> None:
        dev = self.plan.devices.by_name(name)
        if dev is not None and (dev.total != total or dev.free is not None):
            self.push(
                commands.SetDevice(
                    self, dev.name, f"{dev.name} size {fmt_bytes(total)}", total=total, free=None,
                    source="declared", **({} if dev.is_gpu else {"description": DECLARED_RAM}),
                )
            )

    def replace_plan(self, plan: Plan, text: str) -> None:
        self.push(commands.ReplacePlan(self, plan, text))

    # --- queries ---------------------------------------------------------------------------

    def device_names(self) -> list[str]:
        """llama.cpp's order: GPUs, then CPU."""
        return self.plan.devices.names if self.has_plan else []

    def gpu_name(self, n: int) -> str | None:
        """The n-th GPU (0-based), or CPU for -1."""
        if n < 0:
            return CPU
        gpus = self.plan.devices.gpus if self.has_plan else ()
        return gpus[n].name if n < len(gpus) else None
