"""Plan files: versioned JSON with the model's path and fingerprint, devices, options, every user
move and the backend settings.

Reading trusts nothing: the file must be a regular file of at most :data:`MAX_FILE_BYTES` of UTF-8
JSON, and every field is checked for its type and range (devices named as llama.cpp names them,
moves and ``-ot`` rules that name devices of the plan, options llama.cpp accepts); the one error
names the file and the JSON path of the bad field. Writing is atomic (a temp file next to the real
target, then ``os.replace``), keeps the file's mode and a symlink, removes a temp file a killed save
left behind, and never writes a secret (``--api-key``, ``--hf-token`` values are dropped, with a
note).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import secrets
import stat
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from offload_planner import __version__
from offload_planner.core.arg_safety import strip_secrets
from offload_planner.core.cmdline import (
    Dialect,
    ParsedArgs,
    check_pattern,
    check_semantics,
    parse_server_args,
)
from offload_planner.core.cmdline.handlers_mainline import INT_MAX, MAX_DEVICES
from offload_planner.core.cmdline.rpc_endpoint import rpc_endpoint_problem
from offload_planner.core.devices import (
    Device,
    DeviceKind,
    DeviceSet,
    canonical_device_name,
    declared_name_problem,
    kind_of,
)
from offload_planner.core.errors import PlannerError
from offload_planner.core.json_at import At, JsonFieldError, parse_json
from offload_planner.core.memory import DEFAULT_N_BATCH, DEFAULT_N_UBATCH, ContextParams
from offload_planner.core.model import Model
from offload_planner.core.placement import REPACK_TYPES, Override, PlacementOptions
from offload_planner.core.plan import REGENERATED_FLAGS, Plan, plan_command
from offload_planner.core.speculative import spec_from_argv

FORMAT = "offload-planner-plan"
VERSION = 1
SUFFIX = ".plan.json"
#: No plan comes near this (a DeepSeek-V3 plan with every tensor moved is ~100 KB).
MAX_FILE_BYTES = 16 << 20
#: 1 EiB: more than any device has.
MAX_BYTES = 1 << 60
MAX_TENSORS = 1 << 20
MAX_ARGS = 4096
MAX_OVERRIDES = 10_000
#: A temp file of a save: ``.NAME.tmp-PID-RANDOM``; one whose process is gone is removed.
_TMP_RE = r"\.{name}\.tmp-(\d+)-[0-9a-f]+"
_STALE_AFTER_S = 3600.0  # where process ids cannot be checked


class PlanFileError(PlannerError):
    """A plan file that cannot be read or written (names the file, and the field when one is bad)."""


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


def is_url(location: str) -> bool:
    return location.startswith(("http://", "https://"))


@dataclass
class PlanFile:
    """A plan as stored: everything but the model itself."""

    model_path: str
    fingerprint: Fingerprint
    devices: DeviceSet
    placement_options: PlacementOptions
    context: ContextParams
    dialect: Dialect = Dialect.LLAMA_CPP
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

    @property
    def model_is_url(self) -> bool:
        return is_url(self.model_path)

    @property
    def projector_url(self) -> str | None:
        """The URL of a projector among the kept flags (``-mmu``, or ``-mm`` given a URL), which
        opening the plan reads (None: none, or a local file)."""
        from offload_planner.core.mmproj.attach import argv_mmproj_setup

        setup = argv_mmproj_setup(tuple(self.extra_args))
        return setup.location if setup is not None and is_url(setup.location) else None

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
            moves,
            list(self.extra_args),
        )
        from offload_planner.core.engine import placement_options

        argv = plan.extra_args
        if self.dialect.draft_inherits_main_args and any(a in _DRAFT_LOADING for a in argv):
            argv = plan_command(plan)  # ik loads the draft with the main command line (-ot, -ctk, -c, ...)
        plan.spec, spec_notes = spec_from_argv(self.devices, argv, self.dialect, placement_options)
        return plan, notes + spec_notes


#: ik's flags that name a draft model to load: -md, or -draft "ARGS" whose -m may
#: (core.speculative.draft_location)
_DRAFT_LOADING = ("-md", "--model-draft", "-draft", "--draft-params")


# --- writing -----------------------------------------------------------------------------------


def _device_json(d: Device) -> dict[str, Any]:
    out = dataclasses.asdict(d)
    out["kind"] = d.kind.value
    if d.margin or not d.margin_given:  # written only for margin=0B given: files stay as they were
        del out["margin_given"]
    return out


def plan_json(pf: PlanFile) -> dict[str, Any]:
    """The file's JSON object, secrets left out (see :func:`save_plan`)."""
    popts = dataclasses.asdict(pf.placement_options)
    popts["overrides"] = [dataclasses.asdict(o) for o in pf.placement_options.overrides]
    popts["tensor_split"] = list(pf.placement_options.tensor_split)
    if pf.placement_options.selected is None:  # no -dev: written as before the selection was kept
        del popts["selected"]
    else:
        popts["selected"] = [n for n in pf.placement_options.selected if pf.devices.by_name(n)]  # GPUs it has
    extra, _removed = strip_secrets(pf.extra_args, pf.dialect)
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
        "extra_args": extra,
        "backend": dict(pf.backend),
    }


