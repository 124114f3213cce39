"""Dropping tensors on a device: the widgets that name a device under the cursor (device panel,
memory bars) implement :class:`DeviceDropTarget`; the tensor map finds them by hit-testing its
window, so a drag never leaves the application and needs no platform drag-and-drop."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from PySide6.QtCore import QPoint
from PySide6.QtWidgets import QWidget


@runtime_checkable
class DeviceDropTarget(Protocol):
    def device_at(self, global_pos: QPoint) -> str | None:
        """The device under a global position, or None."""
        ...

    def set_drop_highlight(self, device: str | None) -> None:
        """Show (or clear, with None) that a drop would land on ``device``."""
        ...


def drop_target_at(window: QWidget, global_pos: QPoint) -> tuple[DeviceDropTarget, str] | None:
    """The drop target and device under ``global_pos`` inside ``window``."""
    w: QWidget | None = window.childAt(window.mapFromGlobal(global_pos))
    while w is not None:
        if isinstance(w, DeviceDropTarget):
            dev = w.device_at(global_pos)
            return (w, dev) if dev is not None else None
        w = w.parentWidget()
    return None
