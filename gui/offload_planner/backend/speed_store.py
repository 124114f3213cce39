"""This machine's speed figures: the RAM bandwidth probe and measured efficiencies, cached.

The probe copies a buffer a few hundred MiB large with one thread per core (numpy releases the GIL
while copying) for about a second and counts the bytes read and written, then one thread alone for
half a second (what one of llama.cpp's compute threads can read: :func:`thread_bandwidth`).  The
result is cached in ``speed.json`` under the config directory (:func:`config_folder.config_dir`), keyed
by machine, with the efficiencies ``launch --bench`` measures per machine and backend
(:func:`record_efficiencies`).
The CPU's instruction set and model name (:func:`this_cpu`) are read from the operating system once
a process.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from offload_planner.backend.config_folder import config_dir, read_config_file
from offload_planner.core.cmdline.cnum import stoi
from offload_planner.core.cmdline.rpc_endpoint import rpc_host
from offload_planner.core.devices import DECLARED_RAM, DeviceKind, DeviceSet
from offload_planner.core.dialects import Dialect
from offload_planner.core.errors import PlannerError
from offload_planner.core.placement import Placement
from offload_planner.core.plan import Plan
from offload_planner.core.speed.acceptance import AcceptArg
from offload_planner.core.speed.cpu_isa import CpuInfo, parse_proc_cpuinfo, parse_sysctl
from offload_planner.core.speed.declared import MAX_RATE_GBS, parse_hardware_keys
from offload_planner.core.speed.efficiency import Efficiencies, calibrated, defaults_for, for_host
from offload_planner.core.speed.estimate import DEFAULT_PROMPT, estimate
from offload_planner.core.speed.hardware import (
    DEFAULT_CPU_GHZ,
    NO_DRAFT_THREADS,
    DraftThreads,
    Figure,
    Hardware,
    MeasuredLink,
    Source,
    Threads,
    hardware_for,
)
from offload_planner.core.speed.result import SpeedEstimate
from offload_planner.core.speed.slots import with_slots
from offload_planner.core.speed.speculation import with_speculation
from offload_planner.core.units import fmt_bytes

FILE_NAME = "speed.json"
PROBE_BYTES = 256 * 1024 * 1024
PROBE_SECONDS = 1.0


#: inside :func:`one_reading`: the store's path, this machine's key and the file's contents, each worked
#: out at most once (a plan's estimate asks for the RAM figure and the efficiencies: one reading)
_READING: ContextVar[dict[str, Any] | None] = ContextVar("speed_store_reading", default=None)
_T = TypeVar("_T")


@contextlib.contextmanager
def one_reading() -> Iterator[None]:
    """The store read once inside (this thread or task only): what the first look-up read (and what a
    measurement kept since) answers the next ones."""
    token = _READING.set({})
    try:
        yield
    finally:
        _READING.reset(token)


def _once(name: str, make: Callable[[], _T]) -> _T:
    reading = _READING.get()
    if reading is None:
        return make()
    if name not in reading:
        reading[name] = make()
    got: _T = reading[name]
    return got


def node_and_machine() -> tuple[str, str]:
    """``platform.node()`` and ``platform.machine()``, without importing :mod:`platform` (1 ms of every
    new ``plan`` process) where ``os.uname`` answers: there ``platform.uname`` takes them from it as
    they are, 'unknown' read as ''."""
    if not hasattr(os, "uname"):  # Windows
        import platform

        return platform.node(), platform.machine()
    u = os.uname()
    return ("" if u.nodename == "unknown" else u.nodename), ("" if u.machine == "unknown" else u.machine)


def machine_key() -> str:
    return _once("key", lambda: "{}|{}|{}".format(*node_and_machine(), os.cpu_count()))


def _path() -> Path:
    return _once("path", lambda: config_dir() / FILE_NAME)


def _load() -> dict[str, Any]:
    """The stored file; anything unreadable or of the wrong shape counts as empty."""
    return _once("data", _read)


def read_bytes(path: str | os.PathLike[str], limit: int | None = None, *,
               enough: Callable[[bytes], bool] | None = None) -> bytes:
    """A small file's bytes, its first ``limit`` bytes when given (a system file that comes in pieces is
    read until its end), without a buffered or text stream: a ``plan`` reads this machine's figures from
    a few such files, where setting a stream up cost more than the read itself.  ``enough``: read in
    pages and stop at the first whose bytes so far it accepts (a kernel file made as it is read, as
    /proc/cpuinfo is a processor at a time, is then made no further than needed)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        chunks: list[bytes] = []
        left = -1 if limit is None else limit
        piece = 1 << 16 if enough is None else 1 << 12
        while left:
            chunk = os.read(fd, piece if left < 0 else min(left, piece))
            if not chunk:
                break
            chunks.append(chunk)
            left = -1 if left < 0 else left - len(chunk)
            if enough is not None and enough(b"".join(chunks)):
                break
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read() -> dict[str, Any]:
    data = _parsed(_path())[0]
    entry = data.get("machines", {}).get(machine_key())
    if entry is not None and not isinstance(entry, dict):
        del data["machines"][machine_key()]
    return data


def _number(value: object, low: float, high: float) -> float | None:
    """A stored figure when it is a real number from ``low`` to ``high`` (not a bool, NaN or
    infinity, which the JSON module reads from a damaged or hand-edited file), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if low <= value <= high else None


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _damage(path: Path) -> str | None:
    """Why the store at ``path`` cannot be read (None: it reads, is empty or is not there): what
    :func:`_read` took for an empty store, though it may hold a user's calibrations."""
    return _parsed(path)[1]