def _pid_alive(pid: int) -> bool:
    if sys.platform == "win32":  # os.kill(pid, 0) would send CTRL_C_EVENT there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def remove_stale_temps(target: Path) -> list[Path]:
    """Remove temp files that saves of ``target`` killed mid-write left in its folder (those of
    processes still running are kept: they may be saving right now). Returns what was removed."""
    pattern = re.compile(_TMP_RE.format(name=re.escape(target.name)))
    removed: list[Path] = []
    try:
        entries = list(target.parent.iterdir())
    except OSError:
        return removed
    now = time.time()
    for p in entries:
        m = pattern.fullmatch(p.name)
        if m is None or int(m[1]) == os.getpid():
            continue
        try:
            st = p.lstat()
            old = now - st.st_mtime > _STALE_AFTER_S
            if stat.S_ISREG(st.st_mode) and (not _pid_alive(int(m[1])) or (sys.platform == "win32" and old)):
                p.unlink()
                removed.append(p)
        except OSError:
            continue
    return removed


def _real_target(path: Path) -> tuple[Path, int | None]:
    """Where the bytes go (a symlink's final target) and the mode to keep (None: a new file)."""
    real = Path(os.path.realpath(path))
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return real, None
    if not stat.S_ISREG(st.st_mode):
        raise PlanFileError(f"cannot write {path}: not a regular file")
    return real, stat.S_IMODE(st.st_mode)


def save_plan(path: str | Path, pf: PlanFile) -> list[str]:
    """Write atomically: a temp file next to the real target (a symlink is kept and its target
    replaced), with the mode the file had, then ``os.replace``. Returns notes for the user (the
    secret flags whose values were not written)."""
    path = Path(path)
    _kept, removed = strip_secrets(pf.extra_args, pf.dialect)
    text = json.dumps(plan_json(pf), indent=1) + "\n"
    try:  # a file the planner writes must load again: a pasted command llama-server would refuse
        plan_from_json(json.loads(text))  # (-t abc) is kept in the window with a note; load refuses it
    except PlannerError as e:
        raise PlanFileError(f"cannot save {path}: the file would not load again: {e}; fix the command "
                            "(the Command tab's Problems name it) and save again") from None
    try:
        real, mode = _real_target(path)
        remove_stale_temps(real)
        tmp = real.parent / f".{real.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        flags = (
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
        )
        fd = os.open(tmp, flags, 0o666 if mode is None else mode)
        try:
            with os.fdopen(fd, "wb") as f:
                if mode is not None and hasattr(os, "fchmod"):
                    os.fchmod(f.fileno(), mode)  # the umask must not narrow the file's mode
                f.write(text.encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, real)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        raise PlanFileError(f"cannot write {path}: {getattr(e, 'strerror', None) or e}") from None
    return [
        f"{flag}: its value is a secret and was not saved in {path.name}; give it again when launching"
        for flag in removed
    ]


# --- reading -----------------------------------------------------------------------------------


