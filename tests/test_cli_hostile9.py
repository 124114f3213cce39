"""Hostile input against the terminal: a downloaded model's metadata or a file's name holding escape
sequences (set the window title, clear the screen, ring the bell) is printed with its control
characters escaped, as the CPU's model name already was."""

from __future__ import annotations

from pathlib import Path

from tests.support.cli import run_cli
from tests.support.gguf_rewrite import rewrite

#: sets the terminal's title, clears the screen, rings the bell
EVIL = "\x1b]0;pwned\x07\x1b[2J\x9b31m evil"
ESCAPED = "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m evil"


def _clean(text: str) -> None:
    assert not any(c in text for c in "\x1b\x07\x9b"), text[:2000]


def test_inspect_escapes_an_escape_sequence_in_the_models_name(tmp_path: Path,
                                                              small_models: dict[str, Path]) -> None:
    """general.name was printed raw: opening a downloaded model retitled and cleared the terminal."""
    model = rewrite(small_models["qwen3moe"], tmp_path / "evil.gguf", text=("general.name", EVIL))
    r = run_cli("inspect", str(model))
    assert r.returncode == 0, r.stderr[-2000:]
    _clean(r.stdout + r.stderr)
    assert r.stdout.splitlines()[0] == ESCAPED


def test_an_error_naming_a_file_escapes_its_name(tmp_path: Path) -> None:
    """The error line quoted the name as it was: a name with an escape sequence reached the terminal."""
    bad = tmp_path / f"{EVIL}.gguf"
    bad.write_bytes(b"junkjunkjunkjunk")
    for command in ("inspect", "plan", "fit"):
        r = run_cli(command, str(bad))
        assert r.returncode == 2, r.stderr[-2000:]
        _clean(r.stderr)
        assert r.stderr.startswith(f"offload-planner: error: {tmp_path}/{ESCAPED}.gguf"), r.stderr
        assert len(r.stderr.splitlines()) == 1, r.stderr
