"""The launcher panel with a stand-in llama-server (a Python script printing what the real one would):
state, progress, URL and "Open web UI", the projected-against-actual table, calibration, the log and
telemetry views attached, and a failed launch explained with the device highlighted."""

from __future__ import annotations

import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices
from pytestqt.qtbot import QtBot

from offload_planner.backend.calibration import CalibrationStore
from offload_planner.backend.runner import ServerState
from offload_planner.backend.telemetry import GpuSample, Sample
from offload_planner.core.cmdline import Dialect, parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import Projection
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.units import MiB
from offload_planner.ui.launcher_panel import LauncherPanel
from offload_planner.ui.log_view import LogView
from offload_planner.ui.telemetry_view import TelemetryView

FUNCS = {"model": "load_tensors", "kv": "llama_kv_cache", "output": "llama_context",
         "compute": "sched_reserve"}
KINDS = {"model": "model ", "kv": "KV ", "output": " output ", "compute": "compute "}


def _plan(path: Path, args: str, gpus: tuple[Device, ...] = ()) -> Plan:
    model = open_model(path)
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 << 30, 64 << 30), gpus)
    parsed = parse_server_args(args.split(), dialect=Dialect.LLAMA_CPP)
    return plan_from_args(model, devices, parsed.args, "llama.cpp")


def _buffer_lines(projection: Projection, compute_scale: float = 1.0) -> list[str]:
    out = []
    for dm in projection.devices:
        for b in dm.buffers:
            mib = b.bytes / MiB * (compute_scale if b.kind == "compute" else 1.0)
            out.append(f"0.00.002.000 I {FUNCS[b.kind]}: {b.name:>10} {KINDS[b.kind]}buffer size = "
                       f"{mib:8.2f} MiB")
    return out


def _fake_server(tmp_path: Path, lines: list[str], *, exit_code: int | None = None) -> Path:
    p = tmp_path / "llama-server"
    p.write_text(f"#!{sys.executable}\n" + textwrap.dedent(f"""
        import sys, time
        if sys.argv[1:] == ["--version"]:
            print("version: 0.6.0-dev (build 0, commit unknown)"); sys.exit(0)
        if sys.argv[1:] == ["--help"]:
            print("-lm,   --load-mode MODE"); sys.exit(0)
        port = sys.argv[sys.argv.index("--port") + 1]
        print("0.00.001.000 I srv    load_model: loading model 'm'", flush=True)
        for line in {lines!r}:
            print(line, flush=True)
            time.sleep(0.005)
        if {exit_code!r} is not None:
            sys.exit({exit_code!r})
        print(f"0.00.009.000 I srv  llama_server: listening on http://127.0.0.1:{{port}}", flush=True)
        time.sleep(60)
    """))
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p


def _panel(qtbot: QtBot, exe: Path, tmp_path: Path) -> LauncherPanel:
    panel = LauncherPanel(executable=str(exe), calibration=CalibrationStore(tmp_path / "cal.json"))
    qtbot.addWidget(panel)
    panel.port_spin.setValue(18000 + os.getpid() % 1000)
    return panel


def _cells(panel: LauncherPanel) -> list[list[str]]:
    t = panel.table
    return [[t.item(r, c).text() for c in range(t.columnCount())] for r in range(t.rowCount())]


@pytest.fixture
def qwen_path(small_models: dict[str, Path]) -> Path:
    return small_models["qwen3moe"]


