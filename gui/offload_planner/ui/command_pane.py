"""The Command tab: the minimal llama-server command for the current plan (plan_command), in a chosen
format, with Copy; "Paste command…" rebuilds the plan from a pasted command line (one undo step)
and the table lists what each -ot rule placed, and which rules match nothing or are shadowed.

Formatting and parsing are core's (``format_command``, ``parse_server_args``) through
:mod:`offload_planner.core.command_text`.
"""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Callable, Sequence

from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QColor, QFontDatabase, QGuiApplication, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QTextEdit,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from offload_planner.core import command_text
from offload_planner.core.cmdline.emit import ExportRefused
from offload_planner.core.errors import PlannerError
from offload_planner.core.units import fmt_bytes
from offload_planner.ui.document import PlanDocument

HIGHLIGHT_MS = 1600
#: What the rules table's columns say (it lists the command's own -ot rules, from --cpu-moe and the
#: like too; the rules the window writes for the map's moves are in the command, not in it).
RULE_HEADER_TIPS = (
    "The command's own -ot rules (override-tensor: tensor-name pattern = device), in the order "
    "llama.cpp tries them; the rules written for your moves on the map are in the command text",
    "Tensors this rule is the first of the command's rules to match (a tensor you moved on the map "
    "counts here too: the rule written for your move comes before it in the command)",
    "Bytes of those tensors",
    "ok, or: matches nothing (a pattern no tensor name matches), shadowed (an earlier rule takes "
    "every tensor it matches)",
)


def pasted_message(notes: Sequence[str]) -> str:
    """The status line after a paste: a command llama-server would refuse said first (it was one
    of "N notes in Problems"), notes counted in the singular too ("1 notes")."""
    refused = sum(n.startswith(command_text.REFUSED) for n in notes)
    if refused:
        return ("Plan rebuilt from the pasted command, which llama-server would refuse: see Problems "
                f"({refused} error{'s' if refused > 1 else ''})")
    return "Plan rebuilt from the pasted command" + (
        f" ({len(notes)} note{'s' if len(notes) > 1 else ''} in Problems)" if notes else "")


def changed_spans(text: str, old: Sequence[str], new: Sequence[str]) -> list[tuple[int, int]]:
    """Character spans in ``text`` (the formatted ``new``) of the arguments not in ``old``."""
    sm = difflib.SequenceMatcher(a=list(old), b=list(new), autojunk=False)
    changed = {
        j for op, _, _, j1, j2 in sm.get_opcodes() if op in ("replace", "insert") for j in range(j1, j2)
    }
    spans: list[tuple[int, int]] = []
    pos = 0
    for j, tok in enumerate(new):
        for candidate in (shlex.quote(tok), tok):
            at = text.find(candidate, pos)
            if at >= 0:
                if j in changed:
                    spans.append((at, at + len(candidate)))
                pos = at + len(candidate)
                break
    return spans


class PasteCommandDialog(QDialog):
    """``check``: the reason a command cannot be read (None: it can); OK keeps the dialog open with
    the reason under the text instead of closing on a command the plan then refused, which lost a
    long command edited in the dialog to a status-bar message."""

    def __init__(self, parent: QWidget | None = None,
                 check: Callable[[str], str | None] | None = None) -> None:
        super().__init__(parent)
        self._check = check
        self.setWindowTitle("Paste a llama-server command")
        self.edit = QPlainTextEdit()
        self.edit.setPlaceholderText('llama-server -m model.gguf -ngl 999 -ot "exps=CPU" -c 32768 …')
        self.edit.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        lay = QVBoxLayout(self)
        lay.addWidget(
            QLabel(
                "The plan is rebuilt from this command (the open model and devices stay); "
                "your moves are replaced. Undo brings them back."
            )
        )
        lay.addWidget(self.edit)
        self.error = QLabel()
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: #D00000")
        self.error.hide()
        lay.addWidget(self.error)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        lay.addWidget(self.buttons)
        self.resize(720, 240)
        clip = QGuiApplication.clipboard().text()
        if "-" in clip and len(clip) < 20000:
            self.edit.setPlainText(clip)

    def text(self) -> str:
        return self.edit.toPlainText()

    def accept(self) -> None:
        why = self._check(self.text()) if self._check is not None and self.text().strip() else None
        if why:
            self.error.setText(f"Cannot read the command: {why}")
            self.error.show()
            return
        super().accept()


