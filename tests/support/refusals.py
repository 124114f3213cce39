"""A CLI refusal as the hostile-input tests expect it: the exit code, no traceback, one error line."""

from __future__ import annotations

import subprocess


def refused(r: subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    """The exit code, no traceback, one error line with every fragment; that line."""
    assert r.returncode == code, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    assert all(f in lines[0] for f in fragments), lines[0]
    return lines[0]
