"""Fixtures for the planner window: offscreen Qt, fixed devices (no psutil/NVML), temp settings.

Sections: environment; models; the window and helpers that drive it.
"""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before anything creates a QApplication

from collections.abc import Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import make_window

from offload_planner.backend import qt_compat
from offload_planner.backend.system import Detection
from offload_planner.core.devices import Device, DeviceKind, parse_device_decl
from offload_planner.core.synth import SMALL_MODELS, write_model
from offload_planner.core.units import GiB
from offload_planner.ui.loader import demo_model
from offload_planner.ui.main_window import MainWindow, SystemInfo
from offload_planner.ui.settings import Settings

qt_compat.apply()

# --- environment -------------------------------------------------------------------------------


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings.at(str(tmp_path / "settings.ini"))


def system_info(*gpus: str, cpu_gib: int = 512) -> SystemInfo:
    cpu = Device(
        "CPU", DeviceKind.CPU, cpu_gib * GiB, cpu_gib * GiB, description="system RAM", source="psutil"
    )
    detection = Detection([], "no NVIDIA driver found (test machine); declare GPUs with --device CUDA0=24GiB")
    return SystemInfo(cpu, detection, [parse_device_decl(g) for g in gpus])


# --- models ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def qwen3moe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small, complete Qwen3-MoE (4 layers, 8 experts)."""
    return write_model(SMALL_MODELS["qwen3moe"], tmp_path_factory.mktemp("ui_models") / "qwen3moe.gguf")[0]


@pytest.fixture(scope="session")
def demo_path() -> Path:
    """The bundled header-only DeepSeek-V3 (61 layers, 1,086 tensors)."""
    path = demo_model()
    assert path.is_file(), path
    return path


# --- the window --------------------------------------------------------------------------------


@pytest.fixture
def window(qtbot: QtBot, settings: Settings) -> Iterator[MainWindow]:
    """The window with one virtual 24 GiB GPU and 512 GiB of RAM, no model yet."""
    win = make_window(qtbot, settings, system_info("CUDA0=24GiB"))
    yield win
    win.close()
