"""The summary line over the window names what the command loads beside the model (a draft model, the
MTP context, a projector), and a line too long for the window is elided with the whole of it in the
tooltip instead of being cut off at the window's edge."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot
from tests.ui.window_helpers import open_and_wait, wait_projected

from offload_planner.core.synth.mmproj import SMALL_MMPROJ, write_mmproj
from offload_planner.ui.main_window import MainWindow


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mmproj(SMALL_MMPROJ["gemma3"], tmp_path_factory.mktemp("summary") / "mmproj-g3.gguf")


def test_summary_names_the_draft_and_the_projector(qtbot: QtBot, window: MainWindow,
                                                   small_models: dict[str, Path], mmproj: Path) -> None:
    open_and_wait(qtbot, window, small_models["gemma3"])
    label = window.summary
    assert "draft" not in label.full_text
    draft = small_models["llama-draft"]
    assert window.command_pane.apply_command_text(
        f"llama-server -m m.gguf -c 2048 -ngl 99 -md {draft} --mmproj {mmproj}")
    wait_projected(qtbot, window)
    assert "+ draft model synth-llama-draft (" in label.full_text
    assert label.full_text.endswith("+ projector mmproj-g3.gguf")
    assert label.text() == label.full_text  # it fits at 1280 px


def test_a_long_summary_is_elided_not_cut(qtbot: QtBot, window: MainWindow, demo_path: Path,
                                          small_models: dict[str, Path], mmproj: Path) -> None:
    open_and_wait(qtbot, window, demo_path)
    draft = small_models["llama-draft"]
    assert window.command_pane.apply_command_text(
        f"llama-server -m m.gguf -c 2048 -ngl 99 -md {draft} --mmproj {mmproj}")
    wait_projected(qtbot, window)
    label = window.summary
    assert window.width() == 1280
    assert label.full_text.endswith("+ projector mmproj-g3.gguf")
    assert label.text().endswith("…") and label.fontMetrics().horizontalAdvance(label.text()) <= label.width()
    assert label.full_text in label.toolTip() and str(demo_path.name) in label.toolTip()


def test_summary_says_a_draft_drafts_with_its_mtp_head(qtbot: QtBot, window: MainWindow,
                                                      small_models: dict[str, Path]) -> None:
    """A ``-md`` file with an MTP head and no --spec-type: the server drafts with that head (draft-mtp,
    inferred from the file), not with an MTP context of the main model."""
    open_and_wait(qtbot, window, small_models["deepseek2"])
    draft = small_models["deepseek2-mtp"]
    assert window.command_pane.apply_command_text(f"llama-server -m m.gguf -c 2048 -md {draft}")
    wait_projected(qtbot, window)
    text = window.summary.full_text
    assert "+ draft model synth-deepseek2-mtp (" in text and "), drafting with its MTP head" in text
    assert "+ MTP" not in text
