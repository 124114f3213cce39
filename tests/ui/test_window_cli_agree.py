"""The window and `offload-planner plan` analyse a plan the same way: the window's command, given to
the CLI with the window's devices, gives the same warnings (the window adds only the name of the
preset that fixes an over-capacity GPU) and the same devices over capacity, counted by one rule
(mmap'd weights by the bytes read, not the file span llama.cpp logs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import open_and_wait, wait_projected

from offload_planner.core.analysis import Analysis
from offload_planner.core.device_figures import DeviceFigures
from offload_planner.core.placement import CPU
from offload_planner.core.units import GiB
from offload_planner.ui.main_window import MainWindow

GUI = str(Path(__file__).resolve().parents[2] / "gui")
ROOM_HINT = " left can take routed experts from it: "
HINT = " with routed experts keeps as many expert layers there as fit and sends the rest to the CPU"


def _cli_plan(model: Path, command: list[str], devices: list[str]) -> tuple[int, dict[str, Any]]:
    assert command[:2] == ["-m", str(model)], command[:2]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "PYTHONPATH": GUI,
           "OFFLOAD_PLANNER_CONFIG_DIR": os.environ["OFFLOAD_PLANNER_CONFIG_DIR"]}
    argv = [sys.executable, "-m", "offload_planner", "plan", str(model), "--json", "--no-detect",
            *(f"--device={d}" for d in devices), "--", *command[2:]]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode in (0, 3), r.stderr
    return r.returncode, json.loads(r.stdout)


def _without_hint(warning: str) -> str:
    """The warning without what only the window adds: the fill preset's hint on a GPU over capacity,
    and (``ui.room_hint``) the GPUs' room for the routed experts of a CPU over capacity."""
    head, sep, _ = warning.partition(": Presets ▸ Fill ")
    if sep and warning.endswith(HINT):
        return head
    head, sep, _ = warning.partition(ROOM_HINT)
    return head.rpartition(": ")[0] if sep else warning


def _window_over(a: Analysis) -> list[str]:
    assert a.projection is not None
    return [dm.device.name for dm in a.projection.devices if DeviceFigures.of(dm).over]


def _open_without_margins(qtbot: QtBot, window: MainWindow, model: Path) -> Analysis:
    """The demo in the window, its devices' safety margins at 0 (the CLI declares none)."""
    open_and_wait(qtbot, window, model)
    for d in window.doc.plan.devices:
        window.doc.set_device_margin(d.name, 0)
    wait_projected(qtbot, window)
    a = window.doc.analysis
    assert a is not None and a.projection is not None
    return a


def _agree(window: MainWindow, model: Path, devices: list[str]) -> dict[str, Any]:
    a = window.doc.analysis
    assert a is not None and a.projection is not None and not a.error
    code, out = _cli_plan(model, a.command, devices)
    assert out["warnings"] == [_without_hint(w) for w in a.warnings]
    over = _window_over(a)
    assert code == (3 if over else 0)
    cli_over = [d["name"] for d in out["devices"]
                if any(w.startswith(f"{d['name']} is over capacity") for w in out["warnings"])]
    assert cli_over == over
    for d in out["devices"]:
        dm = a.projection.device(d["name"])
        assert (d["total_bytes"], d["capacity_bytes"]) == (dm.total(), dm.device.capacity)
    return out


def test_window_and_cli_agree_on_a_gpu_over_capacity(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    """DeepSeek-V3 (377 GiB) on one 24 GiB GPU: CUDA0 is over; the window names the fill preset."""
    a = _open_without_margins(qtbot, window, demo_path)
    (gpu_line,) = [w for w in a.warnings if w.startswith("CUDA0 is over capacity")]
    assert gpu_line.endswith(HINT)
    out = _agree(window, demo_path, ["CUDA0=24GiB", "CPU=512GiB"])
    assert [w for w in out["warnings"] if "over capacity" in w] == [_without_hint(gpu_line)]


def test_window_and_cli_agree_on_mmap_counting(qtbot: QtBot, window: MainWindow, demo_path: Path) -> None:
    """Experts on the CPU, one of them back on the GPU (a gap in the CPU's mmap span): with RAM
    between the bytes read and the span, the CPU fits for both; with less than the bytes read,
    both say it is over, by the same bytes."""
    _open_without_margins(qtbot, window, demo_path)
    window.presets_menu.routed_experts_to(CPU)
    window.doc.move(["blk.30.ffn_up_exps.weight"], "CUDA0")
    wait_projected(qtbot, window)
    a = window.doc.analysis
    assert a is not None and a.projection is not None
    cpu = a.projection.device(CPU)
    between = -(-cpu.resident() // GiB)  # GiB, rounded up
    assert between * GiB < cpu.total(), "the case where span and bytes read disagree"
    for ram, over in ((between, []), (between - 2, [CPU])):
        window.doc.set_device_size(CPU, ram * GiB)
        wait_projected(qtbot, window)
        a = window.doc.analysis
        assert a is not None and _window_over(a) == over
        _agree(window, demo_path, ["CUDA0=24GiB", f"CPU={ram}GiB"])