def _parsed(path: Path) -> tuple[dict[str, Any], str | None]:
    """The store at ``path`` and why it cannot be read: ``{}`` and None when it is empty or not there,
    ``{}`` and the reason when it is no speed store (not a regular file, not UTF-8 text, not JSON or
    nested deeper than json's stack, no 'machines' object)."""
    try:
        raw, problem = read_config_file(path)
    except OSError:
        return {}, None
    if problem is not None:
        return {}, problem
    if not raw.strip():
        return {}, None
    try:  # the text read_text gives: UTF-8 (JSON has no raw newline in a string to translate)
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return {}, "not UTF-8 text"
    except ValueError as e:
        return {}, f"not JSON: {e}"
    except RecursionError:
        return {}, "not JSON: nested too deeply"
    if not isinstance(data, dict) or not isinstance(data.get("machines", {}), dict):
        return {}, "not a speed store (no 'machines' object)"
    return data, None


def _save(data: dict[str, Any]) -> str:
    """Write the store atomically; a folder that cannot take it (not a folder, read-only, full) is
    a :class:`PlannerError` naming the file, and leaves no temporary file behind. A store there that
    could not be read is not written over: it is renamed ``speed.json.damaged`` first, and the
    returned note says so ('' when there was none)."""
    path = _path()
    tmp, note = "", ""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".speed-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        damage = _damage(path)
        if damage is not None:
            aside = path.with_name(path.name + ".damaged")
            os.replace(path, aside)
            note = f"{path} could not be read ({_printable(damage, 120)}): kept as {aside}, a new one started"
        os.replace(tmp, path)
    except OSError as e:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise PlannerError(f"{path}: cannot write the speed store: {e.strerror or e}") from None
    return note


def _keep(data: dict[str, Any]) -> str:
    """Save a measurement to reuse next time: '' when kept, else why not (the figure is still used),
    or where the damaged store it replaced went."""
    try:
        note = _save(data)
    except PlannerError as e:
        return f"; not kept: {e}"
    return f"; {note}" if note else ""


@dataclass(frozen=True)
class RamProbe:
    """A RAM probe's figure and the share of its wall time its threads ran on a core: under 1 when
    other work took the cores (one busy process per core: about 0.5 on a 2-core machine; quiet 0.98),
    and the single-thread pass's figure."""

    gbs: float
    cpu_share: float
    #: GB/s of the same copy by one thread alone (None: not measured)
    thread_gbs: float | None = None


#: A probe whose threads ran less than this share of their wall time counts as taken while busy,
#: whatever the load average said (a 1-minute average lags: this machine cached 13.5 GB/s from a probe
#: taken during a pip install at load 0.5, 32-49 GB/s quiet).
BUSY_CPU_SHARE = 0.8


def measure_ram(seconds: float = PROBE_SECONDS, nbytes: int = PROBE_BYTES) -> RamProbe:
    """GB/s of a multi-threaded copy (bytes read + bytes written per second), and the process's CPU
    time over the threads' wall time (numpy's copy runs without the GIL)."""
    import numpy as np

    n_threads = max(1, os.cpu_count() or 1)
    chunk = max(1 << 20, nbytes // n_threads)
    src = [np.ones(chunk, dtype=np.uint8) for _ in range(n_threads)]
    dst = [np.empty(chunk, dtype=np.uint8) for _ in range(n_threads)]
    copied = [0] * n_threads
    for i in range(n_threads):  # warm up: fault the pages in
        np.copyto(dst[i], src[i])
    cpu0 = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds

    def work(i: int) -> None:
        while True:  # at least one copy per thread
            np.copyto(dst[i], src[i])
            copied[i] += 2 * chunk
            if time.perf_counter() >= deadline:
                return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    share = (time.process_time() - cpu0) / (wall * n_threads)
    one, one_share = _one_thread_copy(src[0], dst[0], seconds / 2)
    return RamProbe(sum(copied) / wall / 1e9, min(share, one_share), one)


def _one_thread_copy(src: Any, dst: Any, seconds: float) -> tuple[float, float]:
    """GB/s (read + written) of one thread copying ``src`` to ``dst`` for ``seconds`` (at least once),
    and the share of the wall time it ran on a core."""
    import numpy as np

    copied = 0
    cpu0 = time.process_time()
    start = time.perf_counter()
    while True:
        np.copyto(dst, src)
        copied += 2 * src.nbytes
        if time.perf_counter() - start >= seconds:
            break
    wall = time.perf_counter() - start
    return copied / wall / 1e9, (time.process_time() - cpu0) / wall


def measure_ram_bandwidth(seconds: float = PROBE_SECONDS, nbytes: int = PROBE_BYTES) -> float:
    """GB/s of a multi-threaded copy (:func:`measure_ram`)."""
    return measure_ram(seconds, nbytes).gbs


#: A RAM probe taken while every core was busy on average (1-minute load average at least the logical
#: CPUs) reads low: a 2-core machine read 7.4 GB/s under load and 32-45 GB/s quiet, and the cached
#: figure stayed.  Such a figure is measured again, at most once an hour, keeping the larger.  So is
#: one cached before the mark was recorded (no ``ram_busy``: busy or not, unknown), once: the
#: measurement records the mark.
BUSY_REPROBE_S = 3600


def machine_busy() -> bool:
    """Every core busy on average over the last minute (no load average, e.g. Windows: not busy)."""
    try:
        return os.getloadavg()[0] >= (os.cpu_count() or 1)
    except (OSError, AttributeError):
        return False


def _older_than(when: object, seconds: float) -> bool:
    try:
        return time.time() - stamp_seconds(str(when)) > seconds
    except (ValueError, OverflowError):
        return True


#: a time as the store writes it (``time.strftime("%Y-%m-%d %H:%M")``)
_STAMP = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2}) ([0-9]{2}):([0-9]{2})")
_MONTH_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def stamp_seconds(when: str) -> float:
    """``time.mktime(time.strptime(when, "%Y-%m-%d %H:%M"))``, ValueError where strptime raises it,
    without importing ``_strptime`` (with calendar and datetime, about 3 ms of a new ``plan`` process
    whose cached RAM figure is checked for age) for a time as the store writes it: four, two, two, two
    and two ASCII digits; any other text goes to strptime.  Its checks on those: a year from 1, a month
    1-12, a day of that month (proleptic Gregorian, as ``datetime.date``), hours 0-23, minutes 0-59;
    ``mktime`` reads the same fields (it ignores the week and year days)."""
    m = _STAMP.fullmatch(when)
    if m is None:
        return time.mktime(time.strptime(when, "%Y-%m-%d %H:%M"))
    year, month, day, hour, minute = (int(x) for x in m.groups())
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    if not (year >= 1 and 1 <= month <= 12 and hour <= 23 and minute <= 59
            and 1 <= day <= _MONTH_DAYS[month - 1] + (month == 2 and leap)):
        raise ValueError(f"time data {when!r} is no time of format '%Y-%m-%d %H:%M'")
    yday = sum(_MONTH_DAYS[: month - 1]) + (month > 2 and leap) + day
    return time.mktime((year, month, day, hour, minute, 0, 0, yday, -1))


