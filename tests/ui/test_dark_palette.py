"""On a dark palette (a desktop's dark theme) the window's red and amber texts still read: the Problems
tab's errors, the Launch tab's problems and notes, the Memory pane's verdict and "over" figures.  They
were fixed light-palette colours: #B00000 on a dark list's #1E1E1E has a contrast of 2.3, where text
needs 4.5 (WCAG AA) (newcomer7).  On the light palette they stay as they were."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QColor, QPalette
from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import open_and_wait

from offload_planner.ui.launcher_panel import FAILURE_COLOR
from offload_planner.ui.main_window import MainWindow
from offload_planner.ui.memory_view import OVER_COLOR
from offload_planner.ui.palette import READABLE, contrast
from offload_planner.ui.problems_pane import ERROR_COLOR

DARK = {
    QPalette.ColorRole.Window: "#2B2B2B", QPalette.ColorRole.WindowText: "#E0E0E0",
    QPalette.ColorRole.Base: "#1E1E1E", QPalette.ColorRole.AlternateBase: "#262626",
    QPalette.ColorRole.Text: "#E0E0E0", QPalette.ColorRole.Button: "#353535",
    QPalette.ColorRole.ButtonText: "#E0E0E0",
}


def _dark(win: MainWindow) -> None:
    pal = QPalette(win.palette())
    for role, color in DARK.items():
        pal.setColor(role, QColor(color))
    win.setPalette(pal)  # every child widget inherits it


def _color_of_css(css: str) -> QColor:
    assert css.startswith("color: "), css
    return QColor(css.removeprefix("color: "))


def _reads_on(color: QColor, *roles: QPalette.ColorRole, pal: QPalette) -> None:
    for role in roles:
        assert contrast(color, pal.color(role)) >= READABLE, (color.name(), pal.color(role).name())


def test_red_and_amber_texts_read_on_a_dark_palette(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    _dark(window)
    open_and_wait(qtbot, window, demo_path)  # -ngl 999 on one declared 24 GiB GPU: CUDA0 over capacity
    base, alternate = QPalette.ColorRole.Base, QPalette.ColorRole.AlternateBase
    problems = window.problems
    errors = [problems.item(i) for i in range(problems.count()) if "over capacity" in problems.item(i).text()]
    assert errors
    for item in errors:
        _reads_on(item.foreground().color(), base, alternate, pal=problems.palette())
    memory = window.memory_view
    _reads_on(memory.verdict_color(), base, pal=memory.palette())
    launcher = window.launcher
    assert launcher.virtual_note.isVisibleTo(launcher)  # CUDA0 is declared, not on this machine
    note = _color_of_css(launcher.virtual_note.styleSheet())
    _reads_on(note, QPalette.ColorRole.Window, pal=launcher.palette())
    assert not launcher.launch()  # the demo is header-only: a problem in red, no server started
    item = launcher.failures.item(0)
    assert "header-only" in item.text()
    _reads_on(item.foreground().color(), base, alternate, pal=launcher.failures.palette())


def test_the_light_palette_keeps_its_colours(qtbot: QtBot, window: MainWindow, demo_path: Path) -> None:
    light = QPalette(window.palette())
    for role, color in ((QPalette.ColorRole.Base, "#FFFFFF"), (QPalette.ColorRole.AlternateBase, "#F7F7F7")):
        light.setColor(role, QColor(color))
    window.setPalette(light)
    open_and_wait(qtbot, window, demo_path)
    problems = window.problems
    errors = [problems.item(i) for i in range(problems.count()) if "over capacity" in problems.item(i).text()]
    assert errors and all(item.foreground().color() == ERROR_COLOR for item in errors)
    assert window.memory_view.verdict_color() == OVER_COLOR
    assert not window.launcher.launch()
    assert window.launcher.failures.item(0).foreground().color() == FAILURE_COLOR


def test_the_margin_hatch_shows_on_a_dark_palette(qtbot: QtBot, window: MainWindow, demo_path: Path) -> None:
    """The margin's hatch in the bars and the legend was dark grey (60, 60, 60) whatever the background:
    on a dark palette (contrast 1.6 on #1E1E1E) it did not show."""
    from offload_planner.ui.memory_view import MARGIN_DARK

    _dark(window)
    open_and_wait(qtbot, window, demo_path)
    view = window.memory_view
    assert contrast(view.margin_color(), view.palette().color(QPalette.ColorRole.Base)) >= 3
    light = QPalette(window.palette())
    light.setColor(QPalette.ColorRole.Base, QColor("#FFFFFF"))
    window.setPalette(light)
    assert view.margin_color() == MARGIN_DARK  # the light palette's hatch as before
