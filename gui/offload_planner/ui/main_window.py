"""The planner window: toolbar, model summary, DEVICES and OPTIONS on the left, the TENSOR MAP in the
centre, MEMORY on the right, Command / Problems / Log / Telemetry tabs at the bottom."""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from PySide6.QtCore import QByteArray, QMimeData, Qt, Signal, SignalInstance
from PySide6.QtGui import (
    QAction,
    QCloseEvent,
    QDragEnterEvent,
    QDropEvent,
    QKeySequence,
)
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QGroupBox,
    QLabel,
    QMainWindow,
    QMenu,
    QMessageBox,
    QProgressBar,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from offload_planner.backend.calibration import CalibrationStore
from offload_planner.backend.system import Detection
from offload_planner.core.cmdline.dialect import Dialect
from offload_planner.core.devices import DECLARED_RAM, Device, DeviceKind, DeviceSet
from offload_planner.core.errors import PlannerError
from offload_planner.core.model import Model
from offload_planner.core.new_plan import DEMO_HARDWARE, demo_devices, demo_plan, model_summary, new_plan
from offload_planner.core.plan import Plan
from offload_planner.core.plan_file import (
    SUFFIX,
    PlanFile,
    PlanFileError,
    load_plan,
    require_regular_file,
    save_plan,
)
from offload_planner.core.units import GiB, fmt_bytes
from offload_planner.ui import gui_thread_gc
from offload_planner.ui import settings as keys
from offload_planner.ui.command_pane import CommandPane
from offload_planner.ui.device_panel import DevicePanel
from offload_planner.ui.document import PlanDocument
from offload_planner.ui.eliding_label import ElidingLabel
from offload_planner.ui.launcher_panel import LauncherPanel
from offload_planner.ui.legend import LegendBar
from offload_planner.ui.loader import ModelLoader, demo_model
from offload_planner.ui.log_view import LogView
from offload_planner.ui.memory_view import MemoryView
from offload_planner.ui.options_panel import OptionsPanel
from offload_planner.ui.pane_splitter import PaneSplitter
from offload_planner.ui.presets_menu import PresetsMenu
from offload_planner.ui.problems_pane import ProblemsPane
from offload_planner.ui.settings import Settings, virtual_description
from offload_planner.ui.speed_view import SpeedLabel
from offload_planner.ui.telemetry_view import TelemetryView
from offload_planner.ui.tensor_map_model import section_file
from offload_planner.ui.tensor_map_view import TensorMapView
from offload_planner.ui.ubatch_plot import UbatchPlot
from offload_planner.ui.window_size import DEFAULT_SIZE, MIN_SIZE, PANE_DESIGN

#: How the window names the demo hardware (core.new_plan.DEMO_HARDWARE) it opens the demo on.
DEMO_LABEL = "demo hardware (declared)"
DEMO_NOTICE = (
    f"<b>{DEMO_LABEL[0].upper()}{DEMO_LABEL[1:]}</b>: a 24 GiB GPU, 512 GiB RAM, experts on the CPU "
    "(--cpu-moe). Open your model to plan for this machine."
)


#: Help → Keys and mouse.
HELP_TEXT = (
    "Tensor map: click, shift/ctrl-click, sweep to select; click a layer number for the whole layer, "
    "a column header for that role in every layer.\n"
    "Hover a tensor or a layer number: what moving it to each device would change, in memory and in "
    "tokens/s (the speed line under Memory follows every edit).\n"
    "Drag the selection onto a device in Devices or a bar in Memory to move it.\n"
    "Keys: 0 = CPU, 1-9 = the n-th GPU, Del = back to the command's placement.\n"
    "Presets → Fastest plan: the fastest placement that fits, for a request of a 4096-token prompt and "
    "a 512-token answer; the Speed tab: -ub against memory.\n"
    "Launch tab: run llama-server on the plan and compare what it allocates; its Bench measures the "
    "speed and calibrates the estimate for this machine.\n"
    "Every edit can be undone (Ctrl+Z)."
)


def demo_tip(no_gpu: str) -> str:
    """The demo notice's tooltip: what the demo hardware is, where the speed line's figures come from,
    how to plan for other devices, and (``no_gpu``) what this machine has.  The notice's tooltip was
    this machine's "No GPU detected: ..." alone (none where a GPU was detected): nothing said that the
    demo's GPU, named by its size only, is priced at default figures."""
    from offload_planner.core.speed.hardware import DEFAULT_GPU_BW, DEFAULT_GPU_TFLOPS

    flags = " ".join(f"--device {d}" for d in DEMO_HARDWARE)
    return (f"<p>The demo opens on declared hardware, not this machine's: <code>{flags}</code>. The GPU "
            "names no card, so the speed line under Memory prices it at default figures "
            f"({DEFAULT_GPU_BW:g} GB/s, {DEFAULT_GPU_TFLOPS:g} TFLOPS); the RAM's speed is the declared "
            "one. Plan for other devices with + Virtual GPU… and the Size column, or start with "
            "<code>offload-planner gui --device CUDA0=rtx3090 --device CPU=128GiB</code>; your own model "
            "opens on this machine's devices.</p>"
            + (f"<p>This machine: {html.escape(no_gpu)}</p>" if no_gpu else ""))


