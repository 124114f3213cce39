"""The memory bars show a speculative draft model (-md) and an MTP context (--spec-type draft-mtp) as
segments of their own, named in the breakdown line, the tooltip and the legend: counted inside the
main model's weights/KV/compute they made the main model look bigger than it is."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QColor
from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import open_and_wait, wait_projected

from offload_planner.core.buffer import Buffer
from offload_planner.core.extra_context import DRAFT, MTP
from offload_planner.core.memory import DeviceMemory
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.memory_view import device_tooltip, gib


def _extra_bytes(window: MainWindow, key: str, device: str) -> int:
    proj = window.doc.analysis.projection  # type: ignore[union-attr]
    extra = next(e for e in proj.extras if e.key == key)
    return extra.by_device()[device]


def _main_bytes(dm: DeviceMemory, kind: str) -> int:
    return sum(b.bytes for b in dm.buffers if b.kind == kind and not b.owner)


def test_draft_model_is_a_segment_with_a_legend_entry(qtbot: QtBot, window: MainWindow,
                                                      small_models: dict[str, Path]) -> None:
    open_and_wait(qtbot, window, small_models["llama"])
    view = window.memory_view
    assert not any(kind == DRAFT for _l, kind in view.legend_items())
    draft = small_models["llama-draft"]
    assert window.command_pane.apply_command_text(
        f"llama-server -m m.gguf -c 2048 -ngl 99 -md {draft} -ngld 99")
    wait_projected(qtbot, window)
    window.h_split.setSizes([200, 200, 880])  # room for whole labels
    qtbot.waitUntil(lambda: view.width() > 800)
    on_gpu = _extra_bytes(window, DRAFT, "CUDA0")
    text, _rect = view.breakdown(0)  # type: ignore[misc]
    assert f"draft model {gib(on_gpu)}" in text
    gpu = window.doc.analysis.projection.device("CUDA0")  # type: ignore[union-attr]
    assert f"weights {gib(_main_bytes(gpu, 'model'))}" in text  # the main model's alone
    assert ("draft model", DRAFT) in view.legend_items()
    assert "draft model" in device_tooltip(gpu)
    # narrow: one-letter labels, the legend says what D is
    window.h_split.setSizes([270, 690, 300])
    qtbot.waitUntil(lambda: view.width() < 400)
    assert view.abbreviated()
    assert f"D {gib(on_gpu)}" in view.breakdown(0)[0]  # type: ignore[index]
    assert ("draft model (D)", DRAFT) in view.legend_items()


def test_draft_segment_is_drawn_apart_from_the_weights() -> None:
    """The draft's segment has the device colour with a pattern: two colours where the weights have
    one (``kind_overlay``)."""
    from PySide6.QtGui import QImage, QPainter

    from offload_planner.ui.palette import GPU_COLORS, kind_brush, kind_overlay

    img = QImage(40, 20, QImage.Format.Format_RGB32)
    img.fill(QColor("#FFFFFF"))
    p = QPainter(img)
    p.fillRect(0, 0, 20, 20, kind_brush(GPU_COLORS[0], "model"))
    p.fillRect(20, 0, 20, 20, kind_brush(GPU_COLORS[0], DRAFT))
    overlay = kind_overlay(DRAFT)
    assert overlay is not None
    p.fillRect(20, 0, 20, 20, overlay)
    p.end()
    weights = {img.pixel(QPoint(x, y)) for x in range(20) for y in range(20)}
    draft = {img.pixel(QPoint(x, y)) for x in range(20, 40) for y in range(20)}
    assert len(weights) == 1 and len(draft) >= 2 and not weights & draft


def test_mtp_context_is_named_in_the_bars(qtbot: QtBot, window: MainWindow,
                                         small_models: dict[str, Path]) -> None:
    open_and_wait(qtbot, window, small_models["deepseek2-mtp"])
    assert window.command_pane.apply_command_text(
        "llama-server -m m.gguf -c 2048 -ngl 99 --spec-type draft-mtp")
    wait_projected(qtbot, window)
    view = window.memory_view
    window.h_split.setSizes([200, 200, 880])
    qtbot.waitUntil(lambda: view.width() > 800)
    on_gpu = _extra_bytes(window, MTP, "CUDA0")
    assert on_gpu > 0
    assert f"MTP context {gib(on_gpu)}" in view.breakdown(0)[0]  # type: ignore[index]
    assert ("MTP context", MTP) in view.legend_items()


def test_tooltip_names_the_draft_apart_from_the_weights() -> None:
    from offload_planner.core.devices import Device, DeviceKind

    dev = Device("CUDA0", DeviceKind.CUDA, 8 << 30, 8 << 30)
    dm = DeviceMemory(dev, [Buffer("CUDA0", "CUDA0", "model", 1 << 30, "weights"),
                            Buffer("CUDA0", "CUDA0", "model", 1 << 29, "draft weights", owner=DRAFT)])
    tip = device_tooltip(dm)
    assert "weights 1.0 GiB" in tip and "draft model 0.5 GiB" in tip


def test_launch_table_says_how_much_of_a_row_is_the_draft(qtbot: QtBot, window: MainWindow,
                                                          small_models: dict[str, Path]) -> None:
    """llama.cpp's log and the Launch table count the draft in the rows of its kind: the note column
    says how much of each row is the draft model's, left-aligned beside the figures."""
    open_and_wait(qtbot, window, small_models["llama"])
    draft = small_models["llama-draft"]
    assert window.command_pane.apply_command_text(
        f"llama-server -m m.gguf -c 2048 -ngl 99 -md {draft} -ngld 99")
    wait_projected(qtbot, window)
    proj = window.doc.analysis.projection  # type: ignore[union-attr]
    extra = next(e for e in proj.extras if e.key == DRAFT)
    t = window.launcher.table
    qtbot.waitUntil(lambda: t.rowCount() > 0)
    note_col = t.columnCount() - 1
    rows = {(t.item(r, 0).text(), t.item(r, 2).text()): t.item(r, note_col) for r in range(t.rowCount())
            if t.item(r, 1).text() == "CUDA0"}
    for kind in ("model", "kv", "compute"):
        mib = extra.by_device(kind)["CUDA0"] / 2**20
        assert rows[("CUDA0", kind)].text() == f"incl. draft model {mib:.2f}", kind
    assert not rows[("CUDA0", "model")].textAlignment() & Qt.AlignmentFlag.AlignRight.value
