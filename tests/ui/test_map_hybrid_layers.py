"""A hybrid model's rows in the tensor map say which layers keep a KV cache and which a recurrent state
(Qwen3-Next: every fourth layer attends, the others are gated delta nets)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait

from offload_planner.ui.settings import Settings


def test_row_tooltips_name_the_cache_of_a_hybrid_layer(
    qtbot: QtBot, settings: Settings, small_models: dict[str, Path]
) -> None:
    win = make_window(qtbot, settings, system_info("CUDA0=24GiB"))
    m = win.map_view.model()
    v = Qt.Orientation.Vertical

    def tip(layer: int) -> str:
        row = next(r for r in range(m.rowCount()) if m.headerData(r, v) == str(layer))
        return str(m.headerData(row, v, Qt.ItemDataRole.ToolTipRole))

    open_and_wait(qtbot, win, small_models["qwen3next"])
    assert "recurrent layer: no KV cache" in tip(0) and "recurrent state buffer (RS)" in tip(2)
    assert "attention layer: its KV cache" in tip(3) and "attention layer" in tip(7)
    open_and_wait(qtbot, win, small_models["qwen3moe"])  # not hybrid: no such line
    assert "KV cache" not in tip(0) and "recurrent" not in tip(0)