def demo_notice(devices: DeviceSet) -> str:
    """:data:`DEMO_NOTICE` for the devices as they are now: a GPU added or a size edited in the list
    changed the plan while the notice went on saying "a 24 GiB GPU, 512 GiB RAM"."""
    def size(d: Device) -> str:
        return "?" if d.capacity is None else f"{d.capacity / GiB:g} GiB"

    gpus = [size(g) for g in devices.gpus]
    ram = size(devices.cpu)
    if gpus == ["24 GiB"] and ram == "512 GiB":
        return DEMO_NOTICE
    what = "no GPU" if not gpus else f"a {gpus[0]} GPU" if len(gpus) == 1 else f"GPUs of {' + '.join(gpus)}"
    # no longer than the notice it replaces: a longer one made the left column scroll at 1280x800
    return (f"<b>{DEMO_LABEL[0].upper()}{DEMO_LABEL[1:]}</b>: {what}, {ram} RAM. Open your model to plan "
            "for this machine.")


def no_gpu_notice(why: str, devices: DeviceSet) -> str:
    """The Devices notice on a machine where no GPU was detected: why, and what the plan is for, the
    GPUs declared (--device, + Virtual GPU…) or the CPU alone.  It said only "No GPU detected: no
    NVIDIA driver found." beside a list of declared GPUs the plan put layers on."""
    gpus = [g.name for g in devices.gpus if g.kind is not DeviceKind.RPC]
    rpc = [g.name for g in devices.gpus if g.kind is DeviceKind.RPC]  # from --rpc, not declared
    servers = f"the --rpc servers {', '.join(rpc)}" if rpc else ""
    if gpus:
        return (f"No GPU detected ({why}): planning for the declared {', '.join(gpus)}"
                + (f" and {servers}." if servers else "."))
    if servers:
        return f"No GPU detected ({why}): planning for {servers}."
    return f"No GPU detected ({why}): planning for the CPU alone."


@dataclass
class SystemInfo:
    """The machine as the window starts with it: CPU RAM, GPU detection, devices from the command line."""

    cpu: Device
    detection: Detection
    declared: list[Device] = field(default_factory=list)

    @classmethod
    def probe(cls, declared: list[Device] | None = None) -> SystemInfo:
        from offload_planner.backend.system import cpu_device, detect_gpus

        return cls(cpu_device(), detect_gpus(), list(declared or []))


def is_demo(model: Model) -> bool:
    return Path(model.path).resolve() == demo_model().resolve()


def extras_summary(plan: Plan) -> list[str]:
    """The summary line's words for what the command loads beside the model."""
    out = []
    draft = plan.spec.draft if plan.spec is not None else None
    if draft is not None:
        name = draft.model.summary.name or Path(draft.model.path).name
        head = ", drafting with its MTP head" if plan.spec is not None and plan.spec.mtp else ""
        out.append(f"+ draft model {name} ({fmt_bytes(draft.model.summary.total_bytes, precision=1)}){head}")
    elif plan.spec is not None and plan.spec.mtp:
        out.append("+ MTP (--spec-type draft-mtp)")
    projector = section_file(plan, "mmproj")
    if projector:
        out.append(f"+ projector {projector}")
    return out


