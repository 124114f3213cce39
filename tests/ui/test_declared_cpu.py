"""`offload-planner gui --device CPU=512GiB,ram=8xDDR5-4800` took the RAM's size and dropped its
speed keys: the window estimated (and its Fastest plan searched) on this machine's RAM probe while
`plan` with the same --device estimated on the declared 8 channels (DeepSeek-V3, RTX 3090 + 4090:
the window's Fastest plan said est. tg 1.04 t/s, plan and fit 13.0). The window's speed line now
equals plan's for the window's own command (newcomer4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import make_window, open_and_wait

from offload_planner.core.devices import parse_device_decl
from offload_planner.ui.main_window import SystemInfo
from offload_planner.ui.rates import rate_text
from offload_planner.ui.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
QWEN = ROOT / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf"
DEVICES = ["CUDA0=rtx3090", "CPU=512GiB,ram=8xDDR5-4800,threads=16"]


def test_the_windows_declared_cpu_keeps_its_speed_keys(qtbot: QtBot, tmp_path: Path) -> None:
    win = make_window(qtbot, Settings.at(str(tmp_path / "s.ini")),
                      SystemInfo.probe([parse_device_decl(d) for d in DEVICES]))
    open_and_wait(qtbot, win, QWEN)
    assert win.doc.plan.devices.cpu.hardware == (("ram", "8xDDR5-4800"), ("threads", "16"))
    qtbot.waitUntil(lambda: win.speed_label.text().startswith("est. tg"), timeout=30_000)
    command = win.command_pane.argv()
    assert command[1:3] == ["-m", str(QWEN)], command
    env = {**os.environ, "PYTHONPATH": str(ROOT / "gui")}
    r = subprocess.run([sys.executable, "-m", "offload_planner", "plan", str(QWEN), "--json", "--no-detect",
                        *(f"--device={d}" for d in DEVICES), "--", *command[3:]],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode in (0, 3), r.stderr
    speed = json.loads(r.stdout)["speed"]
    assert {"note": "CPU ram= (channels x MT/s x 8 B)", "value": 307.2} in [
        {k: a.get(k) for k in ("note", "value")} for a in speed["assumptions"]], speed["assumptions"]
    line = win.speed_label.text()
    assert line.startswith(f"est. tg {rate_text(speed['tg_tps'])} t/s"), (line, speed["tg_tps"])


def test_a_declared_ram_is_not_called_system_ram(qtbot: QtBot, tmp_path: Path) -> None:
    """`gui --device CPU=512GiB,...` on a 23.5 GiB machine: the Memory pane named the CPU row "system
    RAM" beside 512 GiB, read as this machine's memory. A size declared with --device or typed in the
    Size column is "declared RAM" (undone: "system RAM" again); `plan` builds its devices the same way."""
    from offload_planner.core.device_figures import DeviceFigures
    from offload_planner.core.devices import build_device_set

    declared = make_window(qtbot, Settings.at(str(tmp_path / "d.ini")),
                           SystemInfo.probe([parse_device_decl(d) for d in DEVICES]))
    try:
        open_and_wait(qtbot, declared, QWEN)
        cpu = declared.doc.plan.devices.cpu
        assert (cpu.description, cpu.total) == ("declared RAM", 512 * 1024**3)
        projection = declared.doc.analysis.projection  # type: ignore[union-attr]
        assert projection is not None
        row = next(DeviceFigures.of(dm) for dm in projection.devices if dm.device.name == "CPU")
        assert row.description == "declared RAM"  # the Memory pane's label
    finally:
        declared.close()
    plain = make_window(qtbot, Settings.at(str(tmp_path / "p.ini")), SystemInfo.probe([]))
    try:
        open_and_wait(qtbot, plain, QWEN)
        assert plain.doc.plan.devices.cpu.description == "system RAM"
        plain.doc.set_device_size("CPU", 64 * 1024**3)
        assert plain.doc.plan.devices.cpu.description == "declared RAM"
        plain.doc.undo_stack.undo()
        assert plain.doc.plan.devices.cpu.description == "system RAM"
    finally:
        plain.close()
    system = SystemInfo.probe([]).cpu
    built = build_device_set(cpu=system, detected=[], rpc_endpoints=[],
                             declared=[parse_device_decl("CPU=512GiB")])
    assert built.cpu.description == "declared RAM"


def test_a_declared_cpu_without_its_speed_is_said_in_the_speed_tooltip(qtbot: QtBot, tmp_path: Path) -> None:
    """`gui --device CPU=4096GiB` (another machine, its RAM speed not given) estimated on this
    machine's RAM probe with only the assumption line naming it; the speed tooltip says so first, as
    plan's note does, and says nothing of it with ram=."""
    def tip(decls: list[str], name: str) -> str:
        win = make_window(qtbot, Settings.at(str(tmp_path / name)),
                          SystemInfo.probe([parse_device_decl(d) for d in decls]))
        open_and_wait(qtbot, win, QWEN)
        qtbot.waitUntil(lambda: win.speed_label.text().startswith("est. tg"), timeout=30_000)
        return win.speed_label.toolTip()

    said = tip(["CUDA0=rtx3090", "CPU=4096GiB"], "a.ini")
    assert said.startswith("<b>RAM speed</b>: --device CPU=4096GiB is more RAM than this machine's "), said
    assert ("give its speed too: --device CPU=4096GiB,ram=8xDDR5-4800 (channels x MT/s) or "
            "bw=300GB/s.<br>") in said
    assert "RAM speed</b>" not in tip(["CUDA0=rtx3090", "CPU=4096GiB,ram=8xDDR5-4800"], "b.ini")