def require_regular_file(path: str | Path, what: str) -> os.stat_result:
    """``stat`` of a path that must be a regular file (a FIFO, device or folder would block or
    make no sense); PlanFileError otherwise. ``stat`` itself never blocks."""
    try:
        st = os.stat(path)
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        raise PlanFileError(f"cannot read {what} {path}: {getattr(e, 'strerror', None) or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise PlanFileError(f"{what} {path} is not a regular file ({file_kind(st.st_mode)})")
    return st


def file_kind(mode: int) -> str:
    """What a path that is no regular file is (its ``st_mode``), in words: 'a FIFO', 'a folder', ..."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a file"


def _read_bytes(path: Path) -> bytes:
    """The file's bytes: opened without blocking (a FIFO opens at once and is refused)."""
    flags = (
        os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    )
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        raise PlanFileError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PlanFileError(f"cannot read {path}: not a regular file ({file_kind(st.st_mode)})")
        if st.st_size > MAX_FILE_BYTES:
            raise PlanFileError(f"{path}: {st.st_size:,} bytes; a plan file is at most {MAX_FILE_BYTES:,}")
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_FILE_BYTES:
                raise PlanFileError(f"{path}: more than {MAX_FILE_BYTES:,} bytes; not a plan file")
        return b"".join(chunks)
    except OSError as e:
        raise PlanFileError(f"cannot read {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def load_plan(path: str | Path) -> PlanFile:
    """Read and check a plan file; :class:`PlanFileError` (naming the file and the bad field) is
    the only error it raises."""
    path = Path(path)
    data = _read_bytes(path)
    remove_stale_temps(Path(os.path.realpath(path)))
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise PlanFileError(f"{path}: not UTF-8 text (bad byte at offset {e.start})") from None
    try:
        doc = parse_json(text)
    except json.JSONDecodeError as e:
        raise PlanFileError(f"{path}: not JSON ({e})") from None
    except ValueError as e:
        raise PlanFileError(f"{path}: not JSON ({e})") from None
    except RecursionError:
        raise PlanFileError(f"{path}: not JSON (nested too deeply)") from None
    try:
        return plan_from_json(doc)
    except PlanFileError as e:
        raise PlanFileError(f"{path}: {e}") from None


def plan_from_json(data: Any) -> PlanFile:
    """A plan from the file's JSON object: every field checked (PlanFileError naming its path)."""
    root = At(data)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise PlanFileError('not an offload-planner plan file (no "format": "offload-planner-plan")')
    try:
        version = root.key("version").value
        if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
            raise PlanFileError(f"plan file version {version} is newer than this program reads ({VERSION})")
        root.key("version").integer(1, VERSION)
        return _plan_file(root)
    except JsonFieldError as e:
        raise PlanFileError(f"bad field {e}") from None


def _plan_file(root: At) -> PlanFile:
    dialect = Dialect(root.key("dialect", Dialect.LLAMA_CPP.value).choice([d.value for d in Dialect]))
    model = root.key("model")
    model_path = _model_path(model.key("path"))
    fp = _fingerprint(model.key("fingerprint"))
    devices = _devices(root.key("devices"))
    popts = _placement_options(root.key("placement_options"), devices, dialect)
    ctx = _context(root.key("context"))
    _check_dialect(root, dialect, popts, ctx)
    moves = {}
    for name, dev in root.key("moves", {}).items(max_len=MAX_TENSORS):
        if not name or len(name) > 512 or "\0" in name:
            raise dev.fail("not a tensor name")
        moves[name] = _device_name(dev, devices)
    extra, selected = _extra_args(root.key("extra_args", []), dialect, devices)
    if selected is not None and popts.selected is None:  # a file from before the plan kept -dev itself
        popts = dataclasses.replace(popts, selected=selected)
    backend = {k: v.text() for k, v in root.key("backend", {}).items(max_len=64)}
    return PlanFile(model_path, fp, devices, popts, ctx, dialect, moves, extra, backend)


def _extra_args(at: At, dialect: Dialect, devices: DeviceSet) -> tuple[list[str], tuple[str, ...] | None]:
    """The flags the plan keeps verbatim, checked as ``plan`` checks its command line (llama-server's
    refusals that need no model: an unknown flag, ``-t abc``, ``-ot`` naming no device of the plan):
    a hand-edited entry went into the command unchecked. A flag the plan sets itself (``-ts``, ``-c``,
    ``-ot``, ...: core.plan.REGENERATED_FLAGS) is refused too: it would override the plan's own
    while the estimate assumed the plan's. ``-dev`` is taken out and returned as the GPUs it selects:
    files saved before the plan wrote it itself (placement_options.selected) kept it here."""
    entries = at.elements(max_len=MAX_ARGS)
    extra = [a.text(max_len=65536) for a in entries]
    if extra and not extra[0].startswith("-"):
        raise entries[0].fail(f"{_short(extra[0])} is not a flag (llama-server takes no positional argument)")
    parsed = parse_server_args(extra, dialect=dialect, env={})
    errors = [*parsed.errors, *check_semantics(parsed, devices.names, dialect=dialect)]
    if errors:
        e = errors[0]
        i = next((i for i, a in enumerate(extra) if a == e.flag or a.startswith(f"{e.flag}=")), None)
        raise (at if i is None else entries[i]).fail(f"llama-server would refuse it: {e}")
    for f in parsed.flags:
        if f.index >= 0 and f.key in REGENERATED_FLAGS and f.key != "--device":
            raise entries[f.index].fail(f"{f.spelling} is set by the plan itself (its devices, placement or "
                                        "context): extra_args keep only the flags the plan does not set")
    return _without_device(extra, parsed, dialect, devices)


def _without_device(extra: list[str], parsed: ParsedArgs, dialect: Dialect, devices: DeviceSet
                    ) -> tuple[list[str], tuple[str, ...] | None]:
    """``extra`` without its ``-dev`` (``-dev X`` or ``-dev=X``), and the GPUs that selects."""
    uses = [f for f in parsed.flags if f.key == "--device" and f.index >= 0]
    if not uses:
        return extra, None
    drop = {f.index for f in uses} | {f.index + 1 for f in uses if extra[f.index] == f.spelling and f.values}
    selected = dialect.selected_gpus(parsed.args.devices, devices.gpus)
    return [a for i, a in enumerate(extra) if i not in drop], selected


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:80] + "...")


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")


