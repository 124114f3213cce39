"""Secrets in messages: an export refused at a secret's value names the argument, not the value."""

from __future__ import annotations

import pytest

from offload_planner.core.cmdline import format_command
from offload_planner.core.cmdline.emit import ExportRefused


@pytest.mark.parametrize(("argv", "style"), [
    (["llama-server", "--api-key", "s3cr%et%x"], "cmd"),
    (["llama-server", "--api-key=s3cr\net"], "cmd"),
    (["llama-server", "-hft", "s3cr${PORT}et"], "llama-swap"),
    (["llama-server", "--hf_token", "s3cr\0et"], "bash"),
])
def test_a_refused_export_does_not_quote_the_secret(argv: list[str], style: str) -> None:
    with pytest.raises(ExportRefused) as e:
        format_command(argv, style)
    assert "s3cr" not in str(e.value) and "***" in str(e.value), str(e.value)
    assert "argument 1" in str(e.value) or "argument 2" in str(e.value)


def test_the_export_itself_keeps_the_secret() -> None:
    """The exported command is the user's copy: it must run, so the value is in it."""
    for style in ("bash", "powershell", "cmd", "llama-swap", "docker-env"):
        assert "s3cret" in format_command(["llama-server", "--api-key", "s3cret"], style), style