class CommandPane(QWidget):
    message = Signal(str)

    def __init__(self, doc: PlanDocument, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._doc = doc
        self.program = "llama-server"
        self._shown: list[str] = []
        self.before_replace: Callable[[], bool] = lambda: True
        self.style_box = QComboBox()
        for key, label in command_text.STYLES:
            self.style_box.addItem(label, key)
        self.style_box.setToolTip("How to write the command")
        self.multiline = QCheckBox("one flag per line")
        self.copy_button = QPushButton("Copy")
        self.paste_button = QPushButton("Paste command…")
        self.paste_button.setToolTip("Rebuild the plan from a llama-server command line")
        self.status = QLabel()
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.text.setAccessibleName("Command line")
        self.rules = QTreeWidget()
        self.rules.setHeaderLabels(["-ot rule", "tensors", "bytes", "status"])
        for col, tip in enumerate(RULE_HEADER_TIPS):
            self.rules.headerItem().setToolTip(col, tip)
        self.rules.setRootIsDecorated(False)
        self.rules.setAccessibleName("Override rules")
        self.rules.header().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for c in (1, 2, 3):
            self.rules.header().setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
        self.rules.header().setStretchLastSection(False)

        top = QHBoxLayout()
        top.addWidget(QLabel("Format"))
        top.addWidget(self.style_box)
        top.addWidget(self.multiline)
        top.addWidget(self.copy_button)
        top.addWidget(self.paste_button)
        top.addStretch(1)
        top.addWidget(self.status)
        split = QSplitter()
        split.addWidget(self.text)
        split.addWidget(self.rules)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(top)
        lay.addWidget(split, 1)

        self._clear_timer = QTimer(self)
        self._clear_timer.setSingleShot(True)
        self._clear_timer.timeout.connect(lambda: self.text.setExtraSelections([]))
        self.copy_button.clicked.connect(self.copy)
        self.paste_button.clicked.connect(self.paste_dialog)
        self.style_box.currentIndexChanged.connect(self._restyle)
        self.multiline.toggled.connect(self._restyle)
        doc.analysisChanged.connect(self.refresh)
        doc.planChanged.connect(self._show_currency)  # an edit whose projection has not arrived yet
        doc.modelChanged.connect(lambda: self.refresh(highlight=False))

    def _restyle(self) -> None:
        self.refresh(highlight=False)

    @property
    def format_style(self) -> str:
        return str(self.style_box.currentData() or "bash")

    def set_format_style(self, style: str) -> None:
        i = self.style_box.findData(style)
        if i >= 0:
            self.style_box.setCurrentIndex(i)

    def argv(self) -> list[str]:
        a = self._doc.analysis
        return [self.program, *a.command] if a is not None and a.projection is not None else []

    def command_text(self) -> str:
        """The command in the chosen format; raises ``ExportRefused`` (its message names the
        argument) when the format cannot carry one of the arguments exactly."""
        argv = self.argv()
        if not argv:
            return ""
        return command_text.render(
            argv, self.format_style, self._doc.plan.dialect, multiline=self.multiline.isChecked()
        )

    def _shown_text(self) -> str:
        try:
            return self.command_text()
        except ExportRefused as e:  # shown in place of the command; Copy copies nothing
            return str(e)

    def refresh(self, highlight: bool = True) -> None:
        a = self._doc.analysis
        if a is None or a.projection is None:
            self.text.setPlainText(a.error if a is not None else "")
            self.rules.clear()
            self.status.setText("")
            return
        argv = self.argv()
        text = self._shown_text()
        if text != self.text.toPlainText():
            self.text.setPlainText(text)
            if highlight and self._shown and argv != self._shown:
                self._highlight(changed_spans(text, self._shown, argv))
        self._shown = argv
        self._show_currency()
        self.rules.clear()
        for r in a.rules:
            o = r.override
            item = QTreeWidgetItem(
                [f"{o.pattern}={o.buft}", str(r.placed), fmt_bytes(r.placed_bytes), r.status]
            )
            item.setToolTip(0, f"from {o.source}; rule {r.index + 1}")
            if r.status != "ok":
                item.setForeground(3, QColor("#D00000"))
                item.setToolTip(
                    3,
                    f"{r.shadowed} matching tensors are taken by earlier rules"
                    if r.shadowed
                    else "no tensor name matches this pattern",
                )
            self.rules.addTopLevelItem(item)
        self.rules.setVisible(bool(a.rules))

    def _show_currency(self) -> None:
        """"projected in N ms" once the command is the current plan's; until then "updating…", the
        text greyed and Copy off (it would copy the command before the edit)."""
        a = self._doc.analysis
        current = self._doc.analysis_current
        if a is None or a.projection is None:
            return
        self.status.setText(f"projected in {a.seconds * 1000:.0f} ms" if current else "updating…")
        self.text.setEnabled(current)
        self.copy_button.setEnabled(current)

    def _highlight(self, spans: list[tuple[int, int]]) -> None:
        fmt = QTextCharFormat()
        fmt.setBackground(QColor("#FFE08A"))
        sels = []
        for lo, hi in spans:
            sel = QTextEdit.ExtraSelection()
            cur = QTextCursor(self.text.document())
            cur.setPosition(lo)
            cur.setPosition(hi, QTextCursor.MoveMode.KeepAnchor)
            sel.cursor = cur
            sel.format = fmt
            sels.append(sel)
        self.text.setExtraSelections(sels)
        self._clear_timer.start(HIGHLIGHT_MS)

    def copy(self) -> None:
        try:
            text = self.command_text()
        except ExportRefused as e:
            self.message.emit(str(e))
            return
        if text:
            QGuiApplication.clipboard().setText(text)
            self.message.emit("Command copied")

    def paste_dialog(self) -> None:
        if not self._doc.has_plan:
            return
        dlg = PasteCommandDialog(self, check=self._why_unreadable)
        if dlg.exec() == QDialog.DialogCode.Accepted and dlg.text().strip():
            self.paste_text(dlg.text())

    def _why_unreadable(self, text: str) -> str | None:
        try:
            command_text.plan_from_command(self._doc.plan, text)
        except (ValueError, PlannerError) as e:
            return str(e)
        return None

    def paste_text(self, text: str) -> bool:
        """Replace the plan with a pasted command, once :attr:`before_replace` agrees (the window
        asks there about unsaved changes)."""
        return self.before_replace() and self.apply_command_text(text)

    def apply_command_text(self, text: str) -> bool:
        """Rebuild the plan from a command line (one undo step)."""
        try:
            plan, notes = command_text.plan_from_command(self._doc.plan, text)
        except (ValueError, PlannerError) as e:
            self.message.emit(f"Cannot read the command: {e}")
            self._doc.set_notes([f"pasted command: {e}"])
            return False
        self._doc.replace_plan(plan, "Paste command")
        self._doc.set_notes(notes)
        self.message.emit(pasted_message(notes))
        return True
