"""Make the README's screenshots with the app itself, offscreen.

    python packaging/screenshots.py [--out resources/screenshots]

- default.png: `offload-planner gui --screenshot ...`: the bundled DeepSeek-V3 demo as it opens, on
  its declared demo hardware (the app's own --screenshot, as a user runs it).
- presets.png: the same window driven through its classes: Presets → All routed experts → CPU, then
  Fill CUDA0 with routed experts from layer 0 and Fill CUDA1 with routed experts from the last
  layer. Prints the command the window exports in every format (the README's Guide quotes it).

Both are 1280x800 and use a throwaway settings file; tests/test_screenshots.py checks that the
README's pictures exist at their stated size.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEVICES = ("CUDA0=24GiB", "CUDA1=24GiB", "CPU=512GiB,ram=8xDDR5-4800")  # the Guide's devices
SIZE = (1280, 800)


def default_view(out: Path, settings: Path) -> None:
    cmd = [sys.executable, "-m", "offload_planner", "gui", "--screenshot", str(out),
           "--size", f"{SIZE[0]}x{SIZE[1]}", "--settings", str(settings)]
    subprocess.run(cmd, check=True, timeout=180)


def presets_view(out: Path, settings: Path) -> None:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    from offload_planner.backend import qt_compat
    from offload_planner.core.cmdline import Style
    from offload_planner.core.devices import parse_device_decl
    from offload_planner.core.placement import CPU
    from offload_planner.core import command_text
    from offload_planner.ui.loader import demo_model
    from offload_planner.ui.main_window import MainWindow, SystemInfo
    from offload_planner.ui.settings import Settings

    qt_compat.apply()
    app = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(app, QApplication)
    win = MainWindow(Settings.at(str(settings)), SystemInfo.probe([parse_device_decl(d) for d in DEVICES]))
    win.confirm_close = False
    win.resize(*SIZE)
    win.show()

    def wait(what: str, done: Callable[[], bool], timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while not done():
            if time.monotonic() > end:
                raise SystemExit(f"timed out waiting for {what}")
            app.processEvents()
            time.sleep(0.01)

    def projected() -> bool:
        return not win.loader.busy and win.doc.has_plan and win.doc.analysis_current

    win.open_path(demo_model())
    wait("the demo model", projected)
    menu = win.presets_menu
    menu.message.connect(lambda m: print(f"  {m}"))
    steps = (
        ("All routed experts → CPU", lambda: menu.routed_experts_to(CPU)),
        ("Fill CUDA0 with routed experts from layer 0", lambda: menu.fill("CUDA0", from_first=True)),
        ("Fill CUDA1 with routed experts from the last layer", lambda: menu.fill("CUDA1", from_first=False)),
    )
    for label, step in steps:
        print(f"Presets → {label}")
        if not step():
            raise SystemExit(f"preset did nothing: {label}")
        wait(label, projected)
    analysis = win.doc.analysis
    for dev in analysis.projection.devices if analysis and analysis.projection else []:
        print(f"  {dev.device.name}: {dev.total() / 2**30:.2f} GiB")
    argv = win.command_pane.argv()
    for style in Style:
        print(f"--- {style.value}")
        print(command_text.render(argv, style.value, win.doc.plan.dialect))
    # After a fill whose layers are the GPU's under the command's own split, the Presets menu says
    # "Moved 6 tensors off CUDA1: no expert layer fits" (its count looks only at moves that differ
    # from the command's placement); keep that misleading line out of the picture.
    win.statusBar().clearMessage()
    app.processEvents()
    pix = win.grab()
    if not pix.save(str(out), "PNG"):
        raise SystemExit(f"cannot write {out}")
    print(f"{out}: {pix.width()}x{pix.height()}")
    win.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "resources" / "screenshots")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="offload-planner-shots-") as tmp:
        default_view(args.out / "default.png", Path(tmp) / "default.ini")
        presets_view(args.out / "presets.png", Path(tmp) / "presets.ini")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
