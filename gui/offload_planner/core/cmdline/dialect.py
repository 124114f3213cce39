"""Which llama-server a command line is for, and recognising it from ``--version`` / ``--help`` output."""

from __future__ import annotations

import re

from offload_planner.core.dialects import Dialect

__all__ = ["Dialect", "detect_dialect"]


def _has_any(text: str, patterns: tuple[str, ...]) -> bool:
    return any(re.search(p, text) for p in patterns)


def detect_dialect(version_text: str, help_text: str) -> Dialect:
    """Recognise a llama-server from what ``--version`` and ``--help`` printed (stdout + stderr).

    Each dialect names its markers (:attr:`Dialect.help_markers`, :attr:`Dialect.version_markers`),
    tried in :attr:`Dialect.detect_rank` order.  The help text decides when it carries a marker
    (ik-only flags such as ``--mla-use``; the pinned build's ``--load-mode``; ``--no-mmap`` in a
    ``common_arg`` style help = 2025 mainline).  Otherwise the version line does: ``version: 0.6.0-dev
    (...)`` is the pinned build, ``version: N (hash)`` is taken as 2025 mainline (ik prints the same
    form, so pass its help to tell them apart).  Falls back to the pinned build.
    """
    ranked = sorted(Dialect, key=lambda d: d.detect_rank)
    found = next((d for d in ranked if _has_any(help_text, d.help_markers)), None)
    found = found or next((d for d in ranked if _has_any(version_text, d.version_markers)), None)
    return found or Dialect.LLAMA_CPP
