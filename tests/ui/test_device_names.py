"""The "+ Virtual GPU..." dialog refuses a GPU name llama.cpp never has (CUDA01, CUDA16), as --device
does: a virtual CUDA01 planned, and the command's -ot rules named a buffer type llama-server refuses
(newcomer4)."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import make_window, open_and_wait

from offload_planner.ui.device_panel import AddGpuDialog
from offload_planner.ui.main_window import SystemInfo
from offload_planner.ui.settings import Settings

QWEN = str(Path(__file__).resolve().parents[2] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf")


def test_the_add_gpu_dialog_refuses_names_llama_cpp_never_has(qtbot: QtBot, tmp_path: Path) -> None:
    win = make_window(qtbot, Settings.at(str(tmp_path / "s.ini")), SystemInfo.probe([]))
    open_and_wait(qtbot, win, QWEN)
    for name, said in [("CUDA01", "'CUDA01': llama.cpp names it CUDA1 (no leading zero)"),
                       ("CUDA16", "llama.cpp numbers at most 16 devices (llama_max_devices)"),
                       ("Vulkan", "'Vulkan' needs its index"), ("CUDA1", "")]:
        dlg = AddGpuDialog(win.doc, 1 << 30, win)
        dlg.name.setText(name)
        dev = dlg.device()
        assert (dev is None) == bool(said) and said in dlg.error.text(), (name, dlg.error.text())
        assert dev is None or dev.name == name


def test_an_apple_card_adds_the_gpu_the_pinned_build_calls_mtl0(qtbot: QtBot, tmp_path: Path) -> None:
    """The pinned build names its Metal device MTL0 (ggml/src/ggml-metal/ggml-metal-device.m:1301):
    choosing an Apple card sets the Metal backend and the name MTL0; a typed Metal0 (the planner's old
    name) is added as MTL0, so the command's -dev / -ot name a device that build has."""
    win = make_window(qtbot, Settings.at(str(tmp_path / "s.ini")), SystemInfo.probe([]))
    open_and_wait(qtbot, win, QWEN)
    dlg = AddGpuDialog(win.doc, 1 << 30, win)
    dlg.card.setCurrentIndex(dlg.card.findData("m3max"))
    assert dlg.kind.currentData() == "Metal"
    assert dlg.name.text() == "MTL0"
    dev = dlg.device()
    assert dev is not None and dev.name == "MTL0"
    dlg.name.setText("Metal0")
    dev = dlg.device()
    assert dev is not None and dev.name == "MTL0"