def test_launch_compare_calibrate_and_stop(qtbot: QtBot, tmp_path: Path, qwen_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _plan(qwen_path, "-c 4096")
    projection = plan.projection()
    exe = _fake_server(tmp_path, _buffer_lines(projection, compute_scale=1.02))
    panel = _panel(qtbot, exe, tmp_path)
    log = LogView(flush_ms=10)
    telemetry = TelemetryView()
    qtbot.addWidget(log)
    qtbot.addWidget(telemetry)
    panel.attach_views(log, telemetry)
    assert not panel.launch_button.isEnabled()  # no plan yet
    panel.set_plan(plan, projection)
    assert panel.launch_button.isEnabled() and not panel.stop_button.isEnabled()
    assert [r[:4] for r in _cells(panel)][-1][:2] == ["CPU", "total"]  # the projection before launching
    states: list[str] = []
    panel.stateChanged.connect(states.append)
    with qtbot.waitSignal(panel.server.ready, timeout=20_000):
        assert panel.launch()
    assert panel.server.state is ServerState.RUNNING and "Running" in panel.state_label.text()
    assert panel.progress.value() == 1000 and panel.open_button.isEnabled()
    assert panel.progress.isVisibleTo(panel) and not panel.idle_hint.isVisibleTo(panel)  # launched: no hint
    assert panel.stop_button.isEnabled() and not panel.launch_button.isEnabled()
    url = panel.server.url
    assert url is not None and url in panel.url_label.text()
    opened: list[QUrl] = []
    monkeypatch.setattr(QDesktopServices, "openUrl", staticmethod(lambda u: opened.append(u) or True))
    panel.open_web_ui()
    assert [u.toString() for u in opened] == [url]
    assert "-lv 4" in panel.command_edit.text() and "--port" in panel.command_edit.text()
    cmp = panel.comparison
    assert cmp is not None and cmp.ok  # compute 2% above: within 5%
    rows = _cells(panel)
    total = next(r for r in rows if r[:2] == ["CPU", "total"])
    assert total[6] == "✓" and total[4] != "-"
    compute = next(r for r in rows if r[2] == "compute")
    assert compute[5].startswith("+") and float(compute[5]) > 0
    store = panel.calibration
    assert store is not None and store.path.is_file()
    qtbot.waitUntil(lambda: telemetry.samples_seen >= 1, timeout=3000)
    assert telemetry.projected() == {"CPU": projection.device("CPU").total()}
    qtbot.waitUntil(lambda: log.model.rowCount() > len(projection.buffers()), timeout=3000)
    assert any("listening on" in ln for ln in log.model.lines())
    assert any(ln.startswith("[launcher] added -lv 4") for ln in log.model.lines())
    with qtbot.waitSignal(panel.server.finished, timeout=20_000):
        panel.stop()
    assert states[-2:] == ["Stopping", "Exited"] and not panel.failures.isVisible()
    assert not panel.sampler.running and panel.launch_button.isEnabled()
    panel.set_plan(plan, projection)  # the same plan again: its compute is shown as calibrated
    compute = next(r for r in _cells(panel) if r[2] == "compute")
    assert compute[6].startswith("calibrated ") and float(compute[6].split()[1]) > float(compute[3])
    assert panel.calibrated["CPU"] > projection.device("CPU").compute


def test_failed_launch_is_explained_and_the_device_highlighted(qtbot: QtBot, tmp_path: Path,
                                                               qwen_path: Path) -> None:
    plan = _plan(qwen_path, "-ngl 999 -c 4096", (parse_device_decl("CUDA0=16MiB"),))
    projection = plan.projection()
    assert projection.device("CUDA0").total() > 16 * MiB
    oom = [
        "0.00.003.000 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 8.00 MiB on device 0: "
        "cudaMalloc failed: out of memory",
        "0.00.003.001 E llama_init_from_model: failed to initialize the context: failed to allocate buffer "
        "for kv cache",
        "0.00.003.002 E srv  llama_server: exiting due to model loading error",
    ]
    model_lines = [ln for ln in _buffer_lines(projection) if "model buffer" in ln]
    panel = _panel(qtbot, _fake_server(tmp_path, model_lines + oom, exit_code=1), tmp_path)
    panel.set_plan(plan, projection)
    highlighted: list[str] = []
    panel.deviceHighlighted.connect(highlighted.append)
    with qtbot.waitSignal(panel.server.finished, timeout=20_000):
        panel.launch()
    assert panel.server.state is ServerState.FAILED and "Failed" in panel.state_label.text()
    assert highlighted[-1] == "CUDA0" and panel.failures.isVisibleTo(panel)
    e = panel.explanations[0]
    assert e.kind == "oom" and e.device == "CUDA0" and "KV cache" in e.title
    assert e.suggestion is not None and e.suggestion.verified
    assert "suggestion:" in panel.failures.item(0).text()
    t = panel.table
    cuda_total = next(r for r in range(t.rowCount())
                      if t.item(r, 0).text() == "CUDA0" and t.item(r, 1).text() == "total")
    assert panel.table.item(cuda_total, 0).background().color().red() == 255  # highlighted
    assert panel.launch_button.isEnabled() and not panel.stop_button.isEnabled()


def test_options_and_refusals(qtbot: QtBot, tmp_path: Path, qwen_path: Path) -> None:
    panel = _panel(qtbot, tmp_path / "llama-server", tmp_path)
    plan = _plan(qwen_path, "-c 2048")
    panel.set_plan(plan)
    panel.env_edit.setText("CUDA_VISIBLE_DEVICES=1 GGML_OP_OFFLOAD_MIN_BATCH=64 DROP=")
    panel.extra_edit.setText("--threads 4 --alias 'my model'")
    panel.wrapper_edit.setText("numactl --interleave=all")
    panel.verbose_box.setChecked(False)
    cfg = panel.launch_config()
    assert cfg.env == {"CUDA_VISIBLE_DEVICES": "1", "GGML_OP_OFFLOAD_MIN_BATCH": "64", "DROP": None}
    assert cfg.extra_args == ["--threads", "4", "--alias", "my model"]
    assert cfg.wrapper == ["numactl", "--interleave=all"] and not cfg.verbose_log
    assert cfg.model == plan.model.path and "-c" in cfg.server_args
    panel.env_edit.setText("not-an-assignment")
    assert not panel.launch() and panel.explanations[0].kind == "start"
    assert "launch options" in panel.explanations[0].title
    from offload_planner.core.synth import SMALL_MODELS, write_model

    header = write_model(SMALL_MODELS["llama"], tmp_path / "header.gguf", header_only=True)[0]
    panel.set_plan(_plan(header, "-c 2048"))
    panel.env_edit.clear()
    assert not panel.launch() and "header-only" in panel.explanations[0].title


def test_telemetry_view_draws_samples_and_projected_lines(qtbot: QtBot) -> None:
    view = TelemetryView(keep=3)
    qtbot.addWidget(view)
    view.set_projection({"CUDA0": 8 << 30, "CPU": 2 << 30})
    view.set_projection({"CUDA0": 6 << 30, "CPU": 2 << 30})  # replaces the lines
    assert view.projected() == {"CUDA0": 6 << 30, "CPU": 2 << 30} and len(view._lines) == 2
    for i in range(5):
        view.add_sample(Sample(i * 0.25, (GpuSample("CUDA0", (i + 1) << 30, 24 << 30, 10 * i),), rss=1 << 30,
                               ram_used=4 << 30, ram_total=16 << 30))
    x, y = view.series("mem:CUDA0")
    assert list(x) == [0.5, 0.75, 1.0] and list(y) == [3.0, 4.0, 5.0]  # bounded to the last 3
    assert list(view.series("util:CUDA0")[1]) == [20.0, 30.0, 40.0]
    assert list(view.series("mem:CPU")[1]) == [1.0, 1.0, 1.0]
    assert list(view.series("ram:used")[1]) == [4.0] * 3
    view.set_message("RAM only: nvidia-ml-py is not installed")
    assert view.message.isVisibleTo(view)
    view.clear()
    assert view.series("mem:CUDA0")[0].size == 0


def test_table_notes_a_plan_edited_since_the_launch(qtbot: QtBot, tmp_path: Path, qwen_path: Path) -> None:
    plan = _plan(qwen_path, "-c 4096")
    projection = plan.projection()
    panel = _panel(qtbot, _fake_server(tmp_path, _buffer_lines(projection)), tmp_path)
    panel.set_plan(plan, projection)
    assert not panel.stale_note.isVisibleTo(panel) and not panel.table_is_stale
    emitted: list[dict[str, int]] = []
    panel.actualsReady.connect(emitted.append)
    with qtbot.waitSignal(panel.server.ready, timeout=20_000):
        assert panel.launch()
    assert emitted[-1] and panel.actuals_plan is plan
    launched_rows = _cells(panel)
    edited = _plan(qwen_path, "-c 2048")  # an edit while the server runs
    panel.set_plan(edited, edited.projection())
    assert panel.table_is_stale and panel.stale_note.isVisibleTo(panel)
    assert "edited since this launch" in panel.stale_note.text()
    assert _cells(panel) == launched_rows  # the table still shows the launch
    panel.set_plan(plan, projection)  # back to the launched plan
    assert not panel.table_is_stale and not panel.stale_note.isVisibleTo(panel)
    panel.set_plan(edited, edited.projection())
    with qtbot.waitSignal(panel.server.finished, timeout=20_000):
        panel.stop()
    panel.set_plan(edited, edited.projection())  # stopped: the table shows the edited projection
    assert not panel.stale_note.isVisibleTo(panel)
    assert next(r for r in _cells(panel) if r[:2] == ["CPU", "total"])[4] == "-"


def test_the_launch_notes_name_the_verbose_log_box(qtbot: QtBot, tmp_path: Path, qwen_path: Path) -> None:
    """'added -lv 4: ... (turn off "verbose log" to launch the command exactly as written)': the box
    it means is called that (it read "Log buffer sizes", so the note named nothing on screen)."""
    import re

    from offload_planner.backend import launch

    panel = _panel(qtbot, tmp_path / "llama-server", tmp_path)
    panel.set_plan(_plan(qwen_path, "-c 2048"))
    cfg = panel.launch_config()
    assert cfg.verbose_log
    cmd = launch.build_command("llama-server", cfg.server_args, verbose_log=cfg.verbose_log)
    quoted = [m for n in cmd.notes for m in re.findall(r'"([^"]+)"', n)]
    assert quoted == ["verbose log"], cmd.notes
    assert panel.verbose_box.text().lower().startswith("verbose log")


def test_a_silent_exit_says_where_to_look(qtbot: QtBot, tmp_path: Path, qwen_path: Path) -> None:
    """A llama-server that exits with an error code and prints nothing left "llama-server exited with
    code 3" alone: no error to quote, no next step (newcomer7)."""
    from offload_planner.ui.launcher_panel import SILENT_EXIT

    exe = tmp_path / "llama-server"
    exe.write_text(f"#!{sys.executable}\nimport sys\n"
                   "if sys.argv[1:] == ['--version']:\n    print('version: 0.6.0-dev (build 0, commit x)')\n"
                   "    sys.exit(0)\nsys.exit(3)\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    panel = _panel(qtbot, exe, tmp_path)
    panel.set_plan(_plan(qwen_path, "-c 2048"))
    with qtbot.waitSignal(panel.server.finished, timeout=20_000):
        panel.launch()
    assert panel.server.state is ServerState.FAILED
    assert panel.failures.item(0).text() == f"llama-server exited with code 3\n  {SILENT_EXIT}"
