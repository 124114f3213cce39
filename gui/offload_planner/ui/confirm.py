"""Questions the window asks before doing what a file asked for: fetching a URL named in a plan
file, launching a plan file's command. Window-modal and non-blocking: the action runs when the
user accepts, nothing happens otherwise."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QWidget

from offload_planner.core.arg_safety import Concern, masked
from offload_planner.core.cmdline import format_command
from offload_planner.core.printable import printable

FETCH_TITLE = "Fetch the model from the network?"
LAUNCH_TITLE = "Launch the command of a plan file?"


def ask(
    parent: QWidget, title: str, text: str, informative: str, yes: str, on_yes: Callable[[], None]
) -> QMessageBox:
    """Show the question; ``on_yes`` runs if the user presses ``yes``. Returns the open box."""
    box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.NoButton, parent)
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    box.setInformativeText(informative)
    accept = box.addButton(yes, QMessageBox.ButtonRole.AcceptRole)
    box.addButton(QMessageBox.StandardButton.Cancel)
    box.setDefaultButton(QMessageBox.StandardButton.Cancel)

    def done() -> None:
        if box.clickedButton() is accept:
            on_yes()

    box.finished.connect(done)
    box.setWindowModality(Qt.WindowModality.WindowModal)
    box.open()
    return box


def ask_fetch(parent: QWidget, plan_path: str, url: str, on_yes: Callable[[], None],
              what: str = "its model") -> QMessageBox:
    return ask(
        parent,
        FETCH_TITLE,
        f"The plan file {plan_path} reads {what} from the network:\n{url}",
        f"Only the {'model' if what == 'its model' else 'file'}'s header is downloaded. HF_TOKEN, if set, is "
        "sent only over https to huggingface.co or $HF_ENDPOINT. Open it only if you trust the file.",
        "Fetch",
        on_yes,
    )


def launch_text(argv: Sequence[str], concerns: Sequence[Concern]) -> str:
    """The whole command (secret values hidden) and the arguments to look at."""
    text = format_command(masked(argv), "bash")
    if concerns:
        text += "\n\nLook at these arguments:\n" + "\n".join(f"• {printable(c.line())}" for c in concerns)
    else:
        text += "\n\nNo argument exposes the server, writes files or reaches other machines."
    return text


def ask_launch(
    parent: QWidget, source: str, argv: Sequence[str], concerns: Sequence[Concern], on_yes: Callable[[], None]
) -> QMessageBox:
    return ask(
        parent,
        LAUNCH_TITLE,
        f"This plan was read from {source}. Its arguments go to llama-server as they are:",
        launch_text(argv, concerns),
        "Launch",
        on_yes,
    )