def _stale(when: object, seconds: float) -> bool:
    """A time stored as ``%Y-%m-%d %H:%M`` more than ``seconds`` ago, unreadable, or in the future (a
    clock set back, a hand-edited file: else never stale until then)."""
    return _older_than(when, seconds) or not _older_than(when, -60)


def system_ram() -> int:
    """This machine's RAM in bytes (:func:`~offload_planner.backend.system.ram_total`)."""
    from offload_planner.backend.system import ram_total

    return ram_total()


def probe_speed_note(devices: DeviceSet) -> str:
    """A CPU declared larger than this machine's RAM (``--device CPU=512GiB``: another machine) whose RAM
    speed is not given (no ``ram=``/``bw=``) is priced at this machine's RAM probe: said in words, with
    how to give the other machine's. Its assumption line named the probe, and a newcomer planning a
    server from a laptop read the laptop's speed as the server's. "" otherwise (a size at or below
    this machine's RAM keeps some free here, where this machine's speed is the right one)."""
    cpu = devices.cpu
    if cpu.description != DECLARED_RAM or cpu_elsewhere(devices) or cpu.total is None:
        return ""
    here = system_ram()
    if cpu.total <= here:
        return ""
    size = _size_text(cpu.total)
    return (f"--device {cpu.name}={size} is more RAM than this machine's {fmt_bytes(here, precision=1)}, but "
            "the speed estimate still takes this machine's RAM speed (its probe, in the assumptions); for "
            f"another machine give its speed too: --device {cpu.name}={size},ram=8xDDR5-4800 (channels x "
            "MT/s) or bw=300GB/s")


def _size_text(n: int) -> str:
    """A size as --device takes it: ``512GiB`` (``1.5GiB`` where it is not whole)."""
    return f"{n >> 30}GiB" if n % (1 << 30) == 0 else f"{n / (1 << 30):.1f}GiB"


def host_bandwidth(*, measure: bool = True) -> Figure | None:
    """This machine's RAM bandwidth: cached, else measured now (about a second) when ``measure``; a
    figure measured while the machine was busy, or kept without saying (:data:`BUSY_REPROBE_S`), is
    measured again an hour later (the larger kept)."""
    data = _load()
    entry = data.get("machines", {}).get(machine_key(), {})
    bw = _number(entry.get("ram_gbs"), 0.01, MAX_RATE_GBS)  # a damaged figure is measured again
    when = _stamp(entry.get("ram_measured_at", ""))
    busy = entry.get("ram_busy") is True
    quiet = entry.get("ram_busy") is False  # neither: kept before the mark existed, measured again once
    if measure and (bw is None or (not quiet and _stale(when, BUSY_REPROBE_S))):
        probe = measure_ram()
        new = round(probe.gbs, 1)
        busy = machine_busy() or probe.cpu_share < BUSY_CPU_SHARE
        bw = max(new, bw or 0.0)
        when = time.strftime("%Y-%m-%d %H:%M")
        entry = {**entry, "ram_gbs": bw, "ram_measured_at": when, "ram_busy": busy,
                 **_thread_entry(entry, probe.thread_gbs, busy, when)}
        data.setdefault("machines", {})[machine_key()] = entry
        when += _keep(data)
    if bw is None:
        return None
    note = f"RAM probe on this machine ({when}{', while it was busy' if busy else ''}, {_path()})"
    return Figure(float(bw), "GB/s", Source.MEASURED, note)


def _thread_entry(entry: dict[str, Any], gbs: float | None, busy: bool, when: str) -> dict[str, Any]:
    """The single-thread figure to keep in ``entry``: ``gbs`` measured now (busy or not, at ``when``)
    or the one kept, the larger (as :func:`host_bandwidth` keeps its figure); nothing when not measured."""
    if gbs is None:
        return {}
    kept = _number(entry.get("ram_thread_gbs"), 0.01, MAX_RATE_GBS) or 0.0
    return {"ram_thread_gbs": max(round(gbs, 1), kept), "ram_thread_measured_at": when,
            "ram_thread_busy": busy}


