"""While every device fits, the Memory pane says under its legend what would make the plan faster, in
the window's own controls (core.speed.advice through memory_view.faster_text). The demo opened with
"fits on every device" and a speed line naming the CPU's 66% of a token, and nothing said that the GPU's
8.5 GiB left take routed experts or that a larger µbatch copies the experts fewer times a prompt, nor
that Presets ▸ Fastest plan does both (+379% pp on the demo)."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot
from tests.ui.conftest import system_info
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.core.devices import parse_device_decl
from offload_planner.core.placement import CPU
from offload_planner.ui.main_window import MainWindow, SystemInfo
from offload_planner.ui.settings import Settings

DEMO_HINT = ("Faster, with Presets ▸ Fastest plan: CUDA0's 8.5 GiB left can take routed experts, now read "
             "from RAM (66% of a token); a larger µbatch -ub (now 512) copies the CPU's experts to the GPU "
             "fewer times (84% of a prompt; the Speed tab plots it).")


def _demo_window(qtbot: QtBot, settings: Settings, size: tuple[int, int]) -> MainWindow:
    """The demo as it opens: its declared hardware (SystemInfo.probe without declarations)."""
    win = MainWindow(settings, SystemInfo.probe([]))
    win.confirm_close = False
    qtbot.addWidget(win)
    win.resize(*size)
    win.show()
    qtbot.waitExposed(win)
    return win


def _faster(qtbot: QtBot, win: MainWindow) -> str:
    qtbot.waitUntil(lambda: "est. tg" in win.speed_label.text())
    qtbot.wait(20)  # the speed line's coalesced refresh
    win.memory_view.repaint()
    return win.memory_view.next_step()


def test_the_demo_says_what_makes_it_faster_and_fastest_plan_answers_it(
    qtbot: QtBot, settings: Settings, demo_path: Path
) -> None:
    win = _demo_window(qtbot, settings, (1280, 800))
    try:
        open_and_wait(qtbot, win, demo_path)
        assert win.memory_view.verdict() == "✔ fits on every device"
        assert _faster(qtbot, win) == DEMO_HINT
        view = win.memory_view
        assert view.next_step_shown() == DEMO_HINT  # drawn whole at 1280x800, under the legend
        r = view.next_step_rect()
        assert r is not None and r.bottom() <= view.height()
        assert win.presets_menu.fastest()
        wait_projected(qtbot, win)
        assert _faster(qtbot, win) == ""  # -ub 4096 = the prompt, layer 3's experts on the GPU: done
    finally:
        win.close()


def test_a_small_window_leads_with_the_action(qtbot: QtBot, settings: Settings, demo_path: Path) -> None:
    """At 1024x640 two lines show: the preset that does it comes first; hovering gives it whole."""
    win = _demo_window(qtbot, settings, (1024, 640))
    try:
        open_and_wait(qtbot, win, demo_path)
        assert _faster(qtbot, win) == DEMO_HINT
        shown = win.memory_view.next_step_shown()
        assert shown.startswith("Faster, with Presets ▸ Fastest plan: CUDA0's 8.5 GiB left")
        assert shown.endswith("…")
    finally:
        win.close()


def test_always_active_weights_on_the_cpu_come_first(
    qtbot: QtBot, settings: Settings, demo_path: Path
) -> None:
    """GPU layers 30 of 62 with the experts on the CPU: the attention and shared experts of the other
    layers are read from RAM by every token."""
    win = make_window(qtbot, settings, SystemInfo(system_info().cpu, system_info().detection,
                                                  [parse_device_decl("CUDA0=24GiB"),
                                                   parse_device_decl("CPU=512GiB,ram=8xDDR5-4800")]))
    try:
        open_and_wait(qtbot, win, demo_path)
        experts = [t.name for t in win.doc.plan.model.tensors if t.role.is_routed_expert]
        win.doc.apply_preset(dict.fromkeys(experts, CPU), "experts to CPU")
        wait_projected(qtbot, win)
        win.options_panel.ngl.setValue(30)  # Options ▸ GPU layers
        wait_projected(qtbot, win)
        text = _faster(qtbot, win)
        assert text.startswith("Faster, with Presets ▸ Fastest plan: 4.8 GiB of always-active weights "
                               "(attention, shared experts: every token reads them) are on the CPU, where "
                               "routed experts cost less (GPU layers: all, then Presets ▸ All routed experts "
                               "→ CPU); CUDA0's ")
    finally:
        win.close()


def test_the_line_stays_while_an_edit_is_projected(qtbot: QtBot, settings: Settings, demo_path: Path) -> None:
    """The speed line refreshes on the edit, before its projection: the Faster line was emptied then and
    came back with the projection, a flicker at every edit."""
    win = _demo_window(qtbot, settings, (1280, 800))
    try:
        open_and_wait(qtbot, win, demo_path)
        assert _faster(qtbot, win) == DEMO_HINT
        said: list[str] = []
        win.speed_label.fasterChanged.connect(said.append)
        win.doc.set_option("context.n_ctx", 16384, "Context")
        wait_projected(qtbot, win)
        qtbot.waitUntil(lambda: len(said) >= 2)  # on the edit, then with its projection
        assert "" not in said and said[-1].startswith("Faster, with Presets ▸ Fastest plan: CUDA0's ")
    finally:
        win.close()
