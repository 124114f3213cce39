"""The pinned build's draft length default lives in one place (leftovers6): ``core.spec_defaults``.
``Dialect.draft_n_max`` returned a literal 3 beside ``core.speculative.DEFAULT_N_MAX = 3`` and an unused
``handlers_spec.DEFAULT_DRAFT_N_MAX = 3`` (the dialect could not import ``core.speculative``: it imports
the dialects); now the dialect, the speculative settings and the draft types all read that module, which
imports nothing of the planner, so it cannot close a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import offload_planner.core.spec_defaults as spec_defaults
from offload_planner.core.cmdline.model import DraftArgs
from offload_planner.core.dialects import Dialect
from offload_planner.core.speculative import SpecSettings


def test_the_pinned_default_is_the_one_constant() -> None:
    assert Dialect("llama.cpp").draft_n_max(DraftArgs()) == spec_defaults.DEFAULT_DRAFT_N_MAX == 3
    assert SpecSettings().n_max == spec_defaults.DEFAULT_DRAFT_N_MAX
    assert Dialect("llama.cpp").draft_n_max(DraftArgs(n_max=7)) == 7


def test_the_constants_module_imports_nothing_of_the_planner() -> None:
    tree = ast.parse(Path(spec_defaults.__file__).read_text(encoding="utf-8"))
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert imported == ["__future__"]


def test_no_module_repeats_it() -> None:
    """No other module of the package binds a draft-length default to 3 of its own."""
    root = Path(spec_defaults.__file__).resolve().parents[1]
    repeats = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)):
                continue
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if node.value.value == 3 and any("N_MAX" in n for n in names):
                repeats.append(f"{path.relative_to(root)}:{node.lineno}")
    assert repeats == ["core/spec_defaults.py:14"]
