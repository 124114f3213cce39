"""The launch panel's Command field shows the launched command with a secret (``--api-key``,
``--hf-token``) as ``***``; the server still gets the value."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from pytestqt.qtbot import QtBot
from tests.ui.test_launcher_panel import _buffer_lines, _fake_server, _panel, _plan

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="a POSIX script stands in for llama-server")


def test_the_launched_command_field_masks_the_api_key(qtbot: QtBot, tmp_path: Path,
                                                      small_models: dict[str, Path]) -> None:
    plan = _plan(small_models["qwen3moe"], "-c 4096")
    projection = plan.projection()
    exe = _fake_server(tmp_path, _buffer_lines(projection))
    argv_file = tmp_path / "argv.txt"
    record = f"import sys, time\nopen({str(argv_file)!r}, 'w').write(repr(sys.argv))\n"
    text = exe.read_text().replace("import sys, time\n", record, 1)
    exe.write_text(text)
    panel = _panel(qtbot, exe, tmp_path)
    command = ["-c", "4096", "--api-key", "sekrit-1", "--hf-token=sekrit-2", "-hft", "sekrit-3"]
    panel.set_plan(plan, projection, command)
    with qtbot.waitSignal(panel.server.ready, timeout=20_000):
        assert panel.launch()
    shown = panel.command_edit.text()
    assert "sekrit" not in shown, shown
    assert "--api-key '***'" in shown and "'--hf-token=***'" in shown and "-hft '***'" in shown
    got = argv_file.read_text()
    assert all(f"'sekrit-{i}'" in got or f"sekrit-{i}'" in got for i in (1, 2, 3)), got
    with qtbot.waitSignal(panel.server.finished, timeout=20_000):
        panel.stop()
