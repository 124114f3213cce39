"""Measured compute buffers, remembered per model and options, to correct the projection.

The engine projects compute buffers by simulating llama.cpp's graph reservation; a real launch logs
the exact sizes.  After a launch, :meth:`CalibrationStore.record` keeps what each device reserved
(and what was projected then) under the model's fingerprint (its tensor layout, not its path) and
the options that shape the compute graph (context, batch sizes, placement, devices, dialect).  A
later projection of the same plan can then show the measured value as "calibrated": the projection
plus the difference measured last time, so an engine update keeps working.

The store is a small JSON file under the user's config directory (``$OFFLOAD_PLANNER_CONFIG_DIR``,
else ``$XDG_CONFIG_HOME/offload-planner``, ``%APPDATA%\\offload-planner`` on Windows,
``~/Library/Application Support/offload-planner`` on macOS), written atomically (a temporary file in
the same folder, fsync, rename).  Pure Python: no Qt.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from offload_planner.backend.config_folder import config_dir, read_config_file
from offload_planner.core.devices import DeviceSet
from offload_planner.core.dialects import Dialect
from offload_planner.core.memory import ContextParams, Projection
from offload_planner.core.model import Model
from offload_planner.core.placement import PlacementOptions
from offload_planner.core.plan import Plan

if TYPE_CHECKING:
    from offload_planner.backend.log_parser import LoadReport

FILE_NAME = "calibration.json"
VERSION = 1
MAX_ENTRIES = 500


def model_fingerprint(model: Model) -> str:
    """The same for every copy of one model (any path, any shard split of the same tensors)."""
    import hashlib  # here: `plan` reads the config folder from this module and hashes nothing

    h = hashlib.sha256(model.arch.encode())
    for t in model.tensors:
        h.update(f"\n{t.name}:{t.type.name}:{'x'.join(map(str, t.shape))}".encode())
    return h.hexdigest()[:24]


def _jsonable(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _jsonable(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


def options_key(placement: PlacementOptions, context: ContextParams, devices: DeviceSet,
                dialect: Dialect) -> str:
    """What shapes the compute graph: resolved placement and context options, the device list (names
    and kinds, not their free memory) and the dialect."""
    data = {
        "placement": _jsonable(placement),
        "context": _jsonable(context),
        "devices": [(d.name, str(d.kind)) for d in devices],
        "dialect": str(dialect),
    }
    import hashlib

    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:24]


def measured_compute(report: LoadReport, resolve: Mapping[str, str] | None = None) -> dict[str, int]:
    """Compute buffer bytes per device as the log printed them (MiB with 2 decimals)."""
    from offload_planner.backend.log_parser import device_of_buffer

    resolve = dict(resolve) if resolve is not None else report.rpc_endpoints()
    out: dict[str, int] = defaultdict(int)
    for b in report.buffers:
        if b.kind == "compute":
            out[device_of_buffer(b.buffer, resolve)] += b.bytes_approx
    return dict(out)


def projected_compute(projection: Projection) -> dict[str, int]:
    return {d.device.name: d.compute for d in projection.devices if d.compute}


@dataclass(frozen=True)
class CalibratedCompute:
    device: str
    projected: int  # the current projection
    calibrated: int  # projected + what the last launch measured above the projection then
    measured: int  # what the last launch logged

    @property
    def delta(self) -> int:
        return self.calibrated - self.projected


@dataclass(frozen=True)
class Calibration:
    fingerprint: str
    options: str
    measured: dict[str, int]
    projected: dict[str, int]  # what the engine projected when this was measured
    when: float  # time.time()
    runs: int = 1

    def delta(self, device: str) -> int:
        return self.measured.get(device, 0) - self.projected.get(device, 0)

    def apply(self, projection: Projection) -> list[CalibratedCompute]:
        """The projection's compute buffers corrected by this measurement, per device."""
        now = projected_compute(projection)
        out = []
        for dev in dict.fromkeys([*now, *self.measured]):
            p = now.get(dev, 0)
            out.append(CalibratedCompute(dev, p, max(0, p + self.delta(dev)), self.measured.get(dev, 0)))
        return out

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Calibration:
        """An entry as :meth:`to_json` writes it; ValueError for any other (a hand edit's Infinity,
        1e308 bytes, a string where a count goes)."""
        measured = {str(k): _bytes(v) for k, v in d["measured"].items()}
        projected = {str(k): _bytes(v) for k, v in d["projected"].items()}
        when, runs = d["when"], d.get("runs", 1)
        if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when):
            raise ValueError(f"'when' is {str(when)[:40]!r}, not a time")
        if isinstance(runs, bool) or not isinstance(runs, int) or not 1 <= runs <= MAX_RUNS:
            raise ValueError(f"'runs' is {str(runs)[:40]!r}, not a count of runs")
        return cls(str(d["fingerprint"]), str(d["options"]), measured, projected, float(when), runs)


