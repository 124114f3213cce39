"""The Options labels explain their flags on hover, as their fields do ("µbatch -ub" and "Slots -np"
had no tooltip of their own), in words a newcomer reads: what -ub trades and where to see it."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFormLayout, QLabel
from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import open_and_wait

from offload_planner.ui.main_window import MainWindow


def _labels(form: QFormLayout) -> dict[str, QLabel]:
    out = {}
    for row in range(form.rowCount()):
        item = form.itemAt(row, QFormLayout.ItemRole.LabelRole)
        if item is not None and isinstance(item.widget(), QLabel):
            label = item.widget()
            assert isinstance(label, QLabel)
            out[label.text()] = label
    return out


def test_every_options_label_has_its_fields_tooltip(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    open_and_wait(qtbot, window, demo_path)
    o = window.options_panel
    labels = _labels(o._form)
    fields = {"Context": o.ctx, "Batch -b": o.batch, "µbatch -ub": o.ubatch, "GPU layers": o.ngl,
              "KV cache K": o.type_k, "Slots -np": o.slots, "MLA -mla": o.mla}
    assert set(fields) <= set(labels), sorted(labels)
    for text, field in fields.items():
        assert field.toolTip() and labels[text].toolTip() == field.toolTip(), text
    ub = labels["µbatch -ub"].toolTip()
    assert "micro-batch" in ub and "GPU memory" in ub and "Speed tab" in ub
    assert "requests" in labels["Slots -np"].toolTip()
    v_label = next(w for w in o.findChildren(QLabel) if w.text() == "V")
    assert v_label.toolTip() == o.type_v.toolTip() and "V cache" in v_label.toolTip()


def test_toolbar_and_launch_buttons_say_what_they_do(qtbot: QtBot, window: MainWindow) -> None:
    p = window.launcher
    buttons = (window.presets_button, p.launch_button, p.stop_button, p.open_button, p.bench_button)
    for b in buttons:
        assert b.toolTip(), b.text()
    assert "fastest plan" in window.presets_button.toolTip()
    assert not p.open_button.isEnabled() and "running" in p.open_button.toolTip()  # why it is off


def test_speed_line_tooltip_spells_out_its_abbreviations(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    open_and_wait(qtbot, window, demo_path)
    label = window.speed_label
    qtbot.waitUntil(lambda: "tg" in label.text())
    tip = label.toolTip()
    for words in ("token generation", "prompt processing", "tokens per second", "time per token"):
        assert words in tip, words