def _check_dialect(root: At, dialect: Dialect, popts: PlacementOptions, ctx: ContextParams) -> None:
    """Settings the dialect decides (core.engine, core.plan_edits.with_dialect) must agree with it:
    a file that mixes them would project what no server does."""
    po, cx = root.key("placement_options"), root.key("context")
    if ctx.dialect != dialect:
        raise cx.key("dialect").fail(f"{ctx.dialect!r} differs from the plan's dialect {dialect!r}")
    first = dialect.output_first
    if popts.output_first != first:
        raise po.key("output_first").fail(f"must be {str(first).lower()} for {dialect}")
    if popts.plain_cpu_overrides != dialect.plain_cpu_overrides:
        raise po.key("plain_cpu_overrides").fail(
            f"must be {str(dialect.plain_cpu_overrides).lower()} for {dialect}")
    if not dialect.has_cpu_repack and popts.use_extra_bufts:
        raise po.key("use_extra_bufts").fail(f"{dialect.label} has no CPU_REPACK buffers (must be false)")
    for name in ("mla", "amb", "repack"):
        if not dialect.has_mla_settings and getattr(ctx, name):
            raise cx.key(name).fail(f"an ik_llama.cpp setting; must be 0 for {dialect}")


def _model_path(at: At) -> str:
    path = at.text(nonempty=True)
    if _SCHEME.match(path) and not is_url(path):
        raise at.fail(f"{path[:80]!r}: only local paths and http(s) URLs are read")
    return path


def _fingerprint(at: At) -> Fingerprint:
    sha = at.key("tensor_table_sha256").text(max_len=64)
    if not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise at.key("tensor_table_sha256").fail("not a SHA-256 hex digest")
    return Fingerprint(
        at.key("file_bytes").integer(0, MAX_BYTES), at.key("n_tensors").integer(0, MAX_TENSORS), sha
    )


def _devices(at: At) -> DeviceSet:
    cpu = _device(at.key("cpu"), cpu=True)
    gpus: list[Device] = []
    for g in at.key("gpus", []).elements(max_len=MAX_DEVICES):
        d = _device(g, cpu=False)
        if any(d.name == other.name for other in gpus):
            raise g.key("name").fail(f"{d.name} appears twice")
        gpus.append(d)
    return DeviceSet(cpu, tuple(gpus))


