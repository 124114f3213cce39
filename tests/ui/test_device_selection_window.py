"""The window says what a ``-dev`` selection leaves out (devsel modelled the selection; the note that
explains why a declared GPU holds nothing was printed by ``plan`` only: the window shows no command
notes, so a GPU sat empty in the map with nothing in Problems to say why)."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import make_window, open_and_wait, wait_projected

from offload_planner.core.devices import parse_device_decl
from offload_planner.ui.main_window import SystemInfo
from offload_planner.ui.settings import Settings

RES = Path(__file__).resolve().parents[2] / "resources"


def test_problems_say_which_gpu_the_selection_leaves_empty(qtbot: QtBot, tmp_path: Path) -> None:
    win = make_window(qtbot, Settings.at(str(tmp_path / "s.ini")),
                      SystemInfo.probe([parse_device_decl("CUDA0=24GiB"), parse_device_decl("CUDA1=24GiB")]))
    open_and_wait(qtbot, win, RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
    assert win.command_pane.apply_command_text("llama-server -m x.gguf -c 4096 -ngl 99 -dev CUDA1")
    wait_projected(qtbot, win)
    notes = [text for kind, text in win.problems.problems() if kind == "note"]
    said = [n for n in notes if n.startswith("-dev CUDA1:")]
    assert said == ["-dev CUDA1: llama-server uses CUDA1 only; CUDA0 holds nothing of the model"], notes
    cuda0 = next(d for d in win.doc.analysis.projection.devices if d.device.name == "CUDA0")
    assert sum(b.bytes for b in cuda0.buffers) == 0
    assert win.command_pane.apply_command_text("llama-server -m x.gguf -c 4096 -ngl 99")
    wait_projected(qtbot, win)
    assert not [t for _, t in win.problems.problems() if t.startswith("-dev")]


def test_problems_say_which_dev_name_ik_skips(qtbot: QtBot, tmp_path: Path) -> None:
    """ik skips a ``-dev`` name it has no device of ("cuda0 backend not available.", src/llama.cpp
    7821-7828 at 8337e4cd) where the pinned build refuses it: a pasted ik command is read, and Problems
    say what ik logs and skips (tests/core/test_ik_unknown_dev.py)."""
    win = make_window(qtbot, Settings.at(str(tmp_path / "s.ini")),
                      SystemInfo.probe([parse_device_decl("CUDA0=24GiB"), parse_device_decl("CUDA1=24GiB")]))
    open_and_wait(qtbot, win, RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
    win.doc.set_dialect("ik_llama.cpp", "ik_llama.cpp")
    assert win.command_pane.apply_command_text("llama-server -m x.gguf -c 4096 -ngl 99 -dev CUDA1,cuda0")
    wait_projected(qtbot, win)
    notes = [text for kind, text in win.problems.problems() if kind == "note"]
    said = 'pasted command: -dev CUDA1,cuda0: ik_llama.cpp logs "cuda0 backend not available." and skips it'
    assert [n for n in notes if n.startswith(said)], notes
    assert not [n for n in notes if "refuse" in n], notes
    assert win.doc.plan.placement_options.selected == ("CUDA1",)


def test_problems_say_devd_without_a_draft_is_ignored(qtbot: QtBot, tmp_path: Path) -> None:
    """``-devd`` with no ``-md``: llama-server checks the names and never reads them (the draft's devices
    are taken only when a draft loads); a pasted command says so once, and not with a draft model."""
    win = make_window(qtbot, Settings.at(str(tmp_path / "s.ini")),
                      SystemInfo.probe([parse_device_decl("CUDA0=24GiB"), parse_device_decl("CUDA1=24GiB")]))
    open_and_wait(qtbot, win, RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
    assert win.command_pane.apply_command_text("llama-server -m x.gguf -c 4096 -ngl 99 -devd CUDA1")
    wait_projected(qtbot, win)
    notes = [text for kind, text in win.problems.problems() if kind == "note" and "-devd" in text]
    assert notes == ["pasted command: -devd CUDA1 is ignored: the command has no draft model (-md), and "
                     "llama-server reads the draft's devices only when it loads one"], notes


def test_problems_say_an_ik_draft_params_model_is_the_draft_projected(
    qtbot: QtBot, tmp_path: Path, small_models: dict[str, Path]
) -> None:
    """ik's ``-draft "-m FILE"`` loads FILE as the draft model; the plan projects it (it projected none,
    and said so): a pasted command says where the draft comes from."""
    win = make_window(qtbot, Settings.at(str(tmp_path / "s.ini")),
                      SystemInfo.probe([parse_device_decl("CUDA0=24GiB"), parse_device_decl("CUDA1=24GiB")]))
    open_and_wait(qtbot, win, RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
    win.doc.set_dialect("ik_llama.cpp", "ik_llama.cpp")
    d = small_models["llama-draft"]
    assert win.command_pane.apply_command_text(
        f"llama-server -m x.gguf -c 4096 -ngl 99 --spec-type draft -draft '-m {d}'")
    wait_projected(qtbot, win)
    notes = [text for kind, text in win.problems.problems() if kind == "note" and "ik loads" in text]
    assert notes == [f'pasted command: -draft "-m {d}": ik loads {d} as the draft model (the -m inside '
                     "-draft wins over -md); the plan projects it"], notes
    spec = win.doc.plan.spec
    assert spec is not None and spec.draft is not None and spec.draft.model.path == str(d)


def test_a_gpu_named_twice_is_two_devices_then_refused_after_switching_to_ik(qtbot: QtBot,
                                                                              tmp_path: Path) -> None:
    """The pinned build takes ``-dev CUDA0,CUDA0`` as two model devices (a note says what that does);
    switched to ik_llama.cpp, which would free the one backend twice, the plan says it is not planned
    (the note of the pinned build's behaviour went with it; it stayed before)."""
    win = make_window(qtbot, Settings.at(str(tmp_path / "s.ini")),
                      SystemInfo.probe([parse_device_decl("CUDA0=24GiB"), parse_device_decl("CUDA1=24GiB")]))
    open_and_wait(qtbot, win, RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf")
    assert win.command_pane.apply_command_text(
        "llama-server -m x.gguf -c 4096 -ngl 99 -dev CUDA0,CUDA0 -fit off")
    wait_projected(qtbot, win)

    def said() -> list[tuple[str, str]]:
        return [(kind, text) for kind, text in win.problems.problems()
                if "CUDA0 2 times" in text or "twice" in text]

    [(kind, text)] = said()
    assert kind == "note" and text.startswith("-dev CUDA0,CUDA0: llama.cpp takes CUDA0 2 times"), text
    win.doc.set_dialect("ik_llama.cpp", "ik_llama.cpp")
    wait_projected(qtbot, win)
    [(kind, text)] = said()
    assert kind != "note", (kind, text)
    assert text.startswith("-dev CUDA0,CUDA0 names CUDA0 twice: ik_llama.cpp"), text
    assert "double free" in text
