"""--rpc servers in the window (a pasted command with two rpc-servers, no NVIDIA driver): their size is
not asked of them, so the Devices list shows "?"; the Memory pane still said "✔ fits on every device",
the "?" had no word of what it meant or how to give it, and the Devices notice called the servers
"declared" ("planning for the declared RPC0, RPC1, CUDA0"), which no --device had done."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.core.units import GiB
from offload_planner.ui.settings import Settings

PASTED = "llama-server -m x.gguf --rpc 127.0.0.1:1,127.0.0.1:2 -ngl 999 -c 8192 --cpu-moe"


def test_rpc_servers_of_unknown_size(qtbot: QtBot, settings: Settings, demo_path: Path) -> None:
    win = make_window(qtbot, settings, system_info("CUDA0=24GiB"))
    try:
        open_and_wait(qtbot, win, demo_path)
        assert win.command_pane.paste_text(PASTED)
        wait_projected(qtbot, win)
        assert [d.name for d in win.doc.plan.devices.gpus] == ["RPC0", "RPC1", "CUDA0"]
        assert win.memory_view.verdict() == "✔ fits the devices of known size"
        assert win.devices_panel.notice.text() == (
            "No GPU detected (no NVIDIA driver found): planning for the declared CUDA0 and the --rpc "
            "servers RPC0, RPC1.")
        model = win.devices_panel.model
        size = model.index(0, 1)
        assert model.data(size) == "?"
        tip = str(model.data(model.index(0, 0), Qt.ItemDataRole.ToolTipRole))
        assert "size unknown (?): double-click Size to type it (on the command line: --device RPC0=SIZE)" \
            in tip
        assert model.setData(size, 64)  # what the tooltip says to do
        wait_projected(qtbot, win)
        assert win.doc.plan.devices.by_name("RPC0").capacity == 64 * GiB  # type: ignore[union-attr]
        assert model.data(size) == "64.0 GiB"
        win.doc.set_device_size("RPC1", 64 * GiB)
        wait_projected(qtbot, win)
        assert win.memory_view.verdict() == "✔ fits on every device"
        win.doc.remove_device("CUDA0")
        wait_projected(qtbot, win)
        assert win.devices_panel.notice.text() == (
            "No GPU detected (no NVIDIA driver found): planning for the --rpc servers RPC0, RPC1.")
    finally:
        win.close()
