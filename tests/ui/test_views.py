"""What the views show: tooltips with names, types, shapes, rules and buffer breakdowns; capacity
against what mmap actually reads; painting stays fast at 120 layers."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.core.device_figures import DeviceFigures
from offload_planner.core.placement import CPU
from offload_planner.core.synth import BIG_MODELS, write_model
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.memory_view import device_tooltip
from offload_planner.ui.settings import Settings


def test_cell_tooltip_names_tensors_types_shapes_and_rules(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    open_and_wait(qtbot, window, demo_path)
    window.doc.move(["blk.7.ffn_down_exps.weight"], CPU)
    grid = window.doc.grid
    assert grid is not None
    model = window.map_view.model()
    down = model.index(grid.row_of_layer(7) or 0, grid.column_index("exps_down") or 0)
    tip = str(model.data(down, Qt.ItemDataRole.ToolTipRole))
    assert "blk.7.ffn_down_exps.weight" in tip and "moved in the planner" in tip
    assert "◆ moved from llama.cpp's default placement, by you or a preset" in tip
    t = window.doc.plan.model.tensor("blk.7.ffn_down_exps.weight")
    assert t.type.name in tip and " x ".join(map(str, t.shape)) in tip
    attn = model.index(grid.row_of_layer(7) or 0, grid.column_index("attn") or 0)
    tip = str(model.data(attn, Qt.ItemDataRole.ToolTipRole))
    assert "blk.7.attn_kv_a_mqa.weight" in tip and "layer 7 by -ngl" in tip
    assert "layer 7" in str(model.data(attn, Qt.ItemDataRole.AccessibleTextRole))


def test_memory_tooltip_and_mmap_counting(qtbot: QtBot, window: MainWindow, demo_path: Path) -> None:
    open_and_wait(qtbot, window, demo_path)
    window.presets_menu.routed_experts_to(CPU)
    window.doc.set_device_size(CPU, 400 << 30)
    window.doc.move(["blk.30.ffn_up_exps.weight"], "CUDA0")  # a GPU tensor in the middle of the CPU span
    wait_projected(qtbot, window)
    a = window.doc.analysis
    assert a is not None and a.projection is not None
    cpu = a.projection.device(CPU)
    f = DeviceFigures.of(cpu)
    assert f.unread_span > 0 and f.used == cpu.total() - f.unread_span
    tip = device_tooltip(cpu)
    assert "CPU_Mapped" in tip and "mmap span" in tip and "not counted" in tip
    gpu_tip = device_tooltip(a.projection.device("CUDA0"))
    assert "kv" in gpu_tip and "compute" in gpu_tip and "left" in gpu_tip
    assert not any("over capacity" in w for w in a.warnings), "experts on CPU: it fits"
    window.doc.set_device_size(CPU, 300 << 30)  # less than the experts read from the file
    wait_projected(qtbot, window)
    a = window.doc.analysis
    assert a is not None and any(w.startswith("CPU is over capacity") for w in a.warnings)


def test_noticed_over_capacity_in_the_memory_view(qtbot: QtBot, window: MainWindow, demo_path: Path) -> None:
    open_and_wait(qtbot, window, demo_path)
    a = window.doc.analysis
    assert a is not None and a.projection is not None
    gpu = DeviceFigures.of(a.projection.device("CUDA0"))
    assert gpu.over > 300 << 30  # 377 GiB of weights on a 24 GiB GPU
    assert "Problems (" in window.tabs.tabText(1)


@pytest.fixture(scope="module")
def model_120(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = replace(BIG_MODELS["Qwen3-235B-A22B-Q4_K_M"], n_layer=120)
    return write_model(spec, tmp_path_factory.mktemp("big") / "q120.gguf", header_only=True)[0]


def test_120_layers_paint_and_move_quickly(qtbot: QtBot, tmp_path: Path, model_120: Path) -> None:
    win = make_window(qtbot, Settings.at(str(tmp_path / "s.ini")), system_info("CUDA0=24GiB", "CUDA1=24GiB"))
    open_and_wait(qtbot, win, model_120)
    view = win.map_view
    assert view.model().rowCount() == 122
    view.selectAll()
    t0 = time.perf_counter()
    for _ in range(5):
        view.viewport().repaint()
    paint_ms = (time.perf_counter() - t0) / 5 * 1000
    names = [t.name for t in win.doc.plan.model.tensors if t.role.is_routed_expert]
    t0 = time.perf_counter()
    assert win.doc.move(names, CPU)
    move_ms = (time.perf_counter() - t0) * 1000
    assert paint_ms < 150, f"repainting the whole map took {paint_ms:.0f} ms"
    assert move_ms < 300, f"a move blocked the GUI thread for {move_ms:.0f} ms"
    wait_projected(qtbot, win, 60_000)
    win.close()


def test_fill_message_counts_expert_layers_already_on_the_gpu(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    open_and_wait(qtbot, window, demo_path)
    window.presets_menu.routed_experts_to(CPU)
    wait_projected(qtbot, window)
    messages: list[str] = []
    window.presets_menu.message.connect(messages.append)
    assert window.presets_menu.fill("CUDA0", from_first=True)
    on_gpu = {p.tensor.layer for p in window.doc.placement.items
              if p.tensor.role.is_routed_expert and p.device == "CUDA0"}
    assert on_gpu, "some expert layers fit"
    assert on_gpu == {3}  # one 24 GiB GPU: layer 3's experts fit beside the rest (README Guide, step 2)
    assert messages[-1] == "CUDA0 holds the routed experts of layer 3"  # was "of 1 layers"


def test_fill_message_names_the_layers(qtbot: QtBot, settings: Settings, demo_path: Path) -> None:
    """Two 24 GiB GPUs, as in the README's step 4: the message names the layers each fill gave."""
    win = make_window(qtbot, settings, system_info("CUDA0=24GiB", "CUDA1=24GiB"))
    open_and_wait(qtbot, win, demo_path)
    menu = win.presets_menu
    menu.routed_experts_to(CPU)
    wait_projected(qtbot, win)
    messages: list[str] = []
    menu.message.connect(messages.append)
    assert menu.fill("CUDA0", from_first=True)
    wait_projected(qtbot, win)
    assert menu.fill("CUDA1", from_first=False)
    assert messages == ["CUDA0 holds the routed experts of 2 layers (3-4)",
                        "CUDA1 holds the routed experts of 2 layers (59-60)"]
    win.close()


def test_llama_fit_preset_is_one_undo_step(qtbot: QtBot, window: MainWindow, demo_path: Path) -> None:
    open_and_wait(qtbot, window, demo_path)
    menu = window.presets_menu
    menu.aboutToShow.emit()
    assert "What llama.cpp's --fit would run" in [a.text() for a in menu.actions()]
    before = window.doc.plan
    messages: list[str] = []
    menu.message.connect(messages.append)
    assert menu.llama_fit()
    assert window.doc.undo_stack.undoText() == "llama.cpp --fit"
    assert messages[-1].startswith("As llama.cpp's --fit would run it: -c ")
    wait_projected(qtbot, window)
    assert "-ot" in window.command_pane.text.toPlainText()
    window.doc.undo_stack.undo()
    assert window.doc.plan == before
    window.doc.set_dialect("ik_llama.cpp", "ik_llama.cpp")
    menu.aboutToShow.emit()
    assert "What llama.cpp's --fit would run" not in [a.text() for a in menu.actions()]
