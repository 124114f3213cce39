"""A draft model's (-md) and a projector's (--mmproj) rows in the tensor map are set apart from the
main model's: a tint of their own, a rule above their first row, italic row headers, a legend entry
each, and row-header tooltips that say which file they come from and what a click does there."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QColor, QFont, QImage
from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.core.synth.mmproj import SMALL_MMPROJ, write_mmproj
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.palette import SECTION_RULE_COLOR, section_tint
from offload_planner.ui.settings import Settings


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mmproj(SMALL_MMPROJ["gemma3"], tmp_path_factory.mktemp("sections") / "mmproj-g3.gguf")


@pytest.fixture
def two_gpus(qtbot: QtBot, settings: Settings) -> MainWindow:
    return make_window(qtbot, settings, system_info("CUDA0=24GiB", "CUDA1=24GiB"))


def _open(qtbot: QtBot, win: MainWindow, small_models: dict[str, Path], mmproj: Path) -> None:
    open_and_wait(qtbot, win, small_models["gemma3"])
    draft = small_models["llama-draft"]
    assert win.command_pane.apply_command_text(
        f"llama-server -m m.gguf -c 2048 -ngl 99 --mmproj {mmproj} -md {draft}")
    wait_projected(qtbot, win)


def _row(win: MainWindow, label: str) -> int:
    m = win.map_view.model()
    return next(r for r in range(m.rowCount()) if m.headerData(r, Qt.Orientation.Vertical) == label)


def test_row_headers_name_the_draft_and_the_projector(
    qtbot: QtBot, two_gpus: MainWindow, small_models: dict[str, Path], mmproj: Path
) -> None:
    _open(qtbot, two_gpus, small_models, mmproj)
    m = two_gpus.map_view.model()
    v = Qt.Orientation.Vertical

    def tip(label: str) -> str:
        return str(m.headerData(_row(two_gpus, label), v, Qt.ItemDataRole.ToolTipRole))

    assert tip("mm 0").startswith("<b>Multimodal projector</b> mmproj-g3.gguf (--mmproj): vision block 0: ")
    assert "select the whole layer" not in tip("mm 0")  # nothing there moves one by one
    assert "--no-mmproj-offload" in tip("mm out")
    assert "final norm and projection" in tip("mm out")
    assert tip("draft 1").startswith(
        "<b>Draft model</b> llama-draft.gguf (-md), speculative decoding: layer 1: ")
    assert "-otd" in tip("draft 1")
    assert tip("1").startswith("layer 1: ") and "Draft" not in tip("1")
    bg = {label: m.headerData(_row(two_gpus, label), v, Qt.ItemDataRole.BackgroundRole)
          for label in ("1", "mm 0", "draft 0")}
    assert bg["1"] is None
    assert bg["mm 0"] == section_tint("mmproj") and bg["draft 0"] == section_tint("draft")
    assert bg["mm 0"] != bg["draft 0"]
    font = m.headerData(_row(two_gpus, "draft 0"), v, Qt.ItemDataRole.FontRole)
    assert isinstance(font, QFont) and font.italic()
    assert m.headerData(_row(two_gpus, "0"), v, Qt.ItemDataRole.FontRole) is None


def _pixel(img: QImage, x: int, y: int) -> QColor:
    dpr = img.devicePixelRatio()
    return QColor(img.pixel(QPoint(int(x * dpr), int(y * dpr))))


def _near(a: QColor, b: QColor) -> bool:
    return max(abs(a.red() - b.red()), abs(a.green() - b.green()), abs(a.blue() - b.blue())) <= 2


def test_sections_are_drawn_apart(
    qtbot: QtBot, two_gpus: MainWindow, small_models: dict[str, Path], mmproj: Path
) -> None:
    _open(qtbot, two_gpus, small_models, mmproj)
    view = two_gpus.map_view
    m = view.model()
    img = view.viewport().grab().toImage()
    last_col = m.columnCount() - 1
    grid = two_gpus.doc.grid
    assert grid is not None
    empty_col = next(c for c in range(m.columnCount())  # empty in layer 1, draft 0 and mm 0
                     if not any(grid.cell(_row(two_gpus, r), c).items for r in ("1", "draft 0", "mm 0")))
    for label, section in (("mm in", "mmproj"), ("draft embd", "draft")):
        r = view.visualRect(m.index(_row(two_gpus, label), last_col))
        assert _pixel(img, r.center().x(), r.top()) == SECTION_RULE_COLOR, label  # the rule above
        r1 = view.visualRect(m.index(_row(two_gpus, label) + 1, empty_col))
        inside = _pixel(img, r1.center().x(), r1.center().y())
        assert _near(inside, section_tint(section)) or _near(inside, section_tint(section).darker(104)), (
            label, inside.name())
    main = view.visualRect(m.index(_row(two_gpus, "1"), empty_col))
    assert _pixel(img, main.center().x(), main.top()) != SECTION_RULE_COLOR
    plain = _pixel(img, main.center().x(), main.center().y())
    assert not any(_near(plain, section_tint(k)) for k in ("draft", "mmproj"))


def test_legend_names_the_sections_and_wraps(
    qtbot: QtBot, two_gpus: MainWindow, small_models: dict[str, Path], mmproj: Path
) -> None:
    open_and_wait(qtbot, two_gpus, small_models["gemma3"])
    legend = two_gpus.legend
    assert not any(k.startswith("section:") for k, _ in legend.entries())
    one_line = legend.height()
    _open(qtbot, two_gpus, small_models, mmproj)
    assert [k for k, _ in legend.entries() if k.startswith("section:")] == ["section:mmproj", "section:draft"]
    boxes = legend.layout_entries(legend.width())
    assert all(b.right() <= legend.width() for _k, _l, b in boxes)  # nothing cut off at the right
    assert max(b.bottom() for _k, _l, b in boxes) <= legend.height()
    assert legend.height() > one_line  # wrapped to a second line at 1280x800
