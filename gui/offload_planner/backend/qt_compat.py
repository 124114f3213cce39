"""Workaround for a reference-count bug of PySide6 6.12.0 on CPython < 3.12.

That build returns ``None`` from every void call (``widget.update()``, ``checkbox.setChecked()``,
an invalid ``QVariant``) and ``True`` from ``SignalInstance.emit`` without taking a reference, so
each call drops one reference the caller never owned. CPython 3.12+ makes None/True/False immortal
and does not notice; on 3.11 the interpreter aborts after a few thousand calls with "Fatal Python
error: none_dealloc: deallocating None" (or ``bool_dealloc``), at the latest when it exits.

:func:`apply` measures the leak once and, only if it is there, gives None, True and False a
reference count no program can exhaust (2**40 extra), which is what 3.12's immortal objects do.
Pinning ``PySide6-Essentials!=6.12.0`` (or Python >= 3.12) makes it unnecessary.
"""

from __future__ import annotations

import ctypes
import sys

_EXTRA = 1 << 40
_state = {"checked": False, "applied": False}


def pyside_drops_references() -> bool:
    """Does the running PySide6 drop references to None or True?"""
    if sys.version_info >= (3, 12):
        return False
    from PySide6.QtCore import QObject, Signal

    class _Probe(QObject):
        ping = Signal()

    probe = _Probe()
    n0, t0 = sys.getrefcount(None), sys.getrefcount(True)
    for _ in range(16):
        probe.setObjectName("probe")
        probe.ping.emit()
    return sys.getrefcount(None) <= n0 - 8 or sys.getrefcount(True) <= t0 - 8


def apply() -> bool:
    """Make None/True/False immortal if PySide6 needs it; idempotent. True when applied."""
    if _state["checked"]:
        return _state["applied"]
    _state["checked"] = True
    if hasattr(sys, "gettotalrefcount") or not pyside_drops_references():  # debug builds: other layout
        return False
    for obj in (None, True, False):
        before = sys.getrefcount(obj)
        ctypes.c_ssize_t.from_address(id(obj)).value += _EXTRA  # ob_refcnt is PyObject's first field
        assert sys.getrefcount(obj) >= before + _EXTRA - 16
    _state["applied"] = True
    return True
