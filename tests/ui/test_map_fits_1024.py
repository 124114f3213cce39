"""At the window's minimum size (1024x640) the tensor map shows every role column without sideways
scrolling: the side panes give way first, then the widest columns shrink to their short labels
("exp down" -> "down"), the full name staying in the header's tooltip; a wider window gives the
side panes their design widths back and the columns their whole labels."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QRect, Qt
from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import open_and_wait

from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.memory_view import BREAKDOWN_FORMS
from offload_planner.ui.role_header import RoleHeader, fitted_label, label_forms
from offload_planner.ui.tensor_map_view import squeezed_widths
from offload_planner.ui.window_size import PANE_DESIGN, pane_widths


def _hidden_columns(window: MainWindow) -> list[str]:
    """The role columns whose header section is not wholly inside the map's viewport."""
    view = window.map_view
    hh = view.horizontalHeader()
    port = QRect(0, 0, view.viewport().width(), hh.height())
    model = view.model()
    hidden = []
    for c in range(model.columnCount()):
        section = QRect(hh.sectionViewportPosition(c), 0, hh.sectionSize(c), hh.height())
        if hh.isSectionHidden(c) or not port.contains(section):
            hidden.append(str(model.headerData(c, Qt.Orientation.Horizontal)))
    return hidden


def test_1024x640_shows_every_role_column_without_sideways_scrolling(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    window.resize(1024, 640)
    open_and_wait(qtbot, window, demo_path)
    qtbot.wait(50)
    assert (window.width(), window.height()) == (1024, 640)
    view = window.map_view
    assert view.model().columnCount() == 9  # embd/out, attn, router, dense, shared, exp x3, norms
    assert view.horizontalScrollBar().maximum() == 0
    assert not view.horizontalScrollBar().isVisible()
    assert _hidden_columns(window) == []
    left, centre, right = window.h_split.sizes()
    assert centre > left and centre > right  # the map has priority
    lines = window.memory_view._breakdown_lines()  # the narrower Memory pane still reads whole
    assert lines and all(line.form < len(BREAKDOWN_FORMS) for line in lines)


def test_short_labels_at_1024_whole_labels_at_1280(qtbot: QtBot, window: MainWindow, demo_path: Path) -> None:
    window.resize(1024, 640)
    open_and_wait(qtbot, window, demo_path)
    qtbot.wait(50)
    view = window.map_view
    hh = view.horizontalHeader()
    assert isinstance(hh, RoleHeader)
    h = Qt.Orientation.Horizontal
    labels = [str(view.model().headerData(c, h)) for c in range(view.model().columnCount())]
    shown = [hh.shown_label(c) for c in range(len(labels))]
    assert all(s in label_forms(label) for s, label in zip(shown, labels, strict=True)), shown  # none elided
    assert shown != labels  # some columns use their short form at this width...
    for c, label in enumerate(labels):  # ...and the tooltip names the column whole
        assert f"<b>{label}</b>" in str(view.model().headerData(c, h, Qt.ItemDataRole.ToolTipRole))
    window.resize(1280, 800)
    qtbot.wait(50)
    assert window.h_split.sizes()[0] == PANE_DESIGN[0] and window.h_split.sizes()[2] == PANE_DESIGN[2]
    assert [hh.shown_label(c) for c in range(len(labels))] == labels
    assert _hidden_columns(window) == []


def test_panes_the_user_sized_stay_as_they_are(qtbot: QtBot, window: MainWindow, demo_path: Path) -> None:
    open_and_wait(qtbot, window, demo_path)
    split = window.h_split
    split.moveSplitter(320, 1)  # the user drags the left pane's handle
    qtbot.wait(20)
    left = split.sizes()[0]
    window.resize(1100, 700)
    qtbot.wait(50)
    assert split.sizes()[0] == left  # not re-fitted
    assert not split.user_state().isEmpty()


def test_squeezed_widths_cut_the_widest_first() -> None:
    need, least = [40, 60, 80, 100], [30, 30, 30, 30]
    assert squeezed_widths(need, least, 300) == [45, 65, 85, 105]  # room to spare: shared out
    w = squeezed_widths(need, least, 240)
    assert w == [40, 60, 70, 70]  # the two widest cut to a common width, the others whole
    assert squeezed_widths(need, least, 100) == least  # below the floor: the map scrolls


def test_pane_widths_give_the_map_priority() -> None:
    assert pane_widths(1260, 600, (250, 220)) == (270, 690, 300)  # room: the design widths
    left, centre, right = pane_widths(1000, 540, (250, 220))
    assert left + centre + right == 1000 and left >= 250 and right >= 220 and centre > 430
    assert pane_widths(1000, 900, (250, 220)) == (250, 530, 220)  # the sides at their minimums


def test_fitted_label_prefers_the_longest_form_that_fits(qtbot: QtBot, window: MainWindow) -> None:
    fm = window.map_view.horizontalHeader().fontMetrics()
    assert fitted_label("exp down", 1000, fm) == "exp down"
    assert fitted_label("exp down", fm.horizontalAdvance("down"), fm) == "down"
    assert fitted_label("exp down", 5, fm).endswith("…") or fitted_label("exp down", 5, fm) == ""
