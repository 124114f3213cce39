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


#: answers /completion only with the key of its environment's LLAMA_API_KEY (llama-server reads --api-key
#: from it, arg.cpp), 401 otherwise; listens on the --port it is given
KEYED_BY_ENV = r'''
import json, os, sys, http.server, socketserver
if "--version" in sys.argv or "--help" in sys.argv:
    print("version: 1 (abc)"); sys.exit(0)
key = os.environ.get("LLAMA_API_KEY", "")
port = int(sys.argv[sys.argv.index("--port") + 1])
GOOD = {"timings": {"prompt_n": 512, "prompt_ms": 500.0, "prompt_per_second": 1024.0,
                    "predicted_n": 64, "predicted_ms": 1000.0, "predicted_per_second": 64.0}}
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"{}")
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        ok = bool(key) and self.headers.get("Authorization") == f"Bearer {key}"
        body = json.dumps(GOOD if ok else {"error": {"code": 401, "message": "Invalid API Key",
                                                     "type": "authentication_error"}}).encode()
        self.send_response(200 if ok else 401); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
s = S(("127.0.0.1", port), H)
print(f"0.00.009.000 I srv  llama_server: listening on http://127.0.0.1:{port}", flush=True)
s.serve_forever()
'''


def test_the_bench_sends_the_key_of_the_environment_field(qtbot: QtBot, tmp_path: Path,
                                                          small_models: dict[str, Path]) -> None:
    """The window's Bench took the key from the command only: a key given as LLAMA_API_KEY in the
    Environment field (the server's) got 401 'Invalid API Key'."""
    from tests.support.procs import free_port

    plan = _plan(small_models["qwen3moe"], "-c 4096")
    exe = tmp_path / "llama-server"
    exe.write_text(f"#!{sys.executable}\n{KEYED_BY_ENV}")
    exe.chmod(0o755)
    panel = _panel(qtbot, exe, tmp_path)
    panel.port_spin.setValue(free_port())
    panel.env_edit.setText("LLAMA_API_KEY=env-s3cret")
    panel.set_plan(plan, plan.projection())
    with qtbot.waitSignal(panel.server.ready, timeout=20_000):
        assert panel.launch()
    assert panel.run_bench()
    qtbot.waitUntil(lambda: "Measuring" not in panel.speed_label.text(), timeout=30_000)
    assert "1024.00 t/s measured" in panel.speed_label.text(), panel.speed_label.text()
    with qtbot.waitSignal(panel.server.finished, timeout=20_000):
        panel.stop()