#: ``Metal0``: a plan file written before the planner named Metal devices as the pinned build does (MTL0)
_DEVICE_NAME = re.compile(r"(CPU|CUDA|ROCm|Vulkan|MTL|Metal|SYCL|RPC)(\d{0,3})")


def _usable_endpoint(endpoint: str) -> bool:
    """An ``--rpc`` entry llama-server can use (as the parser reads it: ``127.0.0.1:50052x`` is port
    50052), printable and without the ``,`` that would split it in two."""
    return endpoint.isprintable() and "," not in endpoint and not rpc_endpoint_problem(endpoint)[0]


def _device(at: At, *, cpu: bool) -> Device:
    name_at = at.key("name")
    name = name_at.text(max_len=16)
    m = _DEVICE_NAME.fullmatch(name)
    if m is None or (m[1] == "CPU") != (m[2] == ""):
        raise name_at.fail(f"{name!r} is not a device name (CPU, CUDA0, ROCm0, Vulkan0, MTL0, RPC0, ...)")
    name = canonical_device_name(name)  # an old file's Metal0 is MTL0
    if declared_name_problem(name):  # CUDA01: no device of llama.cpp's, as --device refuses it
        raise name_at.fail(declared_name_problem(name))
    kind = DeviceKind(at.key("kind").choice([k.value for k in DeviceKind]))
    if kind is not kind_of(name):
        raise at.key("kind").fail(f"{kind.value} does not match the device name {name}")
    if cpu != (kind is DeviceKind.CPU):
        raise name_at.fail("the CPU entry must be CPU" if cpu else "CPU cannot be a GPU entry")
    endpoint = at.key("endpoint", "").text(max_len=260)
    if endpoint and (kind is not DeviceKind.RPC or not _usable_endpoint(endpoint)):
        raise at.key("endpoint").fail(f"{endpoint[:80]!r} is not the HOST:PORT of an RPC server")
    total = at.key("total", None).opt_integer(0, MAX_BYTES)
    free = at.key("free", None).opt_integer(0, MAX_BYTES)
    if total is not None and free is not None and free > total:
        raise at.key("free").fail(f"{free} bytes free is more than the device's total {total} bytes")
    margin = at.key("margin", 0).integer(0, MAX_BYTES)
    if total is not None and not cpu and margin >= total:
        raise at.key("margin").fail(f"a margin of {margin} bytes leaves nothing of the device's total "
                                    f"{total} bytes")
    return Device(
        name,
        kind,
        total,
        free,
        description=at.key("description", "").text(max_len=1024),
        source=at.key("source", "declared").text(max_len=64),
        endpoint=endpoint,
        bandwidth_gbs=_bandwidth(at.key("bandwidth_gbs", None)),
        margin=margin,
        margin_given=at.key("margin_given", False).boolean(),
        hardware=_hardware(at.key("hardware", [])),
    )


def _bandwidth(at: At) -> float | None:
    """A declared memory bandwidth in GB/s, in the range ``--device bw=`` takes (0: none declared):
    5e-324 made every speed 0.0 and the estimate's JSON carry NaN and Infinity."""
    from offload_planner.core.speed.declared import MAX_RATE_GBS, MIN_RATE_GBS

    bw = at.opt_number(0.0, MAX_RATE_GBS)
    if bw and bw < MIN_RATE_GBS:
        raise at.fail(f"{bw!r} GB/s is below {MIN_RATE_GBS:g} GB/s (one byte per second)")
    return bw


def _hardware(at: At) -> tuple[tuple[str, str], ...]:
    """Declared speed figures (``[["card", "rtx3090"], ["bw", "936GB/s"], ...]``), checked as
    ``--device`` checks them."""
    from offload_planner.core.speed.declared import parse_hardware_keys

    pairs: list[tuple[str, str]] = []
    for e in at.elements(max_len=16):
        kv = e.elements(max_len=2)
        if len(kv) != 2:
            raise e.fail("expected a [key, value] pair")
        pairs.append((kv[0].text(max_len=32), kv[1].text(max_len=64)))
    try:
        parse_hardware_keys(pairs)
    except ValueError as ex:
        raise at.fail(str(ex)) from None
    return tuple(pairs)


def _device_name(at: At, devices: DeviceSet) -> str:
    name = at.text(max_len=64)
    d = devices.by_name(name)
    if d is None:
        raise at.fail(f"{name!r} is not a device of this plan ({', '.join(devices.names)})")
    return d.name


