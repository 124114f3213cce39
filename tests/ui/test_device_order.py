"""The window lists devices in llama.cpp's order whatever order they were declared or saved in:
CUDA0 before CUDA1, so the first layers go to CUDA0 as llama.cpp puts them (issue 13 item 3)."""

from __future__ import annotations

from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window

from offload_planner.core.devices import parse_device_decl
from offload_planner.ui.settings import Settings


def test_gpus_saved_in_another_order_come_back_in_llama_cpp_order(qtbot: QtBot, settings: Settings) -> None:
    settings.store_devices([parse_device_decl("CUDA1=24GiB"), parse_device_decl("CUDA0=12GiB")])
    win = make_window(qtbot, settings, system_info())
    devices = win.initial_devices()
    assert devices.names == ["CUDA0", "CUDA1", "CPU"]
    assert [d.total for d in devices.gpus] == [12 << 30, 24 << 30]
    win.close()


def test_gpus_declared_in_another_order_take_llama_cpp_order(qtbot: QtBot, settings: Settings) -> None:
    win = make_window(qtbot, settings, system_info("Vulkan0=8GiB", "CUDA1=24GiB", "CUDA0=12GiB"))
    assert win.initial_devices().names == ["CUDA0", "CUDA1", "Vulkan0", "CPU"]
    win.close()