class MainWindow(QMainWindow):
    errorShown = Signal(str)  # an error dialog opened with this text
    internalError = Signal(str)  # an exception no slot caught (app.run_gui's hook, from any thread)

    def __init__(self, settings: Settings, system: SystemInfo, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        gui_thread_gc.install()  # Qt objects in garbage must never be destroyed by a worker thread
        self.settings = settings
        self.system = system
        self.confirm_close = True  # ask before closing or replacing a plan with unsaved changes
        self.allow_remote_plans = False  # fetch a plan file's URL model without asking (--allow-remote)
        self.on_demo_hardware = False  # the plan's devices are DEMO_HARDWARE, not this machine's
        self._gpu_notice = ""
        self._gpu_tip = ""  # the notice's tooltip off the demo: why no GPU was detected ("" when one was)
        self._no_gpu_why = ""  # why no GPU was detected ("" when one was)
        self._load_t0 = 0.0
        self._internal_errors: set[str] = set()  # said once each (_on_internal_error)
        self.doc = PlanDocument(self)
        self.loader = ModelLoader(self)
        self.setMinimumSize(*MIN_SIZE)
        self.setAcceptDrops(True)
        self._build_widgets()
        self._build_actions()
        self._build_layout()
        self._connect()
        self._restore_state()
        self._update_title()
        if system.detection.message and not system.detection.gpus:
            why = system.detection.message.split(";", 1)[0]
            msg = f"No GPU detected: {why}. Add a virtual GPU to plan for one."
            self._no_gpu_why = why.split(" (", 1)[0]
            self._gpu_notice = no_gpu_notice(self._no_gpu_why, self.initial_devices())
            self._gpu_tip = msg
            self.devices_panel.notice.setToolTip(msg)
            self.devices_panel.show_notice(self._gpu_notice)
            self.log(msg)

    # --- construction ------------------------------------------------------------------------

    def _build_widgets(self) -> None:
        doc = self.doc
        self.summary = ElidingLabel("No model")
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.summary.setAccessibleName("Model summary")
        self.devices_panel = DevicePanel(doc)
        self.devices_panel.default_margin = int(self.settings.get(keys.DEFAULT_MARGIN))
        self.options_panel = OptionsPanel(doc)
        self.map_view = TensorMapView(doc)
        self.legend = LegendBar(doc)
        self.memory_view = MemoryView(doc)
        self.speed_label = SpeedLabel(doc)
        self.speed_label.fasterChanged.connect(self.memory_view.set_faster)
        self.command_pane = CommandPane(doc)
        self.command_pane.set_format_style(str(self.settings.get(keys.COMMAND_STYLE)))
        self.command_pane.before_replace = lambda: self.confirm_replace("Pasting a command replaces it.")
        self.problems = ProblemsPane(doc)
        self.log_view = LogView()
        self.telemetry = TelemetryView()
        self.launcher = LauncherPanel(calibration=CalibrationStore(),
                                      executable=str(self.settings.get(keys.BACKEND_PATH)))
        self.launcher.attach_views(self.log_view, self.telemetry)
        self.launcher.detected = frozenset(g.name for g in self.system.detection.gpus)
        doc.analysisChanged.connect(self._plan_to_launcher)
        self.launcher.deviceHighlighted.connect(lambda d: self.memory_view.set_drop_highlight(d or None))
        self.launcher.executableChanged.connect(self.set_backend_path)
        self.launcher.actualsReady.connect(self._on_actuals)
        self.launcher.speedMeasured.connect(lambda _check: self.speed_label.refresh())  # now calibrated
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(self.command_pane, "Command")
        self.tabs.addTab(self.problems, "Problems")
        self.tabs.addTab(self.log_view, "Log")
        self.tabs.addTab(self.telemetry, "Telemetry")
        self.ubatch_plot = UbatchPlot(doc)
        self.tabs.addTab(self.ubatch_plot, "Speed")
        # the panel's own minimum height must not squeeze the map
        self.launch_scroll = launch_scroll = QScrollArea()
        launch_scroll.setWidget(self.launcher)
        launch_scroll.setWidgetResizable(True)
        launch_scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        self.tabs.addTab(launch_scroll, "Launch")
        self.backend_box = QComboBox()
        for d in Dialect:
            self.backend_box.addItem(d.label, d.value)
        self.backend_box.setToolTip("The llama-server the command is for: its defaults and flags")
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(180)
        self.progress.setTextVisible(False)
        self.progress.hide()
        self.statusBar().addPermanentWidget(self.progress)
        # the whole of a message the window's width cuts, while it is shown
        self.statusBar().messageChanged.connect(self._status_tooltip)
        self.presets_menu = PresetsMenu(doc, self)
        if not any(d.kind is DeviceKind.CPU for d in self.system.declared):  # the RAM is this machine's
            self.presets_menu.machine_ram = self.system.cpu.total

    def _build_actions(self) -> None:
        self.act_open = QAction("Open…", self)
        self.act_open.setShortcut(QKeySequence.StandardKey.Open)
        self.act_open.setToolTip("Open a GGUF model (any shard) or a saved plan")
        self.act_open.triggered.connect(self.open_dialog)
        self.recent_menu = QMenu("Open Recent", self)
        self.recent_menu.aboutToShow.connect(self._fill_recent)
        self.act_save = QAction("Save Plan", self)
        self.act_save.setShortcut(QKeySequence.StandardKey.Save)
        self.act_save.triggered.connect(self.save)
        self.act_save_as = QAction("Save Plan As…", self)
        self.act_save_as.setShortcut(QKeySequence.StandardKey.SaveAs)
        self.act_save_as.triggered.connect(self.save_as)
        self.act_demo = QAction("Open Demo Model", self)
        self.act_demo.triggered.connect(lambda: self.open_path(demo_model()))
        self.act_quit = QAction("Quit", self)
        self.act_quit.setShortcut(QKeySequence.StandardKey.Quit)
        self.act_quit.triggered.connect(self.close)
        self.act_undo = self.doc.undo_stack.createUndoAction(self, "Undo")
        self.act_undo.setShortcut(QKeySequence.StandardKey.Undo)
        self.act_redo = self.doc.undo_stack.createRedoAction(self, "Redo")
        self.act_redo.setShortcut(QKeySequence.StandardKey.Redo)
        self.act_paste = QAction("Paste Command…", self)
        self.act_paste.setShortcut(QKeySequence("Ctrl+Shift+V"))
        self.act_paste.triggered.connect(self.command_pane.paste_dialog)
        self.act_copy_cmd = QAction("Copy Command", self)
        self.act_copy_cmd.setShortcut(QKeySequence("Ctrl+Shift+C"))
        self.act_copy_cmd.triggered.connect(self.command_pane.copy)
        self.act_split_attn = QAction("Split attention into its tensors", self)
        self.act_split_attn.setCheckable(True)
        self.act_split_attn.setToolTip("One tensor-map column per attention tensor (q, k, v, o, MLA parts)")
        self.act_split_attn.toggled.connect(self.doc.set_split_attention)
        self.act_add_gpu = QAction("Add Virtual GPU…", self)
        self.act_add_gpu.triggered.connect(self.devices_panel.add_virtual_gpu)

        mb = self.menuBar()
        m = mb.addMenu("&File")
        m.addActions([self.act_open])
        m.addMenu(self.recent_menu)
        m.addActions([self.act_demo])
        m.addSeparator()
        m.addActions([self.act_save, self.act_save_as])
        m.addSeparator()
        m.addAction(self.act_quit)
        m = mb.addMenu("&Edit")
        m.addActions([self.act_undo, self.act_redo])
        m.addSeparator()
        m.addActions([self.act_paste, self.act_copy_cmd])
        m = mb.addMenu("&View")
        m.addAction(self.act_split_attn)
        m = mb.addMenu("&Plan")
        m.addMenu(self.presets_menu)
        m.addAction(self.act_add_gpu)
        m = mb.addMenu("&Help")
        m.addAction("Keys and mouse", self._show_help)

        tb = self.addToolBar("Main")
        tb.setObjectName("main-toolbar")
        tb.setMovable(False)
        tb.addAction(self.act_open)
        recent = QToolButton()
        recent.setText("Recent")
        recent.setMenu(self.recent_menu)
        recent.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        recent.setToolTip("Open a model or plan opened before")
        tb.addWidget(recent)
        tb.addAction(self.act_save)
        tb.addSeparator()
        tb.addWidget(
            self._history_button(
                "Undo",
                self.doc.undo_stack.undo,
                self.doc.undo_stack.canUndoChanged,
                self.doc.undo_stack.undoTextChanged,
            )
        )
        tb.addWidget(
            self._history_button(
                "Redo",
                self.doc.undo_stack.redo,
                self.doc.undo_stack.canRedoChanged,
                self.doc.undo_stack.redoTextChanged,
            )
        )
        tb.addSeparator()
        presets = QToolButton()
        presets.setText("Presets")
        presets.setMenu(self.presets_menu)
        presets.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        presets.setToolTip("Common placements in one step: routed experts to the CPU, fill a GPU with "
                           "experts, move layers, the fastest plan that fits, what llama.cpp's --fit runs")
        self.presets_button = presets
        tb.addWidget(presets)
        tb.addAction(self.act_paste)
        tb.addSeparator()
        tb.addWidget(QLabel(" Backend "))
        tb.addWidget(self.backend_box)

    def _history_button(
        self, label: str, run: Callable[[], None], can: SignalInstance, text: SignalInstance
    ) -> QToolButton:
        """A toolbar Undo/Redo of fixed width: what it undoes goes in the tooltip."""
        b = QToolButton()
        b.setText(label)
        b.setEnabled(False)
        b.clicked.connect(run)
        can.connect(b.setEnabled)

        def tip(what: str) -> None:
            b.setToolTip(f"{label} {what}".strip())

        text.connect(tip)
        return b

    def _build_layout(self) -> None:
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        dev_box = QGroupBox("Devices")
        QVBoxLayout(dev_box).addWidget(self.devices_panel)
        opt_box = QGroupBox("Options")
        QVBoxLayout(opt_box).addWidget(self.options_panel)
        # a column shorter than both minimums squeezes both boxes alike (clipping the spin boxes'
        # text): the options keep their height, the device list gives way
        opt_box.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        ll.addWidget(dev_box, 1)
        ll.addWidget(opt_box, 0)

        centre = QGroupBox("Tensor map")
        cl = QVBoxLayout(centre)
        cl.addWidget(self.legend)
        cl.addWidget(self.map_view, 1)
        hint = QLabel(
            "Drag the selection onto a device · 0 = CPU, 1-9 = GPU · Del = default · right-click: more"
        )
        hint.setEnabled(False)
        hint.setWordWrap(True)
        cl.addWidget(hint)

        right = QGroupBox("Memory")
        rl = QVBoxLayout(right)
        rl.addWidget(self.memory_view, 1)
        rl.addWidget(self.speed_label)

        # a column too short for both boxes (the ik -mla row, a notice, many devices) scrolls
        # instead of squeezing the device list until rows are cut off
        self.left_scroll = QScrollArea()
        self.left_scroll.setWidget(left)
        self.left_scroll.setWidgetResizable(True)
        self.left_scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        self.left_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.left_scroll.setMinimumWidth(left.minimumSizeHint().width())

        self.h_split = PaneSplitter(lambda: self._map_pane_need(centre))
        self.h_split.setObjectName("panes")
        self.h_split.addWidget(self.left_scroll)
        self.h_split.addWidget(centre)
        self.h_split.addWidget(right)
        self.h_split.setStretchFactor(1, 1)
        self.h_split.setChildrenCollapsible(False)
        self.h_split.setSizes(list(PANE_DESIGN))
        self.map_view.tensor_model.modelReset.connect(self.h_split.refit)
        self.v_split = QSplitter(Qt.Orientation.Vertical)
        self.v_split.setObjectName("main")
        self.v_split.addWidget(self.h_split)
        self.v_split.addWidget(self.tabs)
        self.v_split.setStretchFactor(0, 1)
        self.v_split.setChildrenCollapsible(False)
        self.v_split.setSizes([560, 170])

        central = QWidget()
        lay = QVBoxLayout(central)
        lay.setContentsMargins(6, 2, 6, 2)
        lay.addWidget(self.summary)
        lay.addWidget(self.v_split, 1)
        self.setCentralWidget(central)

    def _map_pane_need(self, centre: QWidget) -> int:
        """The tensor map pane's width with every column at its whole label."""
        lay = centre.layout()
        m = lay.contentsMargins().left() + lay.contentsMargins().right() if lay is not None else 0
        return self.map_view.full_width() + centre.width() - centre.contentsRect().width() + m

    def _connect(self) -> None:
        doc = self.doc
        doc.undo_stack.cleanChanged.connect(self._on_clean_changed)
        self._history_index = 0
        doc.undo_stack.indexChanged.connect(self._on_history)
        doc.modelChanged.connect(self._on_model_changed)
        doc.planChanged.connect(self._sync_backend)
        doc.planChanged.connect(self._update_summary)  # a pasted -md / --mmproj / MTP shows in it
        doc.planChanged.connect(self._update_demo_notice)
        self.backend_box.activated.connect(self._on_backend)
        self.loader.started.connect(self._on_load_started)
        self.loader.progress.connect(self._on_load_progress)
        self.loader.loaded.connect(self._on_loaded)
        self.loader.failed.connect(self._on_load_failed)
        doc.analysisFailed.connect(self._on_analysis_failed)
        self.internalError.connect(self._on_internal_error)
        panes = (self.map_view, self.command_pane, self.presets_menu, self.devices_panel, self.options_panel)
        for w in panes:
            w.message.connect(self.report)
        self.problems.countChanged.connect(self._on_problem_count)

    # --- settings ----------------------------------------------------------------------------

    def _restore_state(self) -> None:
        s = self.settings
        geo = s.get_bytes(keys.GEOMETRY.name)
        if geo is not None:
            self.restoreGeometry(geo)
        else:
            self.resize(*self._opening_size())
        state = s.get_bytes(keys.STATE.name)
        if state is not None:
            self.restoreState(state)
        for split in (self.h_split, self.v_split):
            st = s.get_bytes(f"{keys.SPLITTERS.name}/{split.objectName()}")
            if st is not None:
                split.restoreState(st)
        self.act_split_attn.setChecked(bool(s.get(keys.SPLIT_ATTENTION)))
        i = self.backend_box.findData(s.get(keys.DIALECT))
        self.backend_box.setCurrentIndex(max(0, i))

    def _opening_size(self) -> tuple[int, int]:
        """:data:`DEFAULT_SIZE`, or the screen's available area if that is smaller."""
        screen = self.screen()
        if screen is None:
            return DEFAULT_SIZE
        room = screen.availableGeometry()
        return min(DEFAULT_SIZE[0], room.width()), min(DEFAULT_SIZE[1], room.height())

    def save_settings(self) -> None:
        s = self.settings
        s.set_bytes(keys.GEOMETRY.name, self.saveGeometry())
        s.set_bytes(keys.STATE.name, self.saveState())
        for split in (self.h_split, self.v_split):
            state = split.user_state() if isinstance(split, PaneSplitter) else QByteArray(split.saveState())
            s.set_bytes(f"{keys.SPLITTERS.name}/{split.objectName()}", state)
        s.set(keys.COMMAND_STYLE, self.command_pane.format_style)
        s.set(keys.DIALECT, str(self.backend_box.currentData()))
        s.set(keys.SPLIT_ATTENTION, self.act_split_attn.isChecked())
        if self.doc.has_plan and not self.on_demo_hardware:  # the demo's devices are not this machine's
            s.store_devices(list(self.doc.plan.devices), self.session_devices)
        s.sync()

    @property
    def session_devices(self) -> frozenset[str]:
        """Devices given with --device: for this session only, never written to the settings."""
        return frozenset(d.name for d in self.system.declared)

    def initial_devices(self) -> DeviceSet:
        s = self.settings
        cpu = replace(self.system.cpu, margin=s.margin_of(self.system.cpu.name))
        size = int(s.get(keys.CPU_SIZE))
        if size:
            cpu = replace(cpu, total=size, free=None, description=DECLARED_RAM)
        # the window's margins are set (its settings' default included): 0 there is no margin
        gpus = [replace(g, margin=s.margin_of(g.name), margin_given=True)
                for g in self.system.detection.gpus]
        for d in [*s.virtual_gpus(), *self.system.declared]:
            if d.kind.value == "CPU":  # its speed keys too (ram=, bw=, threads=): they were dropped, and
                # the window estimated on this machine's RAM probe what plan estimated on the declared RAM
                cpu = replace(cpu, total=d.total, free=d.free, hardware=d.hardware,
                              bandwidth_gbs=d.bandwidth_gbs, description=DECLARED_RAM,
                              margin=d.margin if d.margin_given else cpu.margin)
                continue
            gpus = [g for g in gpus if g.name.lower() != d.name.lower()]
            if not d.description:  # --device CUDA0=rtx3090: name the card where the window shows devices
                d = replace(d, description=virtual_description(d.total or 0, d.hardware))
            gpus.append(d if d.margin_given else replace(d, margin=s.margin_of(d.name), margin_given=True))
        return DeviceSet(cpu, tuple(gpus))  # DeviceSet keeps llama.cpp's order

    # --- opening -----------------------------------------------------------------------------

    def open_dialog(self) -> None:
        recent = self.settings.recent_files
        start = (
            str(Path(recent[0]).parent) if recent and not recent[0].startswith("http") else str(Path.home())
        )
        path, _ = QFileDialog.getOpenFileName(
            self,
            "Open a model or plan",
            start,
            f"GGUF models and plans (*.gguf *{SUFFIX} *.json);;GGUF models (*.gguf);;"
            f"Plans (*{SUFFIX} *.json)",
        )
        if path:
            self.open_path(path)

    def ask_unsaved(self, consequence: str) -> QMessageBox.StandardButton:
        """Save, Discard or Cancel (a hook: tests answer it)."""
        return QMessageBox.question(
            self,
            "Save the plan?",
            f"The plan has changes that are not saved. {consequence}".strip(),
            QMessageBox.StandardButton.Save
            | QMessageBox.StandardButton.Discard
            | QMessageBox.StandardButton.Cancel,
        )

    def confirm_replace(self, consequence: str) -> bool:
        """Before the plan is closed or replaced: True to go on (nothing unsaved, saved, or the
        user discards the changes), False to keep it."""
        if not self.confirm_close or not self.doc.has_plan or self.doc.undo_stack.isClean():
            return True
        answer = self.ask_unsaved(consequence)
        if answer == QMessageBox.StandardButton.Cancel:
            return False
        return answer != QMessageBox.StandardButton.Save or self.save()

    def open_path(self, location: str | Path) -> None:
        """A model (.gguf, any shard, or URL) or a plan file (.json); asks first if the open plan
        has unsaved changes."""
        loc = str(location)
        if not self.confirm_replace(f"Opening {Path(loc).name} replaces it."):
            return
        if loc.lower().endswith(".json"):
            self.open_plan(loc)
        else:
            self.loader.load(loc, ("model", None))

    def open_plan(self, path: str) -> None:
        """Read and check the plan file (a dialog names the bad field), then load its model; a
        model URL is fetched only once the user agrees (it came from a file)."""
        try:
            pf = load_plan(path)
            if not pf.model_is_url:
                require_regular_file(pf.model_path, "the plan's model")
        except PlanFileError as e:
            self.log(f"error: {e}")
            self._error("Cannot open the plan", str(e))
            return

        def load() -> None:
            self.loader.load(pf.model_path, ("plan", (pf, str(Path(path).resolve()))))

        url = pf.model_path if pf.model_is_url else pf.projector_url  # a projector's was read unasked
        if url is not None and not self.allow_remote_plans:
            from offload_planner.ui.confirm import ask_fetch

            ask_fetch(self, path, url, load, "its model" if pf.model_is_url else "its projector (-mmu)")
            return
        load()

    def _on_load_started(self, location: str) -> None:
        self.progress.setRange(0, 0)
        self.progress.show()
        self.show_message(f"Opening {location} …")
        self._load_t0 = time.perf_counter()

    def _on_load_progress(self, done: int, total: int) -> None:
        self.progress.setRange(0, total)
        self.progress.setValue(done)

    def _on_load_failed(self, message: str, context: object) -> None:
        self.progress.hide()
        self.log(f"error: {message}")
        self._error("Cannot open the model", message)

    def _on_loaded(self, model: Model, context: object) -> None:
        """The model read: its plan (a new one, or the plan file's) replaces the open one. If making
        it raises (a bug), it is said as a model that cannot be opened, and the open plan is kept."""
        try:
            self._open_loaded(model, context)
        except Exception as e:
            self._on_load_failed(f"{model.path}: {type(e).__name__}: {e}", context)

    def _on_analysis_failed(self, text: str) -> None:
        self.log(f"error: {text}")
        self._error("Cannot project the plan", text)

    def _on_internal_error(self, text: str) -> None:
        """An exception that no slot caught: said in a dialog naming the open plan's file (or model);
        the window and its plan, unsaved edits included, stay."""
        if self.doc.has_plan:
            text = f"{self.doc.file_path or self.doc.plan.model.path}: internal error: {text}"
        else:
            text = f"internal error: {text}"
        if text in self._internal_errors:  # one dialog per error: a paint that raises repeats it
            return
        self._internal_errors.add(text)
        self.log(f"error: {text}")
        self._error("Internal error", text)

    def _open_loaded(self, model: Model, context: object) -> None:
        self.progress.hide()
        kind, extra = context if isinstance(context, tuple) else ("model", None)
        self.log(
            f"opened {model.path}: {len(model.tensors)} tensors in "
            f"{(time.perf_counter() - self._load_t0) * 1000:.0f} ms"
        )
        if kind == "plan":
            pf, path = extra
            assert isinstance(pf, PlanFile)
            self._open_loaded_plan(model, pf, path)
            return
        dialect = Dialect(str(self.backend_box.currentData()))
        if is_demo(model) and not self.system.declared:
            plan = demo_plan(model, demo_devices(int(self.settings.get(keys.DEFAULT_MARGIN))), dialect)
            self._set_demo_hardware(True)
        else:
            keep = self.doc.has_plan and not self.on_demo_hardware
            devices = self.doc.plan.devices if keep else self.initial_devices()
            plan = new_plan(model, devices, dialect, int(self.settings.get(keys.DEFAULT_CONTEXT)))
            self._set_demo_hardware(False)
        notes = []
        if model.header_only:
            notes.append(
                "header-only file: the planner reads shapes and sizes; llama-server needs the full model"
            )
        self.doc.reset(plan, notes=notes)
        self.launcher.review_source = None
        self.settings.add_recent(model.path)
        self.show_message(f"Opened {Path(model.path).name}")

    def _open_loaded_plan(self, model: Model, pf: PlanFile, path: str) -> None:
        plan, notes = pf.to_plan(model)
        changes = pf.model_changes(model)
        if changes:
            text = (
                f"The model changed on disk since the plan was saved ({'; '.join(changes)}). "
                "Moves were applied by tensor name; check the map."
            )
            notes.insert(0, text)
            box = QMessageBox(
                QMessageBox.Icon.Warning, "Model changed", text, QMessageBox.StandardButton.Ok, self
            )
            box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
            box.open()
        self._set_demo_hardware(False)
        self.doc.reset(plan, file_path=path, notes=notes)
        self.launcher.review_source = path  # its arguments are shown before the first launch
        self.settings.add_recent(path)
        self.show_message(f"Opened plan {Path(path).name}")

    def _set_demo_hardware(self, on: bool) -> None:
        self.on_demo_hardware = on
        self.devices_panel.notice.setToolTip(demo_tip(self._gpu_tip) if on else self._gpu_tip)
        self.devices_panel.show_notice(DEMO_NOTICE if on else self._gpu_notice)

    def _update_demo_notice(self) -> None:
        if not self.doc.has_plan:
            return
        if self.on_demo_hardware:
            text = demo_notice(self.doc.plan.devices)
        elif self._no_gpu_why:  # the declared GPUs change with + Virtual GPU… and Remove
            text = self._gpu_notice = no_gpu_notice(self._no_gpu_why, self.doc.plan.devices)
        else:
            return
        if text != self.devices_panel.notice.text():
            self.devices_panel.show_notice(text)

    def _fill_recent(self) -> None:
        self.recent_menu.clear()
        for loc in self.settings.recent_files:
            self.recent_menu.addAction(loc, self._recent_opener(loc))
        if self.recent_menu.isEmpty():
            self.recent_menu.addAction("(none)").setEnabled(False)
        else:
            self.recent_menu.addSeparator()
            self.recent_menu.addAction("Clear", lambda: self.settings.set(keys.RECENT_FILES, []))

    def _recent_opener(self, location: str) -> Callable[[], None]:
        def run() -> None:
            self._open_recent(location)

        return run

    def _open_recent(self, location: str) -> None:
        if not location.startswith(("http://", "https://")) and not Path(location).exists():
            self.settings.remove_recent(location)
            self._error("File not found", f"{location} is not there any more; removed from the recent list.")
            return
        self.open_path(location)

    # --- saving ------------------------------------------------------------------------------

    def save(self) -> bool:
        if not self.doc.has_plan:
            return False
        if self.doc.file_path is None:
            return self.save_as()
        return self._save_to(self.doc.file_path)

    def save_as(self) -> bool:
        if not self.doc.has_plan:
            return False
        model = Path(self.doc.plan.model.path)
        default = self.doc.file_path or str(Path.home() / (model.name.removesuffix(".gguf") + SUFFIX))
        path, _ = QFileDialog.getSaveFileName(self, "Save plan", default, f"Plans (*{SUFFIX} *.json)")
        if not path:
            return False
        if not path.endswith(".json"):
            path += SUFFIX
        return self._save_to(path)

    def _save_to(self, path: str) -> bool:
        backend = {"path": str(self.settings.get(keys.BACKEND_PATH)), "dialect": self.doc.plan.dialect}
        try:
            notes = save_plan(path, PlanFile.of(self.doc.plan, backend))
        except PlannerError as e:
            self._error("Cannot save the plan", str(e))
            return False
        for note in notes:
            self.log(note)
        self.doc.file_path = path
        self.doc.undo_stack.setClean()
        self.settings.add_recent(path)
        self._update_title()
        self.show_message(f"Saved {path}" + (f" ({notes[0]})" if notes else ""))
        return True

    # --- reactions ---------------------------------------------------------------------------

    def _on_model_changed(self) -> None:
        self._update_summary()
        self._sync_backend()
        self._update_title()

    def _update_summary(self) -> None:
        """The model line, and what the command loads beside the model (draft, MTP, projector)."""
        if self.doc.has_plan:
            plan = self.doc.plan
            self.summary.set_full_text("   ·   ".join([model_summary(plan.model), *extras_summary(plan)]),
                                       plan.model.path)

    def _sync_backend(self) -> None:
        if self.doc.has_plan:
            i = self.backend_box.findData(self.doc.plan.dialect)
            if i >= 0 and i != self.backend_box.currentIndex():
                self.backend_box.setCurrentIndex(i)

    def _on_backend(self, _index: int) -> None:
        if self.doc.has_plan:
            self.doc.set_dialect(Dialect(str(self.backend_box.currentData())), self.backend_box.currentText())

    def _on_problem_count(self, n: int) -> None:
        self.tabs.setTabText(1, f"Problems ({n})" if n else "Problems")

    def _on_clean_changed(self, _clean: bool) -> None:
        self._update_title()

    def _update_title(self) -> None:
        if self.doc.has_plan:
            name = (
                Path(self.doc.file_path).name if self.doc.file_path else Path(self.doc.plan.model.path).name
            )
            self.setWindowTitle(f"{name}[*] — Offload Planner")
        else:
            self.setWindowTitle("Offload Planner")
        self.setWindowModified(not self.doc.undo_stack.isClean())

    def _on_history(self, index: int) -> None:
        """A status message is about the last edit: an undo says what it undid instead of leaving
        "Fastest plan: 11 tensors moved" under the plan it undid; any other step clears it (an edit
        that reports itself does so after its push)."""
        stack = self.doc.undo_stack
        undone = index < self._history_index <= stack.count()
        self._history_index = index
        if undone:
            self.show_message(f"Undone: {stack.text(index)}")
        else:
            self.statusBar().clearMessage()

    def show_message(self, text: str) -> None:
        self.statusBar().showMessage(text, 6000)

    def _status_tooltip(self, text: str) -> None:
        self.statusBar().setToolTip(text)  # (QStatusBar.setToolTip is no slot PySide can connect)

    def report(self, text: str) -> None:
        """What a pane's action did ("Fastest plan: est. tg ... ; 162 tensors moved ..., -ub 4096,
        KV cache q8_0/q8_0"): in the status bar, which cuts it at the window's width (at 1024 px
        after "-ts 25,37 (it") and clears it after 6 s, and whole in the Log tab, to read later."""
        self.show_message(text)
        if text:
            self.log(text)

    def log(self, text: str) -> None:
        self.log_view.append_line(f"{time.strftime('%H:%M:%S')}  {text}")

    def _error(self, title: str, text: str) -> None:
        self.show_message(text)
        box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok, self)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
        self.errorShown.emit(text)

    def _show_help(self) -> None:
        QMessageBox.information(self, "Keys and mouse", HELP_TEXT)

    # --- drag a .gguf or plan onto the window -------------------------------------------------

    @staticmethod
    def _dropped_path(mime: QMimeData) -> str | None:
        for url in mime.urls():
            p = url.toLocalFile() if url.isLocalFile() else url.toString()
            if p.lower().endswith((".gguf", ".json")):
                return p
        return None

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if self._dropped_path(event.mimeData()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        p = self._dropped_path(event.mimeData())
        if p:
            event.acceptProposedAction()
            self.open_path(p)

    # --- closing -----------------------------------------------------------------------------

    def closeEvent(self, event: QCloseEvent) -> None:
        if not self.confirm_replace(""):
            event.ignore()
            return
        self.save_settings()
        self.launcher.shutdown()  # never leave a server behind
        self.loader.shutdown()
        self.doc.shutdown()
        event.accept()

    def set_backend_path(self, path: str) -> None:
        """The llama-server the launcher starts, remembered in the settings."""
        self.settings.set(keys.BACKEND_PATH, path)
        if self.launcher.executable != path:
            self.launcher.set_executable(path)

    def _on_actuals(self, actuals: dict[str, int]) -> None:
        """The launch's actual totals, marked stale in the memory view once its plan is edited."""
        self.memory_view.set_actuals(actuals, self.launcher.actuals_plan if actuals else None)

    def _plan_to_launcher(self) -> None:
        a = self.doc.analysis
        if a is not None and a.projection is not None and not a.preliminary:
            self.launcher.set_plan(a.plan, a.projection, a.command)