#: the largest buffer a calibration stores (1 PiB: beyond any device's memory)
MAX_BUFFER_BYTES = 1 << 50


def _bytes(value: object) -> int:
    """A stored buffer size: a whole number of bytes from 0 to :data:`MAX_BUFFER_BYTES`, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BUFFER_BYTES:
        raise ValueError(f"{str(value)[:40]!r} is not a buffer size in bytes")
    return value


#: runs of one plan counted at most (a hand-edited count beyond it is taken as none)
MAX_RUNS = 1 << 30


def _stored_number(entry: object, key: str, high: float) -> float:
    """``entry[key]`` when the entry is an object and the value a finite number from 0 to ``high``,
    else 0 (another program's or a hand edit's value: never a crash while a launch is recorded)."""
    value = entry.get(key) if isinstance(entry, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= high:
        return 0
    return value if math.isfinite(value) else 0


class CalibrationStore:
    """The JSON file of calibrations; every :meth:`record` rewrites it atomically."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else config_dir() / FILE_NAME
        #: what the last write did beside saving ('' or: the unreadable file it set aside)
        self.note = ""

    def _read(self) -> dict[str, dict[str, Any]]:
        entries = self._load()[0]
        return entries if entries is not None else {}

    def _load(self) -> tuple[dict[str, Any] | None, str | None]:
        """The entries (None: no file), or why the file there cannot be read (it is then not one to
        write over without keeping it: another version's store, a hand edit gone wrong)."""
        try:
            raw, problem = read_config_file(self.path)
        except OSError:
            return None, None
        if problem is not None:
            return None, problem
        if not raw.strip():
            return None, None
        try:
            data = json.loads(raw.decode("utf-8"))
        except ValueError as e:  # UnicodeDecodeError too
            return None, f"not JSON: {e}"
        except RecursionError:  # nested deeper than json's stack
            return None, "not JSON: nested too deeply"
        if not isinstance(data, dict) or data.get("version") != VERSION:
            return None, f"not a version {VERSION} calibration store"
        entries = data.get("entries")
        return (entries, None) if isinstance(entries, dict) else (None, "its 'entries' is not an object")

    def _write(self, entries: dict[str, dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".calibration-", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"version": VERSION, "entries": entries}, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            self.note = ""
            damage = self._load()[1]
            if damage is not None:
                aside = self.path.with_name(self.path.name + ".damaged")
                os.replace(self.path, aside)
                self.note = f"{self.path} could not be read ({damage[:120]}): kept as {aside}"
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @staticmethod
    def key(fingerprint: str, options: str) -> str:
        return f"{fingerprint}/{options}"

    def lookup(self, fingerprint: str, options: str) -> Calibration | None:
        raw = self._read().get(self.key(fingerprint, options))
        if raw is None:
            return None
        try:
            return Calibration.from_json(raw)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def record(self, fingerprint: str, options: str, measured: Mapping[str, int],
               projected: Mapping[str, int]) -> Calibration:
        entries = self._read()
        k = self.key(fingerprint, options)
        runs = _stored_number(entries.get(k), "runs", MAX_RUNS) + 1  # a hand-edited entry counts as none
        cal = Calibration(fingerprint, options, dict(measured), dict(projected), time.time(), int(runs))
        entries[k] = cal.to_json()
        if len(entries) > MAX_ENTRIES:  # drop the oldest
            keep = sorted(entries, key=lambda e: _stored_number(entries[e], "when", math.inf))[-MAX_ENTRIES:]
            entries = {e: entries[e] for e in keep}
        self._write(entries)
        return cal

    def forget(self, fingerprint: str, options: str) -> None:
        entries = self._read()
        if entries.pop(self.key(fingerprint, options), None) is not None:
            self._write(entries)

    def for_plan(self, plan: Plan) -> Calibration | None:
        """The calibration recorded for this plan's model and options, if any."""
        return self.lookup(model_fingerprint(plan.model),
                           options_key(plan.placement_options, plan.context, plan.devices, plan.dialect))

    def record_launch(self, model: Model, placement: PlacementOptions, context: ContextParams,
                      devices: DeviceSet, dialect: Dialect, projection: Projection,
                      report: LoadReport) -> Calibration | None:
        """Remember a launch's compute buffers; None when the log printed none (no -lv 4)."""
        measured = measured_compute(report)
        if not measured:
            return None
        return self.record(model_fingerprint(model), options_key(placement, context, devices, dialect),
                           measured, projected_compute(projection))
