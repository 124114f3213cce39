"""Plan files: versioned JSON with the model's path and fingerprint, devices, options, every user
move and the backend settings; written atomically (temp file + ``os.replace``).

Qt-free core-level logic, kept here until it moves to ``offload_planner.core``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from offload_planner import __version__
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.errors import PlannerError
from offload_planner.core.memory import ContextParams
from offload_planner.core.model import Model
from offload_planner.core.placement import Override, PlacementOptions
from offload_planner.core.plan import Plan

FORMAT = "offload-planner-plan"
VERSION = 1
SUFFIX = ".plan.json"


class PlanFileError(PlannerError):
    """A plan file that cannot be read or written."""


@dataclass(frozen=True)
class Fingerprint:
    """Identifies a model file without reading its tensor data."""

    file_bytes: int
    n_tensors: int
    tensor_table_sha256: str

    def differences(self, other: Fingerprint) -> list[str]:
        out = []
        if self.file_bytes != other.file_bytes:
            out.append(f"size {self.file_bytes:,} -> {other.file_bytes:,} bytes")
        if self.n_tensors != other.n_tensors:
            out.append(f"tensor count {self.n_tensors} -> {other.n_tensors}")
        if self.tensor_table_sha256 != other.tensor_table_sha256:
            out.append("tensor table (names, shapes, types or offsets) differs")
        return out


def fingerprint(model: Model) -> Fingerprint:
    h = hashlib.sha256()
    for t in model.tensors:
        h.update(f"{t.name}\0{','.join(map(str, t.shape))}\0{t.type.name}\0{t.shard}\0{t.offset}\n".encode())
    return Fingerprint(model.file_bytes, len(model.tensors), h.hexdigest())


@dataclass
class PlanFile:
    """A plan as stored: everything but the model itself."""

    model_path: str
    fingerprint: Fingerprint
    devices: DeviceSet
    placement_options: PlacementOptions
    context: ContextParams
    dialect: str = "llama.cpp"
    moves: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)
    backend: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, plan: Plan, backend: Mapping[str, str] | None = None) -> PlanFile:
        return cls(
            plan.model.path,
            fingerprint(plan.model),
            plan.devices,
            plan.placement_options,
            plan.context,
            plan.dialect,
            dict(plan.moves),
            list(plan.extra_args),
            dict(backend or {}),
        )

    def model_changes(self, model: Model) -> list[str]:
        """How the model on disk differs from the one the plan was made for (empty: same)."""
        return self.fingerprint.differences(fingerprint(model))

    def to_plan(self, model: Model) -> tuple[Plan, list[str]]:
        """The plan for ``model``, and notes about moves that no longer apply."""
        notes: list[str] = []
        moves = {n: d for n, d in self.moves.items() if model.get(n) is not None}
        if len(moves) != len(self.moves):
            notes.append(f"{len(self.moves) - len(moves)} moved tensors are not in the model any more")
        plan = Plan(
            model,
            self.devices,
            self.placement_options,
            self.context,
            self.dialect,
            moves,
            list(self.extra_args),
        )
        return plan, notes


# --- JSON ------------------------------------------------------------------------------------------

T = TypeVar("T")


def _from_dict(cls: type[T], data: Mapping[str, Any], **fixed: Any) -> T:
    """Build a dataclass from the keys it knows (newer files may carry more)."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs = {k: v for k, v in data.items() if k in names}
    kwargs.update(fixed)
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise PlanFileError(f"plan file: bad {cls.__name__}: {e}") from None


def _device_json(d: Device) -> dict[str, Any]:
    out = dataclasses.asdict(d)
    out["kind"] = d.kind.value
    return out


def _device(data: Mapping[str, Any]) -> Device:
    try:
        kind = DeviceKind(data["kind"])
    except (KeyError, ValueError):
        raise PlanFileError(f"plan file: bad device {data!r}") from None
    return _from_dict(Device, data, kind=kind)


def plan_json(pf: PlanFile) -> dict[str, Any]:
    popts = dataclasses.asdict(pf.placement_options)
    popts["overrides"] = [dataclasses.asdict(o) for o in pf.placement_options.overrides]
    popts["tensor_split"] = list(pf.placement_options.tensor_split)
    return {
        "format": FORMAT,
        "version": VERSION,
        "saved_by": f"offload-planner {__version__}",
        "model": {"path": pf.model_path, "fingerprint": dataclasses.asdict(pf.fingerprint)},
        "dialect": pf.dialect,
        "devices": {"cpu": _device_json(pf.devices.cpu), "gpus": [_device_json(g) for g in pf.devices.gpus]},
        "placement_options": popts,
        "context": dataclasses.asdict(pf.context),
        "moves": dict(sorted(pf.moves.items())),
        "extra_args": list(pf.extra_args),
        "backend": dict(pf.backend),
    }


def plan_from_json(data: Mapping[str, Any]) -> PlanFile:
    if not isinstance(data, Mapping) or data.get("format") != FORMAT:
        raise PlanFileError("not an offload-planner plan file")
    version = data.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise PlanFileError(f"plan file version {version!r} is newer than this program reads ({VERSION})")
    try:
        model = data["model"]
        fp = _from_dict(Fingerprint, model["fingerprint"])
        devs = data["devices"]
        devices = DeviceSet(_device(devs["cpu"]), tuple(_device(g) for g in devs.get("gpus", [])))
        po = dict(data["placement_options"])
        overrides = tuple(_from_dict(Override, o) for o in po.pop("overrides", []))
        popts = _from_dict(
            PlacementOptions,
            po,
            overrides=overrides,
            tensor_split=tuple(float(x) for x in po.get("tensor_split", ())),
        )
        ctx = _from_dict(ContextParams, data["context"])
        moves = {str(k): str(v) for k, v in data.get("moves", {}).items()}
        return PlanFile(
            str(model["path"]),
            fp,
            devices,
            popts,
            ctx,
            str(data.get("dialect", "llama.cpp")),
            moves,
            [str(a) for a in data.get("extra_args", [])],
            {str(k): str(v) for k, v in data.get("backend", {}).items()},
        )
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise PlanFileError(f"plan file: missing or bad field ({e})") from None


def save_plan(path: str | Path, pf: PlanFile) -> None:
    """Write atomically: a temp file in the same folder, then ``os.replace``."""
    path = Path(path)
    text = json.dumps(plan_json(pf), indent=1) + "\n"
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        raise PlanFileError(f"cannot write {path}: {e.strerror or e}") from None


def load_plan(path: str | Path) -> PlanFile:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise PlanFileError(f"cannot read {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise PlanFileError(f"{path}: not JSON ({e})") from None
    return plan_from_json(data)
