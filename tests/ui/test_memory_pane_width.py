"""A draft model and a projector add segments to every memory bar's breakdown line; at 1280x800 the
Memory pane stays as narrow as it opens (its status goes on a line of its own under the breakdown)
instead of widening to one long line and squeezing the tensor map until its last column is cut off
behind a horizontal scroll bar."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import open_and_wait, wait_projected

from offload_planner.core.synth.mmproj import SMALL_MMPROJ, write_mmproj
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.memory_view import BREAKDOWN_FORMS


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mmproj(SMALL_MMPROJ["gemma3"], tmp_path_factory.mktemp("pane") / "mmproj-g3.gguf")


def _columns_shown(window: MainWindow) -> tuple[int, int]:
    """(columns wholly inside the map's viewport, columns of the map)."""
    view = window.map_view
    hh = view.horizontalHeader()
    width = view.viewport().width()
    n = view.model().columnCount()
    inside = sum(1 for c in range(n) if hh.sectionViewportPosition(c) + hh.sectionSize(c) <= width)
    return inside, n


def test_draft_and_projector_do_not_squeeze_the_tensor_map(
    qtbot: QtBot, window: MainWindow, demo_path: Path, small_models: dict[str, Path], mmproj: Path
) -> None:
    open_and_wait(qtbot, window, demo_path)
    view = window.memory_view
    width_before = view.width()
    map_before = (window.map_view.width(), window.map_view.height())
    assert not view.status_wrapped()  # the demo's breakdowns fit beside their status
    draft = small_models["llama-draft"]
    assert window.command_pane.apply_command_text(
        f"llama-server -m m.gguf -c 8192 -ngl 999 -md {draft} --mmproj {mmproj}")
    wait_projected(qtbot, window)
    qtbot.wait(50)
    assert (window.width(), window.height()) == (1280, 800)
    # -ngl 999 on the 24 GiB GPU: "+354.2 GiB over" beside "W 376.2 KV 0.5 C 0.4 P 3 MiB D 18 MiB"
    # did not fit in the pane: the pane grew by 90 px and the map's "other" column was cut off
    assert view.width() == width_before
    assert window.map_view.width() == map_before[0]
    assert window.map_view.height() >= 400
    assert not window.map_view.horizontalScrollBar().isVisible()
    inside, n = _columns_shown(window)
    assert inside == n, f"{n - inside} tensor-map columns cut off"
    # every row still reads whole: the breakdown unelided, the status on its own line under it
    assert view.status_wrapped()
    lines = view._breakdown_lines()
    fm = view.fontMetrics()
    for line in lines:
        assert line.form < len(BREAKDOWN_FORMS), line.text
        assert fm.horizontalAdvance(line.text) <= line.text_rect.width()
        assert line.status_rect.top() >= line.text_rect.bottom()  # under it, not over it
        assert line.status_rect.left() >= 0 and line.status_rect.right() <= view.width()
    assert any(line.status.endswith(" over") for line in lines)
    words = [f" {line.text} " for line in lines]
    assert any(" D " in w for w in words) and any(" P " in w for w in words)
    # the rows grew by the status line and the last one (and the legend) are still in the view
    assert view.bar_rect(len(lines) - 1).bottom() + 3 * fm.height() < view.height()
