"""Secret values in a command line (``--api-key``, ``--hf-token``): which arguments carry one, and
the command with them hidden for display.

Policy (README, "Secrets"): a command the planner shows or logs (the window's launch panel, the
launch confirmation, a plan file's review, notes and error messages) shows a secret as ``***``;
the command that is the product, the one the user copies (``plan``'s and ``fit``'s last line, the
``--json`` ``command``, the Command tab and its export formats), keeps the value as given, since
the copy must run; a plan file and the settings never hold it.
"""

from __future__ import annotations

from collections.abc import Sequence

from offload_planner.core.cmdline.flagspec import normalize_spelling

#: Flags whose value is a secret (arg.cpp: ``-hft/--hf-token`` "Hugging Face access token",
#: ``--api-key`` "API key to use for authentication"). ``--api-key-file`` and ``--ssl-key-file``
#: take paths, which are not secrets themselves, and are kept.
SECRET_FLAGS = frozenset({"--hf-token", "--api-key"})
SECRET_SPELLINGS = frozenset({"-hft", "--hf-token", "--api-key"})
MASK = "***"


def is_secret(arg: str) -> tuple[bool, bool]:
    """(names a secret flag, with its value attached as ``--flag=VALUE``)."""
    spelling, eq, _ = normalize_spelling(arg).partition("=")
    if spelling in SECRET_SPELLINGS:
        return True, bool(eq)
    return False, False


def masked(args: Sequence[str]) -> list[str]:
    """``args`` with secret values replaced by ``***`` (for display)."""
    out: list[str] = []
    hide = False
    for arg in args:
        if hide:
            out.append(MASK)
            hide = False
            continue
        secret, attached = is_secret(arg)
        if secret and attached:
            out.append(arg.split("=", 1)[0] + "=" + MASK)
        else:
            out.append(arg)
            hide = secret
    return out


def has_secret(args: Sequence[str]) -> bool:
    """Whether ``args`` name a secret flag (its value is in them)."""
    return any(is_secret(a)[0] for a in args)


def secret_note(args: Sequence[str]) -> str | None:
    """What a printed command that is the user's copy says when it carries a secret (None without one)."""
    flags = sorted({a.split("=", 1)[0] for a in args if is_secret(a)[0]})
    if not flags:
        return None
    return (f"the command carries the value of {', '.join(flags)} as given (the copy is yours: it must run); "
            "the window's launch panel, launch reviews and messages show it as ***, and a plan file or the "
            "settings never store it")