def thread_bandwidth(*, measure: bool = True) -> Figure | None:
    """GB/s of one thread's copy on this machine (the RAM probe's single-thread pass): what one of
    llama.cpp's compute threads reads at most (core.speed.rates.thread_bandwidth).  Cached; else
    measured now (half a second, one thread) when ``measure``; one measured while the machine was busy
    is measured again an hour later, the larger kept."""
    data = _load()
    entry = data.get("machines", {}).get(machine_key(), {})
    gbs = _number(entry.get("ram_thread_gbs"), 0.01, MAX_RATE_GBS)
    when = _stamp(entry.get("ram_thread_measured_at", ""))
    busy = entry.get("ram_thread_busy") is not False
    if measure and (gbs is None or (busy and _stale(when, BUSY_REPROBE_S))):
        import numpy as np

        src = np.ones(max(1 << 20, PROBE_BYTES // max(1, os.cpu_count() or 1)), dtype=np.uint8)
        dst = np.empty_like(src)
        np.copyto(dst, src)  # fault the pages in
        new, share = _one_thread_copy(src, dst, PROBE_SECONDS / 2)
        busy = machine_busy() or share < BUSY_CPU_SHARE
        when = time.strftime("%Y-%m-%d %H:%M")
        entry = {**entry, **_thread_entry(entry, new, busy, when)}
        gbs = entry["ram_thread_gbs"]
        data.setdefault("machines", {})[machine_key()] = entry
        when += _keep(data)
    if gbs is None:
        return None
    note = f"one thread's copy on this machine ({when}{', while it was busy' if busy else ''}, {_path()})"
    return Figure(gbs, "GB/s", Source.MEASURED, note)


#: A probe that failed after waiting (an rpc-server that does not answer, a host that drops the
#: connection attempt: up to the 2 s socket timeout) is remembered per HOST:PORT this long, so that
#: every ``plan`` does not wait again; a failure learnt faster (a refused connection) costs nothing
#: to learn again and is not kept, so a server started since is measured at the next run.
RPC_FAILURE_KEEP_S = 600
RPC_FAILURE_SLOW_S = 0.5


def _printable(text: str, limit: int = 300) -> str:
    """A stored message as printed: no control characters (a hand-edited file), at most ``limit``."""
    return "".join(c for c in text if c.isprintable())[:limit]


def _stamp(value: object) -> str:
    """A stored time as printed: :func:`_printable`, at most 40 characters (the store writes 16; a hand
    edit's or another program's text is not printed whole, nor its escape sequences)."""
    return _printable(str(value), 40)


def _remembered_failure(got: object) -> str | None:
    """Why the last probe failed, when it failed within :data:`RPC_FAILURE_KEEP_S` (said so, with when
    and when it is probed again); None when there is no such failure or it has expired."""
    if not isinstance(got, dict) or not isinstance(got.get("failed"), str):
        return None
    at = _stamp(got.get("at", ""))
    if _stale(at, RPC_FAILURE_KEEP_S):
        return None
    return (f"{_printable(got['failed'])} (a failed probe remembered from {at}, {_path()}; probed again "
            f"{RPC_FAILURE_KEEP_S // 60} minutes after it)")


def _probe_rpc(endpoint: str, data: dict[str, Any], entry: dict[str, Any],
               links: dict[str, Any], *, keep_failure: bool = True) -> dict[str, Any] | str:
    """Probe now and keep the figures, or why it failed (kept when the failure took a while and
    ``keep_failure``)."""
    from offload_planner.backend.rpc_probe import RpcProbeError, probe_link

    def store(got: dict[str, Any]) -> str:
        data.setdefault("machines", {})[machine_key()] = {**entry, "rpc_links": {**links, endpoint: got}}
        return _keep(data)

    start = time.monotonic()
    try:
        p = probe_link(endpoint)
    except RpcProbeError as e:  # said in the estimate's assumptions: a silent default hid it
        if keep_failure and time.monotonic() - start >= RPC_FAILURE_SLOW_S:
            store({"failed": str(e), "at": time.strftime("%Y-%m-%d %H:%M")})
        return str(e)
    at = time.strftime("%Y-%m-%d %H:%M")
    got: dict[str, Any] = {"gbs": round(p.gbs, 4), "rtt_us": round(p.rtt_us, 1),
                           "graph_us": round(p.graph_us, 1), "at": at, "server": p.server_version,
                           "mem_total": p.mem_total, "devices": p.n_devices}
    got["at"] = at + store(got)  # said in the note, not stored
    return got


def rpc_link(endpoint: str, *, measure: bool = True) -> MeasuredLink | str | None:
    """The link to the rpc-server at ``endpoint`` from this machine: cached, else probed now through
    the RPC protocol when ``measure`` (:mod:`backend.rpc_probe`); when the probe failed, why (naming
    HOST:PORT; a failure remembered from a recent run is said so, :data:`RPC_FAILURE_KEEP_S`); None
    when not cached and not probed."""
    data = _load()
    entry = data.get("machines", {}).get(machine_key(), {})
    links = entry.get("rpc_links") if isinstance(entry.get("rpc_links"), dict) else {}
    got = links.get(endpoint)
    valid = (isinstance(got, dict) and _number(got.get("gbs"), 1e-6, MAX_RATE_GBS) is not None
             and _number(got.get("rtt_us"), 0.0, 1e9) is not None)
    if not valid:
        if not measure:
            return None
        remembered = _remembered_failure(got)
        if remembered is not None:
            return remembered
        got = _probe_rpc(endpoint, data, entry, links)
        if isinstance(got, str):
            return got
    elif measure and isinstance(got, dict) and "mem_total" not in got and is_local(endpoint):
        # kept before the probe asked the server's memory (cpu_backend_evidence): asked now, the figures
        # kept when the server does not answer
        again = _probe_rpc(endpoint, data, entry, links, keep_failure=False)
        got = {**got, "at": _stamp(got.get("at", ""))} if isinstance(again, str) else again
    elif isinstance(got, dict):  # valid: cached
        got = {**got, "at": _stamp(got.get("at", ""))}
    assert isinstance(got, dict)
    total, n_dev = _number(got.get("mem_total"), 1.0, 2.0**64), _number(got.get("devices"), 1.0, 2.0**32)
    return MeasuredLink(float(got["gbs"]), float(got["rtt_us"]),
                        f"probed {endpoint} through the RPC protocol ({got.get('at', '')}, {_path()})",
                        _number(got.get("graph_us"), 0.0, 1e9) or 0.0,  # kept before it was measured: 0
                        None if total is None else int(total), None if n_dev is None else int(n_dev))


def rpc_links(devices: DeviceSet, *, measure: bool = True) -> dict[str, MeasuredLink | str]:
    """Measured links of the set's RPC devices, by endpoint (those cached or probed), or why the
    probe failed."""
    out = {}
    for g in devices.gpus:
        if g.endpoint and g.kind is DeviceKind.RPC:
            link = rpc_link(g.endpoint, measure=measure)
            if link is not None:
                out[g.endpoint] = link
    return out


def record_efficiencies(backend: str, values: dict[str, float], *, cpu_gain: float = 1.0) -> str:
    """Keep efficiencies measured on this machine with ``backend`` (names of :class:`Efficiencies`);
    returns :func:`_save`'s note (a damaged store set aside);
    ``cpu_gain``: the instruction-set gain the CPU's compute carried in the estimate the measurement
    calibrated (``DeviceSpeed.isa_gain``), kept beside a ``cpu_compute`` (:func:`efficiencies_for`)."""
    calibrated(values, "check")  # refuse unknown names before writing
    data = _load()
    entry = data.setdefault("machines", {}).setdefault(machine_key(), {})
    kept = entry.setdefault("efficiencies", {}).get(backend)
    merged = dict(kept) if isinstance(kept, dict) else {}  # a pp-only run keeps the tg calibration
    merged.update({k: float(v) for k, v in values.items()})
    entry["efficiencies"][backend] = merged
    entry.setdefault("efficiencies_at", {})[backend] = time.strftime("%Y-%m-%d %H:%M")
    if "cpu_compute" in values:
        entry.setdefault("cpu_compute_gain", {})[backend] = float(cpu_gain)
    return _save(data)


def _cpu_basis(entry: dict[str, Any], backend: str, values: dict[str, Any]) -> dict[str, Any]:
    """A calibrated ``cpu_compute`` is a fraction of the CPU's compute figure as it was when measured:
    of the AVX2 figure before the instruction set was read (no ``cpu_compute_gain`` kept), else of
    that figure times the gain kept; rescaled to this machine's figure now (:func:`this_cpu`), so the
    calibrated rate stays the measured one."""
    if "cpu_compute" not in values:
        return values
    kept = _number(_mapping(entry.get("cpu_compute_gain")).get(backend, 1.0), 1e-3, 1e3) or 1.0
    return {**values, "cpu_compute": values["cpu_compute"] * kept / this_cpu().gain}


def core_speed(cpu: CpuInfo) -> tuple[float, str]:
    """A core of ``cpu`` against the AVX2 figure at its clock (its instruction set's gain, the clock
    its model name states against DEFAULT_CPU_GHZ), and what it is."""
    clock = cpu.ghz / DEFAULT_CPU_GHZ if cpu.ghz else 1.0
    at = f" at {cpu.ghz:g} GHz" if cpu.ghz else ""
    return cpu.gain * clock, f"{cpu.isa.value if cpu.isa else 'the AVX2 figure'}{at}, {cpu.source}"


def efficiencies_for(backend: str, devices: DeviceSet | None = None) -> Efficiencies:
    """The defaults (the host's work per RPC split scaled to this machine's cores, :func:`core_speed`),
    with what was measured on this machine with ``backend`` marked calibrated; for ``devices`` whose CPU
    is another machine (:func:`cpu_elsewhere`: its RAM's speed declared) the defaults alone, as its
    hardware figures take none of this machine's (a bench here fitted this CPU, its cores and links)."""
    if devices is not None and cpu_elsewhere(devices):
        return defaults_for(Dialect(backend))
    entry = _load().get("machines", {}).get(machine_key(), {})
    values = _mapping(entry.get("efficiencies")).get(backend)
    base = for_host(defaults_for(Dialect(backend)), *core_speed(this_cpu()))
    if not isinstance(values, dict) or not values:
        return base
    if any(_number(v, 1e-6, 1e6) is None for v in values.values()):  # NaN, a string, a bool: damaged
        return base
    when = _stamp(_mapping(entry.get("efficiencies_at")).get(backend, ""))
    try:
        note = f"measured on this machine with {backend} ({when})"
        return calibrated(_cpu_basis(entry, backend, values), note, base)
    except (ValueError, TypeError):
        return base


def threads_in(argv: list[str]) -> int | None:
    """``-t N`` / ``--threads N`` among verbatim arguments (a plan's kept flags): the last one given, as
    :func:`threads_of` reads it; None for 0 or below (llama.cpp's default) or not given."""
    return _last_in(argv, ("-t", "--threads")) or None


def threads_batch_in(argv: list[str]) -> int | None:
    """``-tb N`` / ``--threads-batch N`` among verbatim arguments (a plan's kept flags), as
    :func:`threads_batch_of` reads it: N, 0 for 0 or below, None when not given."""
    return _last_in(argv, ("-tb", "--threads-batch"))


#: ``-td`` and ``-tbd`` under every name the mainline builds give them
DRAFT_THREADS = ("--spec-draft-threads", "-td", "--threads-draft")
DRAFT_THREADS_BATCH = ("--spec-draft-threads-batch", "-tbd", "--threads-batch-draft")
#: ik_llama.cpp's flags that carry the draft model's own command line
IK_DRAFT_PARAMS = ("-draft", "--draft-params")


def draft_threads_in(argv: list[str], dialect: Dialect) -> DraftThreads:
    """A draft model's threads among verbatim arguments (a plan's kept flags), as
    :func:`draft_threads_of` reads them."""
    if dialect.applies_draft_threads:
        return DraftThreads(_last_in(argv, DRAFT_THREADS), _last_in(argv, DRAFT_THREADS_BATCH))
    if not any(a in IK_DRAFT_PARAMS for a in argv):
        return NO_DRAFT_THREADS
    from offload_planner.core.cmdline import parse_server_args

    return draft_threads_of(parse_server_args(argv, dialect=dialect), dialect)


def draft_threads_of(parsed: Any, dialect: Dialect) -> DraftThreads:
    """A ``-md`` draft model's threads for one token and for a batch (core.speed.hardware ``_draft``),
    each the last given, 0 for 0 or below, None when not given.  Mainline: ``-td N`` and ``-tbd N``
    (no environment variable sets either: no ``set_env``).  ik_llama.cpp reads neither for the server
    (``Dialect.applies_draft_threads``): it parses ``-draft "ARGS"`` onto a copy of the main parameters
    (common/speculative.cpp 1946-1966), so the draft computes with ARGS's ``-t`` and ``-tb``, else the
    main command's (and the environment's ``LLAMA_ARG_THREADS``, read again before ARGS); with no
    ``-tb`` anywhere a batch takes the draft's own ``-t`` (``n_threads_batch == -1 ? n_threads``,
    common/common.cpp:4341)."""
    if dialect.applies_draft_threads:
        return DraftThreads(_last_count(parsed, DRAFT_THREADS[0]),
                            _last_count(parsed, DRAFT_THREADS_BATCH[0]))
    from offload_planner.core.cmdline.ik_draft_params import (
        draft_params_flag,
        loads_draft_params,
        parse_draft_params,
    )

    args = getattr(parsed, "args", None)
    if args is None or not loads_draft_params(parsed):
        return NO_DRAFT_THREADS
    inner = parse_draft_params(parsed, args.draft.params or "")
    one, own_batch = _last_count(inner, "--threads"), _last_count(inner, "--threads-batch")
    batch = own_batch if own_batch is not None or threads_batch_of(parsed) is not None else one
    flag = draft_params_flag(parsed)
    return DraftThreads(one, batch, f"{flag}'s -t", f"{flag}'s -t{'b' if own_batch is not None else ''}")


def _last_in(argv: list[str], names: tuple[str, ...]) -> int | None:
    """The last of flags ``names``'s values in ``argv`` as a thread count (:func:`_count`)."""
    for flag, value in reversed(list(itertools.pairwise(argv))):  # llama-server keeps the last one given
        if flag in names:
            return _count(value)
    return None


def threads_of(parsed: Any) -> int | None:
    """``-t N`` of a parsed command line (the CPU threads llama-server computes a token with): the last
    one given (the command line's after ``LLAMA_ARG_THREADS``, which llama-server reads first), read
    as ``std::stoi`` reads it; None for 0 or below (llama.cpp's default) or not given."""
    n = _last_count(parsed, "--threads")
    return n if n else None


def threads_batch_of(parsed: Any) -> int | None:
    """``-tb N`` / ``--threads-batch N`` of a parsed command line (the CPU threads of a batch of more
    than one token: a prompt's micro-batches, the speculative verify batch): N, the last one given
    (common/arg.cpp:1529-1538 sets ``cpuparams_batch.n_threads``; ik common/common.cpp:1147
    ``n_threads_batch``); 0 for 0 or below (both builds: ``std::thread::hardware_concurrency()``);
    None when not given: the batch then computes with ``-t``'s threads (core.speed.hardware
    ``_batch_threads``).  No environment variable sets it: neither build gives ``-tb`` one
    (``LLAMA_ARG_THREADS_BATCH`` is not read; the parser keeps no flag for it)."""
    return _last_count(parsed, "--threads-batch")


def _last_count(parsed: Any, key: str) -> int | None:
    """The last value of flag ``key`` as a thread count (:func:`_count`), None when not given."""
    for f in reversed(list(getattr(parsed, "flags", []))):
        if f.key == key and f.values:
            return _count(f.values[0])
    return None


def _count(value: str) -> int | None:
    """A thread count as llama-server reads it (``std::stoi``: ``16x`` is 16): 0 for 0 or below
    (its ``hardware_concurrency()``), None when not a number (a refused command)."""
    try:
        n = stoi(value)
    except ValueError:
        return None
    return max(n, 0)


#: Hosts of an rpc-server on this machine.
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "[::1]", "0.0.0.0"})


