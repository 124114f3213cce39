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
             "fewer times (84% of a prompt; the Speed tab plots it). Also: the CPU's experts are copied to "
             "the GPU from the mmap'd file, at half the rate of pinned memory: unchecking “mmap the model” "
             "(Options) pins them.")


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


def test_unchecking_mmap_does_what_the_line_says(qtbot: QtBot, settings: Settings, demo_path: Path) -> None:
    win = _demo_window(qtbot, settings, (1280, 800))
    try:
        open_and_wait(qtbot, win, demo_path)
        assert _faster(qtbot, win) == DEMO_HINT and "pp 14.0 t/s" in win.speed_label.text()
        win.options_panel.mmap.click()  # “mmap the model” off: -lm none
        wait_projected(qtbot, win)
        text = _faster(qtbot, win)
        assert text.startswith(DEMO_HINT.split(" fewer times (")[0]) and " Also: " not in text
        assert "pp 24.1 t/s" in win.speed_label.text()  # the copies at the pinned rate
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
        assert text.startswith("Faster, with Presets ▸ Fastest plan: a larger µbatch -ub (now 512) ")
        # what Fastest plan does not do comes after "Also:", the always-active weights first
        assert (". Also: 4.8 GiB of always-active weights (attention, shared experts: every token reads "
                "them) are on the CPU, where routed experts cost less (GPU layers: all, then Presets ▸ All "
                "routed experts → CPU); CUDA0's ") in text
        # Fastest plan keeps -ngl and the moves: the room's action is the Fill preset
        assert ("can take routed experts, now read from RAM (85% of a token) — Presets ▸ Fill CUDA0 with "
                "routed experts (whole layers) or drag expert tensors onto it (Fastest plan keeps the moves "
                "and -ot rules that hold them on the CPU); ") in text
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


def test_ram_over_beside_gpu_room_points_at_the_room(qtbot: QtBot, settings: Settings) -> None:
    """All routed experts → CPU on a 16 GiB CPU beside a 24 GiB GPU: "What next" said "more GPU memory
    takes some (+ Virtual GPU… plans with one)" with 19 GiB of the GPU free."""
    qwen = Path(__file__).resolve().parents[2] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf"
    win = make_window(qtbot, settings, system_info("CUDA0=24GiB", cpu_gib=16))
    try:
        open_and_wait(qtbot, win, qwen)
        assert win.presets_menu.routed_experts_to(CPU)
        wait_projected(qtbot, win)
        win.memory_view.repaint()
        assert win.memory_view.next_step() == (
            "What next: The CPU's share is more than its RAM, and CUDA0's 19.0 GiB left can take routed "
            "experts from it: Presets ▸ Fill CUDA0 with routed experts (whole layers) or drag expert tensors "
            "onto it (Fastest plan keeps the moves and -ot rules that hold them on the CPU).")
        # the Problems tab's line says it too: a short pane draws no What next (1024x640, three devices)
        severity, line = win.problems.problems()[0]
        assert severity == "error" and line.startswith("CPU is over capacity by ")
        assert line.endswith("): CUDA0's 19.0 GiB left can take routed experts from it: Presets ▸ Fill "
                             "CUDA0 with routed experts (whole layers) or drag expert tensors onto it "
                             "(Fastest plan keeps the moves and -ot rules that hold them on the CPU)")
        assert win.presets_menu.fill("CUDA0", from_first=True)
        wait_projected(qtbot, win)
        assert win.memory_view.verdict() == "✔ fits on every device"  # what it pointed at works
        # the same RAM over from a pasted --cpu-moe: no moves hold the experts, Fastest plan moves them
        assert win.command_pane.apply_command_text("llama-server -m x.gguf -c 32768 --cpu-moe")
        wait_projected(qtbot, win)
        assert not win.doc.plan.moves
        assert win.memory_view.next_step() == (
            "What next: The CPU's share is more than its RAM, and CUDA0's 19.0 GiB left can take routed "
            "experts from it: Presets ▸ Fastest plan moves them there.")
        assert win.problems.problems()[0][1].endswith(
            "): CUDA0's 19.0 GiB left can take routed experts from it: Presets ▸ Fastest plan moves them "
            "there")
        assert win.presets_menu.fastest()
        wait_projected(qtbot, win)
        assert win.memory_view.verdict() == "✔ fits on every device"
    finally:
        win.close()


def test_a_dense_model_is_not_sent_to_fastest_plan(qtbot: QtBot, settings: Settings, tmp_path: Path) -> None:
    """Fastest plan places routed experts (it is greyed out for a dense model): the line spoke of it, and
    of the CPU's "experts", to a Llama-3.1-70B with 40 layers on a 24 GiB card."""
    from offload_planner.core.synth import BIG_MODELS, write_model

    [llama] = write_model(BIG_MODELS["Llama-3.1-70B-Q4_K_M"], tmp_path / "llama.gguf", header_only=True)
    win = make_window(qtbot, settings, system_info("CUDA0=rtx3090", cpu_gib=128))
    try:
        open_and_wait(qtbot, win, llama)
        assert win.command_pane.apply_command_text("llama-server -m x.gguf -c 8192 -ngl 40")
        wait_projected(qtbot, win)
        text = _faster(qtbot, win)
        assert text.startswith("Faster: a larger µbatch -ub (now 512) copies the CPU's weights to the GPU "
                               "fewer times ("), text
        assert "Fastest plan" not in text and "experts" not in text
    finally:
        win.close()
