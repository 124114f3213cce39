"""Which llama-server a command line is for, and recognising it from ``--version`` / ``--help`` output."""

from __future__ import annotations

import re

from offload_planner.core.dialects import Dialect

__all__ = ["Dialect", "detect_dialect"]

# Help-text markers, strongest first.  Each names flags (or wording) only one dialect prints.
_IK_HELP = (
    r"--mla-use",
    r"--attention-max-batch",
    r"--smart-expert-reduction",
    r"--run-time-repack",
    r"--merge-up-gate-experts",
    r"--k-cache-hadamard",
    r"--graph-reduce-type",
    r"-no-fmoe",
)
_NEW_MAINLINE_HELP = (r"--load-mode", r"--lazy-mode", r"-lm,\s")
_COMMON_ARG_HELP = (r"----- common params -----", r"\(env: LLAMA_ARG_")
_OLD_MMAP_HELP = (r"--no-mmap", r"--mlock")

_SEMVER_VERSION = re.compile(r"^version:\s*\d+\.\d+\.\d+", re.MULTILINE)
_BUILD_VERSION = re.compile(r"^version:\s*(\d+)\s*\(", re.MULTILINE)


def _has_any(text: str, patterns: tuple[str, ...]) -> bool:
    return any(re.search(p, text) for p in patterns)


def _from_help(help_text: str) -> Dialect | None:
    if _has_any(help_text, _IK_HELP):
        return Dialect.IK
    if _has_any(help_text, _NEW_MAINLINE_HELP):
        return Dialect.LLAMA_CPP
    if _has_any(help_text, _COMMON_ARG_HELP) or _has_any(help_text, _OLD_MMAP_HELP):
        return Dialect.LLAMA_CPP_2025
    return None


def _from_version(version_text: str) -> Dialect | None:
    if re.search(r"ik_llama", version_text, re.IGNORECASE):
        return Dialect.IK
    if _SEMVER_VERSION.search(version_text):
        return Dialect.LLAMA_CPP
    if _BUILD_VERSION.search(version_text):
        # "version: 6123 (abcdef0)": a 2025 mainline build or ik_llama.cpp; the numbers overlap.
        return Dialect.LLAMA_CPP_2025
    return None


def detect_dialect(version_text: str, help_text: str) -> Dialect:
    """Recognise a llama-server from what ``--version`` and ``--help`` printed (stdout + stderr).

    The help text decides when it carries a marker (ik-only flags such as ``--mla-use``; the pinned
    build's ``--load-mode``; ``--no-mmap`` in a ``common_arg`` style help = 2025 mainline).  Otherwise
    the version line does: ``version: 0.6.0-dev (...)`` is the pinned build, ``version: N (hash)``
    is taken as 2025 mainline (ik prints the same form, so pass its help to tell them apart).
    Falls back to the pinned build.
    """
    return _from_help(help_text) or _from_version(version_text) or Dialect.LLAMA_CPP