def _placement_options(at: At, devices: DeviceSet, dialect: Dialect) -> PlacementOptions:
    overrides = tuple(_override(o, devices) for o in at.key("overrides", []).elements(max_len=MAX_OVERRIDES))
    split = tuple(x.number(0.0, 1e12) for x in at.key("tensor_split", []).elements(max_len=MAX_DEVICES))
    return PlacementOptions(
        n_gpu_layers=at.key("n_gpu_layers").integer(0, INT_MAX),
        tensor_split=split,
        split_mode=at.key("split_mode", "layer").choice(dialect.split_modes),
        main_gpu=at.key("main_gpu", 0).integer(0, max(0, len(devices.gpus) - 1)),
        overrides=overrides,
        use_mmap=at.key("use_mmap", True).boolean(),
        no_host=at.key("no_host", False).boolean(),
        use_extra_bufts=at.key("use_extra_bufts", True).boolean(),
        output_first=at.key("output_first", True).boolean(),
        cpu_profile=at.key("cpu_profile", "x86-avx2").choice(sorted(REPACK_TYPES)),
        load_mtp=at.key("load_mtp", False).boolean(),
        plain_cpu_overrides=at.key("plain_cpu_overrides", dialect.plain_cpu_overrides).boolean(),
        selected=_selected(at.key("selected", None), devices),
    )


def _selected(at: At, devices: DeviceSet) -> tuple[str, ...] | None:
    """The GPUs a ``-dev`` selected (absent or null: none given), each a GPU of the plan, once."""
    if at.value is None:
        return None
    names = tuple(_device_name(e, devices) for e in at.elements(max_len=MAX_DEVICES))
    if "CPU" in names or len(set(names)) != len(names):
        raise at.fail("the selected devices are GPUs of the plan, each once")
    return names


def _override(at: At, devices: DeviceSet) -> Override:
    pattern_at = at.key("pattern")
    pattern = pattern_at.text(max_len=4096, nonempty=True)
    check = check_pattern(pattern)
    if check.error is not None:
        raise pattern_at.fail(f"-ot pattern {pattern[:80]!r}: {check.error}")
    buft_at = at.key("buft")
    buft = buft_at.text(max_len=300)
    if devices.resolve_buffer_type(buft) is None:
        named = devices.by_name(buft)  # an old file's Metal0: the plan's MTL0
        if named is None or named.buffer_type != named.name:
            raise buft_at.fail(f"{buft[:80]!r} is not a device of this plan ({', '.join(devices.names)})")
        buft = named.buffer_type
    return Override(pattern, buft, at.key("source", "-ot").text(max_len=64))


def _cache_type(at: At, dialect: Dialect) -> str:
    return at.choice(dialect.kv_cache_types())


def _context(at: At) -> ContextParams:
    dialect = Dialect(at.key("dialect", Dialect.LLAMA_CPP.value).choice([d.value for d in Dialect]))
    return ContextParams(
        n_ctx=at.key("n_ctx").integer(0, INT_MAX),
        n_batch=at.key("n_batch", DEFAULT_N_BATCH).integer(1, INT_MAX),
        n_ubatch=at.key("n_ubatch", DEFAULT_N_UBATCH).integer(1, INT_MAX),
        n_seq_max=at.key("n_seq_max", 1).integer(1, dialect.max_seq or INT_MAX),  # ik: no LLAMA_MAX_SEQ
        kv_unified=at.key("kv_unified", False).boolean(),
        flash_attn=at.key("flash_attn", True).boolean(),
        type_k=_cache_type(at.key("type_k", "f16"), dialect),
        type_v=_cache_type(at.key("type_v", "f16"), dialect),
        offload_kqv=at.key("offload_kqv", True).boolean(),
        swa_full=at.key("swa_full", False).boolean(),
        n_outputs_max=at.key("n_outputs_max", None).opt_integer(1, INT_MAX),
        op_offload=at.key("op_offload", True).boolean(),
        dialect=dialect,
        mla=at.key("mla", 0).integer(0, 3),
        amb=at.key("amb", 0).integer(0, INT_MAX),
        repack=at.key("repack", False).boolean(),
    )
