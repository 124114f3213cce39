"""A hand-edited or damaged settings file (QSettings ini) never stops the window: a value that does not
read, is of the wrong type or out of range is the setting's default, a virtual GPU that does not read is
left out."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from offload_planner.ui import settings as keys
from offload_planner.ui.settings import Settings

DEEP = "[" * 100_000 + "]" * 100_000


def settings_with(tmp_path: Path, section: str, line: str) -> Settings:
    ini = tmp_path / "s.ini"
    ini.write_text(f"[{section}]\n{line}\n")
    return Settings.at(str(ini))


@pytest.mark.parametrize(("section", "line", "key"), [
    ("files", f"recent={DEEP}", keys.RECENT_FILES),  # RecursionError: a traceback at start
    ("plan", "default_context=-4", keys.DEFAULT_CONTEXT),  # the window hung opening a model
    ("plan", "default_context=99999999999", keys.DEFAULT_CONTEXT),
    ("devices", "cpu_size=-5", keys.CPU_SIZE),  # a CPU of -5 bytes
    ("devices", "cpu_size=true", keys.CPU_SIZE),  # true is an int to isinstance: 1 byte of RAM
    ("devices", "default_margin=-7", keys.DEFAULT_MARGIN),
    ("devices", f"default_margin={10 ** 30}", keys.DEFAULT_MARGIN),
], ids=["deep", "context-4", "context_over_int", "cpu-5", "cpu_true", "margin-7", "margin_10**30"])
def test_a_bad_value_is_the_default(tmp_path: Path, section: str, line: str, key: keys.Key) -> None:
    s = settings_with(tmp_path, section, line)
    t0 = time.perf_counter()
    assert s.get(key) == key.default
    assert time.perf_counter() - t0 < 1


@pytest.mark.parametrize("entry", [
    '{\\"name\\": \\"CUDA1\\", \\"total\\": 1e999}',  # OverflowError: the window aborted at start
    '{\\"name\\": \\"CUDA1\\", \\"total\\": -1}',
    '{\\"name\\": \\"CUDA1\\", \\"total\\": 1000, \\"margin\\": -99}',
    '{\\"name\\": \\"CUDA1\\", \\"total\\": 1000, \\"margin\\": 1e999}',
])
def test_a_virtual_gpu_that_does_not_read_is_left_out(tmp_path: Path, entry: str) -> None:
    good = '{\\"name\\": \\"CUDA0\\", \\"total\\": 1073741824}'
    s = settings_with(tmp_path, "devices", f'virtual="[{entry}, {good}]"')
    assert [(d.name, d.total) for d in s.virtual_gpus()] == [("CUDA0", 1 << 30)]


@pytest.mark.parametrize("margin", ["-99999999999999999999999", "true", "1e999", '\\"1\\"'])
def test_a_stored_margin_that_does_not_read_is_the_default_margin(tmp_path: Path, margin: str) -> None:
    s = settings_with(tmp_path, "devices", f'margins="{{\\"CPU\\": {margin}, \\"CUDA0\\": 5}}"')
    assert (s.margin_of("CPU"), s.margin_of("CUDA0")) == (keys.DEFAULT_MARGIN.default, 5)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_a_settings_file_given_that_is_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    """QSettings read the FIFO for ever: the window never opened (and --screenshot never ended)."""
    from tests.support.cli import run_cli

    fifo = tmp_path / "settings.ini"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    r = run_cli("gui", "--settings", str(fifo), "--screenshot", str(tmp_path / "x.png"), timeout=60)
    assert time.monotonic() - t0 < 30 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.returncode == 2 and f"error: --settings '{fifo}': not a regular file (a FIFO)" in r.stderr


@pytest.mark.skipif(sys.platform in ("win32", "darwin") or not hasattr(os, "mkfifo"),
                    reason="the user's settings are an ini file in the XDG config folder here")
def test_the_users_settings_file_as_a_fifo_is_said_and_left_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from offload_planner.ui import app

    assert app._user_settings_path() == Settings().q.fileName()  # where QSettings reads, not opened
    fifo = tmp_path / f"{keys.APPLICATION}.conf"
    os.mkfifo(fifo)
    monkeypatch.setattr(app, "_user_settings_path", lambda: str(fifo))
    settings, tmp = app._settings_for(None, None)
    try:
        assert tmp is not None and settings.q.fileName().startswith(tmp.name)
        assert settings.get(keys.DEFAULT_CONTEXT) == keys.DEFAULT_CONTEXT.default
    finally:
        if tmp is not None:
            tmp.cleanup()
    assert f"the settings file {fifo} is not a regular file (a FIFO)" in capsys.readouterr().err
