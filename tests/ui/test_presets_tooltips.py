"""The Presets menu shows its actions' tooltips (what Fastest plan and --fit do, what the KV-cache
option allows): a QMenu hides them unless told, so the explanations written for them never appeared."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, QPoint
from PySide6.QtGui import QHelpEvent
from PySide6.QtWidgets import QApplication, QToolTip
from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import open_and_wait

from offload_planner.ui.main_window import MainWindow


def _hover_tip(qtbot: QtBot, window: MainWindow, text: str) -> str:
    menu = window.presets_menu
    action = next(a for a in menu.actions() if a.text() == text)
    QToolTip.hideText()
    qtbot.waitUntil(lambda: not QToolTip.isVisible())
    pos = menu.actionGeometry(action).center()
    QApplication.sendEvent(menu, QHelpEvent(QEvent.Type.ToolTip, pos, menu.mapToGlobal(pos)))
    qtbot.waitUntil(QToolTip.isVisible)
    return QToolTip.text()


def test_presets_menu_shows_what_each_preset_does(qtbot: QtBot, window: MainWindow, demo_path: Path) -> None:
    open_and_wait(qtbot, window, demo_path)
    menu = window.presets_menu
    menu.popup(window.mapToGlobal(QPoint(200, 100)))
    qtbot.waitUntil(menu.isVisible)
    try:
        assert _hover_tip(qtbot, window, "Fastest plan").startswith("Routed experts onto the GPUs")
        kv = _hover_tip(qtbot, window, "Fastest plan may quantize the KV cache (q8_0)")
        assert "q8_0" in kv and "flash attention" in kv
        assert "fits by default" in _hover_tip(qtbot, window, "What llama.cpp's --fit would run")
    finally:
        menu.hide()


def test_fastest_plan_on_a_dense_model_is_there_off_and_says_why(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    """On a dense model (Llama) the menu had no Fastest plan at all: a newcomer who read of it looked
    for it in vain. It is there, off, and its tooltip says what to use instead."""
    from offload_planner.core.synth import SMALL_MODELS, write_model

    model = write_model(SMALL_MODELS["llama"], tmp_path / "llama.gguf")[0]
    open_and_wait(qtbot, window, model)
    menu = window.presets_menu
    menu.popup(window.mapToGlobal(QPoint(200, 100)))
    qtbot.waitUntil(menu.isVisible)
    try:
        action = next(a for a in menu.actions() if a.text() == "Fastest plan")
        assert not action.isEnabled()
        tip = _hover_tip(qtbot, window, "Fastest plan")
        assert "this model is dense" in tip and "GPU layers (-ngl)" in tip
    finally:
        menu.hide()


def test_the_nkvo_option_names_its_options_checkbox(
    qtbot: QtBot, window: MainWindow, demo_path: Path
) -> None:
    """The -nkvo option's tooltip did not say which Options checkbox -nkvo is ("KV cache on the
    layer's GPU", unchecked), so a newcomer could not find the setting Fastest plan changes."""
    open_and_wait(qtbot, window, demo_path)
    menu = window.presets_menu
    menu.popup(window.mapToGlobal(QPoint(200, 100)))
    qtbot.waitUntil(menu.isVisible)
    try:
        tip = _hover_tip(qtbot, window, "Fastest plan may keep the KV cache in RAM (-nkvo)")
        box = window.options_panel.kv_offload.text()
        assert f'"{box}" off' in tip, tip
    finally:
        menu.hide()


def test_the_kv_cache_is_spelled_one_way(qtbot: QtBot, window: MainWindow, demo_path: Path) -> None:
    """The two Fastest-plan options said "KV cache" in one and "K/V cache" in the other (and in the
    -nkvo tooltip): one cache, llama.cpp's spelling "KV cache", in every text and tooltip of the menu."""
    open_and_wait(qtbot, window, demo_path)
    menu = window.presets_menu
    menu._build()
    texts = [t for a in menu.actions() for t in (a.text(), a.toolTip())]
    options = [a.text() for a in menu.actions() if a.isCheckable()]
    assert len(options) == 2 and all("the KV cache" in t for t in options), options
    assert not [t for t in texts if "K/V" in t]


def test_a_dense_model_has_no_expert_presets_to_click(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    """On a dense model "All routed experts → CPU" and "Fill CUDA0 with routed experts ..." were on and
    did nothing, saying "Routed experts are already there" (newcomer7). They are off now, saying why."""
    from offload_planner.core.synth import SMALL_MODELS, write_model

    open_and_wait(qtbot, window, write_model(SMALL_MODELS["llama"], tmp_path / "llama.gguf")[0])
    menu = window.presets_menu
    menu.popup(window.mapToGlobal(QPoint(200, 100)))
    qtbot.waitUntil(menu.isVisible)
    try:
        texts = ["All routed experts → CPU", "Fill CUDA0 with routed experts from layer 0",
                 "Fill CUDA0 with routed experts from the last layer"]
        actions = {a.text(): a for a in menu.actions()}
        for text in texts:
            assert not actions[text].isEnabled(), text
            tip = _hover_tip(qtbot, window, text)
            assert tip.startswith("No routed experts to move: this model is dense"), tip
        assert actions["Move layers…"].isEnabled()
    finally:
        menu.hide()
