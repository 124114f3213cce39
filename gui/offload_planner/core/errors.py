"""Error types raised by the core. Only these escape the core to a user."""

from __future__ import annotations

from pathlib import Path


class PlannerError(Exception):
    """Base of every error the core reports to a user (one clear line, no traceback)."""


class GGUFError(PlannerError):
    """A GGUF file that cannot be read: names the file and, where known, the byte offset."""

    def __init__(self, path: str | Path, message: str, offset: int | None = None) -> None:
        self.path = str(path)
        self.offset = offset
        self.detail = message
        where = f" at byte {offset}" if offset is not None else ""
        super().__init__(f"{self.path}{where}: {message}")


class RuleError(PlannerError):
    """A tensor override (``-ot``, or one a flag such as ``--n-cpu-moe`` stands for) the planner
    cannot evaluate: names the rule and why."""
