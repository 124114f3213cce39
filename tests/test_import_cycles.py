"""No import cycles inside offload_planner: every ``import`` and ``from ... import`` of the package's
own modules, at module level or inside functions (only ``if TYPE_CHECKING:`` blocks are left out:
they never run), read from the source with ``ast``; a cycle is a strongly connected component of
more than one module.

``KNOWN`` lists the cycles other work still has to break (issue 10); the test fails on any other
cycle, and on a known one that grew."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "gui"
PACKAGE = "offload_planner"

KNOWN: list[frozenset[str]] = []  # issue 10 broke the last ones


def modules() -> dict[str, Path]:
    out = {}
    for f in (ROOT / PACKAGE).rglob("*.py"):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                skip.update(id(x) for x in ast.walk(stmt))
    return skip


def imported(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The package's modules ``name`` imports (``from a import b`` imports ``a.b`` if it is one)."""

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in mods:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_only(tree)
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [base, *(f"{base}.{a.name}" for a in node.names)]
        for t in targets:
            if t.startswith(PACKAGE) and (r := resolve(t)) is not None and r != name:
                out.add(r)
    return out


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(frozenset(comp))
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imported(name, path, mods) for name, path in mods.items()}


def test_cycle_finder_sees_function_level_imports() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]
    mods = modules()
    memory = imported("offload_planner.core.memory", mods["offload_planner.core.memory"], mods)
    assert "offload_planner.core.compute" in memory  # imported inside project()


def test_no_import_cycles_but_the_known_ones() -> None:
    found = cycles(import_graph())
    unexpected = [sorted(c) for c in found if not any(c <= k for k in KNOWN)]
    assert unexpected == []
