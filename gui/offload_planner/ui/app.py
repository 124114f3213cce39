"""Starting the window: ``offload-planner [gui] [MODEL] [--device ...] [--screenshot FILE.png]``."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from offload_planner.ui.main_window import MainWindow
    from offload_planner.ui.settings import Settings

SCREENSHOT_TIMEOUT_MS = 120_000


def has_display() -> bool:
    """Can Qt open a window here? (Linux without X11/Wayland cannot, unless a platform is forced.)"""
    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


#: What Qt's offscreen platform says on every window it shows: noise under a --screenshot run.
OFFSCREEN_NOISE = frozenset({"This plugin does not support propagateSizeHints()"})


def _quiet_offscreen_warnings() -> None:
    """Qt's messages go to stderr as before, less :data:`OFFSCREEN_NOISE` (a newcomer's first
    --screenshot printed it as if something had gone wrong)."""
    from PySide6.QtCore import QMessageLogContext, QtMsgType, qInstallMessageHandler

    def handler(_mode: QtMsgType, _context: QMessageLogContext, message: str) -> None:
        if message not in OFFSCREEN_NOISE:
            print(message, file=sys.stderr)

    qInstallMessageHandler(handler)


def _catch_slot_errors(win: MainWindow, *, quiet: bool) -> Callable[[], None]:
    """Until the returned function is called, an exception no slot caught (PySide hands it to
    sys.excepthook and goes on) is said by the window (:attr:`MainWindow.internalError`: a dialog naming
    the plan's file; the plan and its edits stay), where it was a traceback on a terminal nobody
    watches, and a --screenshot run waited for its 120 s timeout. The traceback still goes to stderr,
    unless ``quiet`` (a screenshot run prints the one line)."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if not issubclass(kind, Exception):  # KeyboardInterrupt, SystemExit: as before
            previous(kind, value, tb)
            return
        if not quiet:
            previous(kind, value, tb)
        try:
            win.internalError.emit(f"{kind.__name__}: {value}")  # queued to the window's thread
        except RuntimeError:  # the window is gone
            previous(kind, value, tb)

    sys.excepthook = hook

    def restore() -> None:
        sys.excepthook = previous

    return restore


def _settings_for(settings_file: str | None, screenshot: str | None
                  ) -> tuple[Settings, tempfile.TemporaryDirectory[str] | None]:
    """The window's settings: the given file, a temporary one for a screenshot (reproducible
    pictures: no user settings; the directory to clean up), else the user's."""
    from offload_planner.ui.settings import Settings

    if settings_file:
        _settings_problem(settings_file, given=True)
        return Settings.at(settings_file), None
    if screenshot or _settings_problem(_user_settings_path(), given=False):
        tmp = tempfile.TemporaryDirectory(prefix="offload-planner-")
        return Settings.at(str(Path(tmp.name) / "settings.ini")), tmp
    return Settings(), None


def _user_settings_path() -> str:
    """Where QSettings keeps the user's settings on Linux and the BSDs (an ini file in the XDG config
    folder), worked out without opening it ('' elsewhere: the registry, a macOS plist)."""
    if sys.platform == "win32" or sys.platform == "darwin":
        return ""
    from PySide6.QtCore import QStandardPaths

    from offload_planner.ui.settings import APPLICATION, ORGANIZATION

    base = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.GenericConfigLocation)
    return os.path.join(base, ORGANIZATION, f"{APPLICATION}.conf") if base else ""


def _settings_problem(path: str, *, given: bool) -> bool:
    """A settings file there that is no regular file (QSettings read a FIFO there for ever, before the
    window opened): ``--settings`` is refused (PlannerError); the user's own is said and this session's
    settings are kept apart (True)."""
    import stat

    from offload_planner.core.errors import PlannerError
    from offload_planner.core.plan_file import file_kind

    try:
        st = os.stat(path) if path else None
    except (OSError, ValueError):  # not there yet: QSettings creates it
        return False
    if st is None:
        return False
    if stat.S_ISREG(st.st_mode):
        return False
    if given:
        raise PlannerError(f"--settings {path!r}: not a regular file ({file_kind(st.st_mode)})")
    print(f"offload-planner: warning: the settings file {path} is not a regular file "
          f"({file_kind(st.st_mode)}): not read, and this session's settings are not kept", file=sys.stderr)
    return True


