"""Undo commands: one QUndoCommand class per kind of edit. Each swaps plan states on a holder (the
document); views re-read the plan and its projection when the holder announces the change."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from PySide6.QtGui import QUndoCommand

from offload_planner.core import plan_edits
from offload_planner.core.devices import Device
from offload_planner.core.dialects import Dialect
from offload_planner.core.plan import Plan

# Merge ids (QUndoCommand.id): consecutive edits of the same option or device merge into one step.
_ID_OPTION = 1001
_ID_DEVICE = 1002


class PlanHolder(Protocol):
    @property
    def plan(self) -> Plan: ...

    def set_plan(self, plan: Plan) -> None: ...


class MoveTensors(QUndoCommand):
    """Move tensors to devices (None: back to where the command puts them). A drag of many tensors
    is one MoveTensors."""

    def __init__(self, holder: PlanHolder, moves: Mapping[str, str | None], text: str) -> None:
        super().__init__(text)
        self._holder = holder
        self._new = dict(moves)
        self._old = {n: holder.plan.moves.get(n) for n in moves}

    @property
    def count(self) -> int:
        return len(self._new)

    def redo(self) -> None:
        self._holder.set_plan(self._holder.plan.with_moves(self._new))

    def undo(self) -> None:
        self._holder.set_plan(self._holder.plan.with_moves(self._old))


class SetOption(QUndoCommand):
    """Change one context or placement option (``context.n_ctx``, ``placement.use_mmap``, ...)."""

    def __init__(self, holder: PlanHolder, key: str, value: Any, label: str) -> None:
        super().__init__(f"Set {label} to {value}")
        self._holder = holder
        self.key = key
        self._label = label
        self._old = plan_edits.option_value(holder.plan, key)
        self._new = value

    def id(self) -> int:
        return _ID_OPTION

    def mergeWith(self, other: QUndoCommand) -> bool:
        if not isinstance(other, SetOption) or other.key != self.key:
            return False
        self._new = other._new
        self.setText(f"Set {self._label} to {self._new}")
        self.setObsolete(self._new == self._old)
        return True

    def redo(self) -> None:
        self._holder.set_plan(plan_edits.with_option(self._holder.plan, self.key, self._new))

    def undo(self) -> None:
        self._holder.set_plan(plan_edits.with_option(self._holder.plan, self.key, self._old))


class SetOptions(QUndoCommand):
    """Change several options in one step (``-ub`` with the ``-b`` that must follow it)."""

    def __init__(self, holder: PlanHolder, values: Mapping[str, Any], text: str) -> None:
        super().__init__(text)
        self._holder = holder
        self._new = dict(values)
        self._old = {k: plan_edits.option_value(holder.plan, k) for k in values}

    def _apply(self, values: Mapping[str, Any]) -> None:
        plan = self._holder.plan
        for key, value in values.items():
            plan = plan_edits.with_option(plan, key, value)
        self._holder.set_plan(plan)

    def redo(self) -> None:
        self._apply(self._new)

    def undo(self) -> None:
        self._apply(self._old)


class SetDialect(QUndoCommand):
    """Switch the backend.  The dialect also resets what it decides (ik's -mla default, CPU_REPACK):
    undo puts the plan before the switch back (the commands after it are undone first)."""

    def __init__(self, holder: PlanHolder, dialect: Dialect, label: str) -> None:
        super().__init__(f"Backend: {label}")
        self._holder = holder
        self._new = dialect
        self._before = holder.plan

    def redo(self) -> None:
        self._holder.set_plan(plan_edits.with_dialect(self._holder.plan, self._new))

    def undo(self) -> None:
        self._holder.set_plan(self._before)


class AddDevice(QUndoCommand):
    def __init__(self, holder: PlanHolder, device: Device) -> None:
        super().__init__(f"Add {device.name}")
        self._holder = holder
        self._device = device

    def redo(self) -> None:
        self._holder.set_plan(plan_edits.with_device(self._holder.plan, self._device))

    def undo(self) -> None:
        self._holder.set_plan(plan_edits.without_device(self._holder.plan, self._device.name)[0])


class RemoveDevice(QUndoCommand):
    """Remove a GPU; the user's moves onto it are dropped (and restored on undo)."""

    def __init__(self, holder: PlanHolder, name: str) -> None:
        super().__init__(f"Remove {name}")
        self._holder = holder
        self._name = name
        dev = holder.plan.devices.by_name(name)
        assert dev is not None and dev.is_gpu
        self._device: Device = dev
        self._index = 0
        self._dropped: dict[str, str] = {}

    def redo(self) -> None:
        plan, self._index, self._dropped = plan_edits.without_device(self._holder.plan, self._name)
        self._holder.set_plan(plan)

    def undo(self) -> None:
        plan = plan_edits.with_device(self._holder.plan, self._device, self._index)
        self._holder.set_plan(plan.with_moves(self._dropped))


class SetDevice(QUndoCommand):
    """Change a device's margin or size."""

    def __init__(self, holder: PlanHolder, name: str, text: str, **changes: Any) -> None:
        super().__init__(text)
        self._holder = holder
        self.name = name
        dev = holder.plan.devices.by_name(name)
        assert dev is not None
        self._old = {k: getattr(dev, k) for k in changes}
        self._new = dict(changes)

    def id(self) -> int:
        return _ID_DEVICE

    def mergeWith(self, other: QUndoCommand) -> bool:
        if (
            not isinstance(other, SetDevice)
            or other.name != self.name
            or other._new.keys() != self._new.keys()
        ):
            return False
        self._new = dict(other._new)
        self.setText(other.text())
        self.setObsolete(self._new == self._old)
        return True

    def redo(self) -> None:
        self._holder.set_plan(plan_edits.with_device_changed(self._holder.plan, self.name, **self._new))

    def undo(self) -> None:
        self._holder.set_plan(plan_edits.with_device_changed(self._holder.plan, self.name, **self._old))


class ReplacePlan(QUndoCommand):
    """Rebuild the plan wholesale (from a pasted command)."""

    def __init__(self, holder: PlanHolder, plan: Plan, text: str) -> None:
        super().__init__(text)
        self._holder = holder
        self._old = holder.plan
        self._new = plan

    def redo(self) -> None:
        self._holder.set_plan(self._new)

    def undo(self) -> None:
        self._holder.set_plan(self._old)
