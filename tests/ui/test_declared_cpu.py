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
