"""The core must stay free of Qt: checked statically (imports) and dynamically (sys.modules)."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import offload_planner.core

QT_MODULES = ("PySide6", "shiboken6", "pyqtgraph", "PyQt5", "PyQt6")
CORE_DIR = Path(offload_planner.core.__file__).parent


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_core_sources_do_not_import_qt() -> None:
    files = sorted(CORE_DIR.rglob("*.py"))
    assert len(files) > 5
    offenders = {
        str(f.relative_to(CORE_DIR)): sorted(m for m in _imported_modules(f) if m.split(".")[0] in QT_MODULES)
        for f in files
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_importing_every_core_module_loads_no_qt() -> None:
    names = [m.name for m in pkgutil.walk_packages(offload_planner.core.__path__, "offload_planner.core.")]
    assert "offload_planner.core.gguf_reader" in names
    code = (
        "import importlib, sys\n"
        f"for n in {names!r}:\n"
        "    importlib.import_module(n)\n"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {QT_MODULES!r}]\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
