"""Every persistent setting of the window, declared in one place, stored with QSettings.

Values are JSON text (the same in the registry, plist and ini backends); window geometry and state
are QByteArray. Tests pass their own QSettings (an ini file in a temp folder).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QByteArray, QSettings

from offload_planner.core.cmdline.handlers_mainline import INT_MAX
from offload_planner.core.devices import Device, DeviceKind, kind_of
from offload_planner.core.dialects import Dialect
from offload_planner.core.errors import PlannerError
from offload_planner.core.speed.catalogue import card
from offload_planner.core.speed.declared import parse_hardware_keys
from offload_planner.core.units import MAX_SIZE, GiB

ORGANIZATION = "offload-planner"
APPLICATION = "Offload Planner"
MAX_RECENT = 12


@dataclass(frozen=True)
class Key:
    name: str
    default: Any
    doc: str
    #: an integer setting's range (outside it, the default: a hand-edited or another version's value)
    limits: tuple[int, int] | None = None


RECENT_FILES = Key("files/recent", [], "recently opened models and plans, newest first")
VIRTUAL_GPUS = Key("devices/virtual", [], "virtual GPUs: [{name, total, margin, hardware}]")
MARGINS = Key("devices/margins", {}, "per-device safety margin in bytes, by device name")
DEFAULT_MARGIN = Key("devices/default_margin", 1 * GiB, "margin of devices without their own",
                     (0, MAX_SIZE - 1))
CPU_SIZE = Key("devices/cpu_size", 0, "declared system RAM in bytes (0: the machine's total RAM)",
               (0, MAX_SIZE - 1))
BACKEND_PATH = Key("backend/path", "", "the llama-server executable (for the launcher)")
DIALECT = Key("backend/dialect", Dialect.LLAMA_CPP.value, " | ".join(d.value for d in Dialect))
COMMAND_STYLE = Key("command/style", "bash", "format of the command pane")
DEFAULT_CONTEXT = Key("plan/default_context", 32768, "-c of a new plan (capped at the trained length)",
                      (0, INT_MAX))
SPLIT_ATTENTION = Key("view/split_attention", False, "the tensor map shows one column per attention tensor")
GEOMETRY = Key("window/geometry", None, "QMainWindow.saveGeometry()")
STATE = Key("window/state", None, "QMainWindow.saveState()")
SPLITTERS = Key("window/splitters", None, "QSplitter.saveState() per splitter name (window/splitters/NAME)")

ALL_KEYS = (
    RECENT_FILES,
    VIRTUAL_GPUS,
    MARGINS,
    DEFAULT_MARGIN,
    CPU_SIZE,
    BACKEND_PATH,
    DIALECT,
    COMMAND_STYLE,
    DEFAULT_CONTEXT,
    SPLIT_ATTENTION,
    GEOMETRY,
    STATE,
    SPLITTERS,
)


class Settings:
    def __init__(self, qsettings: QSettings | None = None) -> None:
        self.q = qsettings if qsettings is not None else QSettings(ORGANIZATION, APPLICATION)

    @classmethod
    def at(cls, path: str) -> Settings:
        """Settings in an ini file (tests, --screenshot)."""
        return cls(QSettings(path, QSettings.Format.IniFormat))

    # --- typed access ------------------------------------------------------------------------

    def get(self, key: Key) -> Any:
        raw = self.q.value(key.name)
        if raw is None:
            return key.default
        try:
            value = json.loads(str(raw))
        except (TypeError, ValueError, RecursionError):  # RecursionError: nested deeper than json's stack
            return key.default
        if key.default is not None and (not isinstance(value, type(key.default))
                                        or isinstance(value, bool) is not isinstance(key.default, bool)):
            return key.default
        if key.limits is not None and not key.limits[0] <= value <= key.limits[1]:
            return key.default
        return value

    def set(self, key: Key, value: Any) -> None:
        self.q.setValue(key.name, json.dumps(value))

    def get_bytes(self, name: str) -> QByteArray | None:
        raw = self.q.value(name)
        return raw if isinstance(raw, QByteArray) and not raw.isEmpty() else None

    def set_bytes(self, name: str, value: QByteArray) -> None:
        self.q.setValue(name, value)

    def sync(self) -> None:
        self.q.sync()

    # --- recent files ------------------------------------------------------------------------

    @property
    def recent_files(self) -> list[str]:
        return [str(p) for p in self.get(RECENT_FILES)]

    def add_recent(self, location: str) -> None:
        recent = [p for p in self.recent_files if p != location]
        self.set(RECENT_FILES, [location, *recent][:MAX_RECENT])

    def remove_recent(self, location: str) -> None:
        self.set(RECENT_FILES, [p for p in self.recent_files if p != location])

    # --- devices -----------------------------------------------------------------------------

    def virtual_gpus(self) -> list[Device]:
        out: list[Device] = []
        for d in self.get(VIRTUAL_GPUS):
            try:
                name = str(d["name"])
                kind = kind_of(name)
                total = _size(d["total"], 1)
                margin = _size(d.get("margin", self.get(DEFAULT_MARGIN)), 0)
                hardware = tuple((str(k), str(v)) for k, v in d.get("hardware", []))
                parse_hardware_keys(hardware)  # a card or figure this version does not know: dropped
            except (KeyError, TypeError, ValueError, PlannerError):
                continue
            if kind is DeviceKind.CPU:
                continue
            out.append(
                Device(
                    name,
                    kind,
                    total,
                    None,
                    description=virtual_description(total, hardware),
                    source="declared",
                    margin=margin,
                    margin_given=True,  # the window's margin (its default included): 0 keeps nothing free
                    hardware=hardware,
                )
            )
        return out

    def store_devices(self, devices: list[Device], session: frozenset[str] = frozenset()) -> None:
        """Remember virtual GPUs and every device's margin. Devices named in ``session`` (given
        on the command line for this session, or the demo's hardware) keep what was stored."""
        session = frozenset(n.lower() for n in session)
        stored = {str(d.get("name", "")).lower(): d for d in self.get(VIRTUAL_GPUS) if isinstance(d, dict)}
        virtual: list[dict[str, Any]] = []
        for d in devices:
            if not d.is_gpu:
                continue
            if d.name.lower() in session:
                if d.name.lower() in stored:
                    virtual.append(stored[d.name.lower()])
            elif d.source == "declared" and d.total:
                # the card (speeds) too: without it the GPU came back at default speeds next time
                virtual.append({"name": d.name, "total": d.total, "margin": d.margin,
                                "hardware": [list(kv) for kv in d.hardware]})
        self.set(VIRTUAL_GPUS, virtual)
        margins = dict(self.get(MARGINS))
        margins.update({d.name: d.margin for d in devices if d.name.lower() not in session})
        self.set(MARGINS, margins)
        cpu = next((d for d in devices if not d.is_gpu), None)
        if cpu is not None and cpu.name.lower() not in session and cpu.source == "declared" and cpu.total:
            self.set(CPU_SIZE, cpu.total)  # set in the Devices list

    def margin_of(self, name: str) -> int:
        m = self.get(MARGINS).get(name)
        try:
            return _size(m, 0)
        except ValueError:
            return int(self.get(DEFAULT_MARGIN))


def _size(value: object, low: int) -> int:
    """A stored number of bytes from ``low`` up to :data:`MAX_SIZE` (a whole number, not true/false);
    ValueError for anything else (1e999 read as infinity, a negative size, a string)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < MAX_SIZE:
        raise ValueError(f"not a size: {str(value)[:40]}")
    return value


def card_label(key: str) -> str:
    """A catalogue card's name without its vendor's words: "RTX 3090", "A100 80GB", "Apple M2 Ultra"."""
    c = card(key)
    if c is None:
        return key
    name = c.name.removeprefix("NVIDIA ").removeprefix("GeForce ")
    return name.removeprefix("AMD ").removeprefix("Radeon ")


def virtual_description(total: int, hardware: tuple[tuple[str, str], ...] = ()) -> str:
    """What the window writes beside a virtual GPU: its card when one was picked, and its size."""
    key = dict(hardware).get("card")
    return f"{card_label(key)}, virtual" if key else f"virtual {total / GiB:g} GiB"