@functools.cache
def physical_cores(sys_cpu: Path = Path("/sys/devices/system/cpu")) -> int:
    """The physical cores as llama.cpp counts them (``common_cpu_get_num_physical_cores``: distinct
    ``topology/thread_siblings`` of cpu0, cpu1, ... on Linux; elsewhere ``hardware_concurrency``, halved
    above 4)."""
    siblings = set()
    for i in itertools.count():
        try:
            siblings.add(read_bytes(os.path.join(sys_cpu, f"cpu{i}", "topology", "thread_siblings")).strip())
        except OSError:
            break
    if siblings:
        return len(siblings)
    n = os.cpu_count() or 0
    return n if 0 < n <= 4 else n // 2 if n else 4


def is_local(endpoint: str) -> bool:
    """An rpc-server on this machine: a loopback address or this machine's name."""
    host = rpc_host(endpoint).lower()
    return host in LOOPBACK or host in {node_and_machine()[0].lower(), "[::]"}


def thread_use(devices: DeviceSet, threads: int | None, *, cores: int | None = None) -> Threads | None:
    """The compute threads on the host llama-server runs on: its ``-t`` (else the CPU's declared
    ``threads=``; default: the physical cores) and each local rpc-server's (declared ``threads=``,
    else the server's default: half the logical CPUs), each weighed against the cores alone (the
    devices take turns: :class:`Threads`).  The cores: ``cores``, else the CPU's declared
    ``cores=``, else this machine's, unless the CPU's bandwidth is declared (another machine whose
    cores are not known: None)."""
    decl = parse_hardware_keys(devices.cpu.hardware)
    elsewhere = bool(devices.cpu.bandwidth_gbs) or decl.bw is not None or decl.ram is not None
    n_cores = cores or decl.cores or (None if elsewhere else physical_cores())
    if n_cores is None:
        return None
    threads = threads or decl.threads
    rpc: dict[str, int] = {}
    local = [devices.cpu.name]
    endpoints: dict[str, str] = {}
    for g in devices.gpus:
        if g.kind is DeviceKind.RPC and g.endpoint and is_local(g.endpoint):
            local.append(g.name)
            endpoints[g.name] = g.endpoint
            declared = dict(g.hardware).get("threads", "")
            rpc[g.endpoint] = (int(declared) if declared.isdigit() and int(declared) > 0  # else the server's:
                               else max(1, (os.cpu_count() or 2) // 2))  # hardware_concurrency() / 2
    return Threads(n_cores, threads or n_cores, threads is not None, rpc, tuple(local), endpoints=endpoints)


def ram_total() -> int | None:
    """This machine's RAM in bytes as ggml's CPU backend reports its memory: ``sysconf(_SC_PHYS_PAGES)
    x sysconf(_SC_PAGE_SIZE)`` (ggml/src/ggml-cpu/ggml-cpu.cpp ``ggml_backend_cpu_device_get_memory``,
    which reports it as free too); None where there is no ``sysconf`` (Windows: ggml asks
    ``GlobalMemoryStatusEx``, not read here)."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def cpu_backend_evidence(devices: DeviceSet, links: dict[str, MeasuredLink | str]) -> dict[str, str]:
    """The RPC devices whose rpc-server computes with ggml's CPU backend on this machine, by name, with
    why that is known: its endpoint is this machine's (:func:`is_local`), it serves one device
    (rpc-server.cpp ``get_devices``: the CPU only when no accelerator is found and no ``-d`` is given)
    and that device's total memory, as the probe asked it (GET_DEVICE_MEMORY: ``ggml_backend_dev_memory``
    of the server's backend), is this machine's RAM to the byte as ggml's CPU backend computes it
    (:func:`ram_total`); a GPU reports its own memory.  None when this machine's RAM is not known."""
    ram = ram_total()
    out: dict[str, str] = {}
    for g in devices.gpus:
        link = links.get(g.endpoint) if g.endpoint else None
        if (ram is None or g.kind is not DeviceKind.RPC or not isinstance(link, MeasuredLink)
                or not is_local(g.endpoint) or link.n_devices != 1 or link.mem_total != ram):
            continue
        out[g.name] = (f"{g.name}: this machine's CPU backend (its memory {ram / 2**30:.1f} GiB = this "
                       f"machine's RAM, {g.endpoint} on this machine)")
    return out


def cpu_elsewhere(devices: DeviceSet) -> bool:
    """The CPU is declared by its memory's speed (``bw=``/``ram=``): another machine than this one, so
    neither this machine's RAM probe nor its instruction set describes it."""
    keys = {k for k, _ in devices.cpu.hardware}
    return bool(devices.cpu.bandwidth_gbs) or bool(keys & {"bw", "bandwidth", "ram"})


def _blank_line(data: bytes) -> bool:
    """``data`` holds an empty line: two line ends in a row, each ``\\n``, ``\\r\\n`` or ``\\r``."""
    return b"\n\n" in data or b"\r\r" in data or b"\n\r" in data


def read_cpuinfo(proc: Path = Path("/proc/cpuinfo"), limit: int = 1 << 16) -> str:
    """The first processor's block of ``/proc/cpuinfo`` (up to the first blank line; a byte-order mark
    before it dropped; of its first ``limit`` bytes, read as a text file reads them: line ends as
    ``\\n``), read no further than the page holding that blank line (a machine of many processors
    makes a few KiB of it, not all): '' when it cannot be read."""
    try:
        text = read_bytes(proc, limit, enough=_blank_line).decode("utf-8", errors="replace")
    except OSError:
        return ""
    text = text.removeprefix("\ufeff")  # what "utf-8-sig" drops, without importing that codec
    if "\r" in text:  # what a text stream's universal newlines make of them
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text.split("\n\n", 1)[0]


@functools.cache
def this_cpu() -> CpuInfo:
    """This machine's CPU (model name, instruction-set tier, a clock its name states): Linux from
    ``/proc/cpuinfo``, macOS from ``sysctl machdep.cpu``; elsewhere (Windows) or when neither answers
    the tier is not known and the estimate keeps the AVX2 figure, saying so."""
    if sys.platform.startswith("linux"):
        text = read_cpuinfo()
        if text:
            return parse_proc_cpuinfo(text)
    elif sys.platform == "darwin":
        import subprocess  # here: every `plan` imports this module, and only a Mac runs a program

        try:
            out = subprocess.run(["sysctl", "machdep.cpu"], capture_output=True, text=True, timeout=5,
                                 check=False).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out:
            return parse_sysctl(out)
    import platform

    return CpuInfo(platform.processor(), None, None, f"not read on {platform.system() or sys.platform}")


def machine_cpu(devices: DeviceSet) -> CpuInfo | None:
    """:func:`this_cpu`, unless the set's CPU is another machine (:func:`cpu_elsewhere`)."""
    return None if cpu_elsewhere(devices) else this_cpu()


def machine_hardware(plan: Plan, parsed: Any = None, *, probe: bool = True,
                     probe_rpc: bool = False) -> Hardware:
    """The figures of the plan's devices on this machine (:func:`devices_hardware`), threads from
    ``-t`` of ``parsed`` (:func:`parsed_hardware`) or of the plan's kept flags."""
    if parsed is not None:
        return parsed_hardware(plan.devices, parsed, plan.dialect, probe=probe, probe_rpc=probe_rpc)
    argv = plan.extra_args
    return devices_hardware(plan.devices, threads_in(argv), probe=probe, probe_rpc=probe_rpc,
                            threads_batch=threads_batch_in(argv),
                            draft_threads=draft_threads_in(argv, plan.dialect))


def parsed_hardware(devices: DeviceSet, parsed: Any, dialect: Dialect, *, probe: bool = True,
                    probe_rpc: bool = False) -> Hardware:
    """The figures of ``devices`` on this machine (:func:`devices_hardware`) with the threads a parsed
    command line gives: ``-t``, ``-tb`` and the draft model's (:func:`draft_threads_of`)."""
    return devices_hardware(devices, threads_of(parsed), probe=probe, probe_rpc=probe_rpc,
                            threads_batch=threads_batch_of(parsed),
                            draft_threads=draft_threads_of(parsed, dialect))


def devices_hardware(devices: DeviceSet, threads: int | None, *, probe: bool = True,
                     probe_rpc: bool = False, threads_batch: int | None = None,
                     draft_threads: DraftThreads = NO_DRAFT_THREADS) -> Hardware:
    """The figures of these devices on this machine: declared, catalogue, the cached RAM probe (run
    now when ``probe`` and not cached, unless the CPU is another machine: :func:`cpu_elsewhere`), the
    cached RPC links (probed now with ``probe_rpc``: not while a llama-server holds the rpc-servers,
    which serve one client at a time), this CPU's instruction set, one thread's copy rate (cached, run
    now as the RAM probe is) for the CPU and the rpc-servers on this machine; ``threads_batch``: ``-tb``
    (:func:`threads_batch_of`), a batch's figures where they differ (``Hardware.batch``);
    ``draft_threads``: ``-td``/``-tbd`` (:func:`draft_threads_of`), a draft model's (``Hardware.draft``)."""
    elsewhere = cpu_elsewhere(devices)
    measured = None if elsewhere else host_bandwidth(measure=probe)
    one = None if elsewhere else thread_bandwidth(measure=probe)
    links = rpc_links(devices, measure=probe_rpc)
    # the CPU declared by its memory's speed is another machine's: its rpc-servers are not known here
    cpu_rpc = {} if elsewhere else cpu_backend_evidence(devices, links)
    return hardware_for(devices, threads=threads, probe=measured, links=links,
                        cores=thread_use(devices, threads), cpu=machine_cpu(devices),
                        thread_bw=local_thread_bandwidth(devices, one), threads_batch=threads_batch,
                        cpu_rpc=cpu_rpc, draft_threads=draft_threads)


def local_thread_bandwidth(devices: DeviceSet, one: Figure | None) -> dict[str, Figure]:
    """``one`` (this machine's single-thread copy, :func:`thread_bandwidth`) for the devices whose
    threads run here: the CPU and the rpc-servers on this machine (:func:`is_local`)."""
    if one is None:
        return {}
    local = [g.name for g in devices.gpus if g.kind is DeviceKind.RPC and g.endpoint and is_local(g.endpoint)]
    return dict.fromkeys([devices.cpu.name, *local], one)


def plan_speed(plan: Plan, parsed: Any = None, *, prompt: int = DEFAULT_PROMPT, probe: bool = True,
               placement: Placement | None = None, probe_rpc: bool = False,
               accept: AcceptArg = None, depth: int = 0) -> SpeedEstimate:
    """The speed estimate of ``plan`` on this machine's figures (the RAM probe, cached, run now when
    ``probe`` and not cached; efficiencies measured here with the plan's dialect, else the defaults)
    and the devices' declared figures; threads from ``-t`` of ``parsed`` or of the plan's flags; tg
    with the plan's draft model or MTP at acceptance ``accept`` (None: the default); pp and tg after
    ``depth`` tokens of context as well when given."""
    with one_reading():
        hw = machine_hardware(plan, parsed, probe=probe, probe_rpc=probe_rpc)
        eff = efficiencies_for(plan.dialect, plan.devices)
    placement = placement or plan.placement()
    est = estimate(plan, hw, prompt=prompt, eff=eff, placement=placement, depth=depth)
    est = with_speculation(est, plan, hw, eff, placement=placement, accept=accept)
    return with_slots(est, plan, hw, eff, placement=placement)