def run_gui(
    model: str | None = None,
    *,
    devices: Sequence[str] = (),
    screenshot: str | None = None,
    size: tuple[int, int] = (1280, 800),
    settings_file: str | None = None,
    allow_remote: bool = False,
) -> int:
    """Open the window on ``model`` (default: the bundled demo). With ``screenshot``, render offscreen
    once the model is loaded and projected, save the PNG and exit (status 0 when saved)."""
    if screenshot and not os.environ.get("QT_QPA_PLATFORM"):
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    if not has_display():
        print(
            "offload-planner: error: no display (DISPLAY/WAYLAND_DISPLAY unset); use "
            "`offload-planner plan` or `inspect`, or `gui --screenshot FILE.png`",
            file=sys.stderr,
        )
        return 2
    from offload_planner.backend.qt_libs import check_xcb

    problem = check_xcb()
    if problem:  # Qt would abort naming one library; say which are missing and how to install them
        print(f"offload-planner: error: {problem}", file=sys.stderr)
        return 2

    from PySide6.QtCore import Qt, QTimer
    from PySide6.QtGui import QGuiApplication, QIcon
    from PySide6.QtWidgets import QApplication

    from offload_planner.backend import qt_compat
    from offload_planner.core.devices import parse_device_decls
    from offload_planner.resources import icon_path
    from offload_planner.ui.loader import demo_model
    from offload_planner.ui.main_window import MainWindow, SystemInfo
    from offload_planner.ui.settings import APPLICATION, ORGANIZATION

    qt_compat.apply()
    if screenshot:
        _quiet_offscreen_warnings()
    else:  # a launched server's orphans in a session of their own become ours, ended when it finishes
        from offload_planner.backend import child_guard

        child_guard.become_subreaper()
    declared = parse_device_decls(devices)
    QGuiApplication.setHighDpiScaleFactorRoundingPolicy(Qt.HighDpiScaleFactorRoundingPolicy.PassThrough)
    app = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "offload-planner"])
    assert isinstance(app, QApplication)
    app.setOrganizationName(ORGANIZATION)
    app.setApplicationName(APPLICATION)
    app.setApplicationDisplayName(APPLICATION)
    app.setWindowIcon(QIcon(str(icon_path())))
    QGuiApplication.setDesktopFileName("offload-planner")  # Wayland: match resources/offload-planner.desktop

    settings, tmp = _settings_for(settings_file, screenshot)
    win = MainWindow(settings, SystemInfo.probe(declared))
    win.allow_remote_plans = allow_remote
    status = {"code": 0}
    if screenshot:
        win.confirm_close = False
        win.resize(*size)
        shot = Path(screenshot)

        def fail(msg: str) -> None:
            if status["code"]:  # the loader's failure and the window's error dialog: one message
                return
            print(f"offload-planner: error: {msg}", file=sys.stderr)
            status["code"] = 1
            win.close()
            app.quit()

        def save() -> None:
            app.processEvents()
            pix = win.grab()
            if not pix.save(str(shot), "PNG"):
                fail(f"cannot write {shot}")
                return
            print(f"{shot}: {pix.width()}x{pix.height()}")
            win.close()
            app.quit()

        def on_analysis() -> None:
            if win.doc.analysis_current:
                win.doc.analysisChanged.disconnect(on_analysis)
                QTimer.singleShot(50, save)

        win.doc.analysisChanged.connect(on_analysis)
        win.loader.failed.connect(lambda msg, _ctx: fail(msg))
        win.errorShown.connect(fail)
        QTimer.singleShot(SCREENSHOT_TIMEOUT_MS, lambda: fail("timed out waiting for the projection"))
    restore_hook = _catch_slot_errors(win, quiet=bool(screenshot))
    win.show()
    win.open_path(model or demo_model())
    try:
        code = app.exec()
    finally:
        restore_hook()
    if tmp is not None:
        tmp.cleanup()
    return status["code"] or code
