"""The backend dialect is asked, not tested: a ratchet on dialect conditionals outside the dialect
package (issue 10).

Counted with ``ast`` over every module of ``offload_planner`` except ``core/dialects/`` and
``core/cmdline/dialect.py`` (detecting a server's dialect from its output):

* conditionals: comparisons (``==``, ``!=``, ``is``, ``is not``, ``in``, ``not in``) with a
  particular dialect: a name literal (``"llama.cpp"``, ``"llama.cpp-2025"``, ``"ik_llama.cpp"``), a
  member ``Dialect.X`` / ``Flavor.X`` or one of the old constants (``IK_LLAMA_CPP``, ``LLAMA_CPP``,
  ``LLAMA_CPP_2025``, ``IK_DIALECT``); and flags named ``ik`` / ``is_ik`` / ``ik_mla`` tested on their
  own (``if ik:``, ``not ik``, ``a and ik``);
* literals: string constants equal to a dialect name;
* signatures: parameters named ``dialect`` annotated ``str``, ``Dialect`` or a mix (``Dialect | str``).

The numbers may only go down (lower ``LIMITS`` when they do).  Run this file as a script with a
source root to print the numbers of another checkout.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "gui"
NAMES = frozenset({"llama.cpp", "llama.cpp-2025", "ik_llama.cpp"})
CONSTANTS = frozenset({"IK_LLAMA_CPP", "LLAMA_CPP", "LLAMA_CPP_2025", "IK_DIALECT"})
IK_FLAGS = frozenset({"ik", "is_ik", "ik_mla"})
EXEMPT = ("offload_planner/core/dialects/", "offload_planner/core/cmdline/dialect.py")

#: After the dialect objects; before them (99c4fd0) this counter found 68 conditionals in 21 files,
#: 48 literals, and 26 ``str`` / 7 ``Dialect | str`` / 16 ``Dialect`` signatures.  The two literals
#: left are the names of ``ggml_types.Flavor``: a file's ggml type-id tree, named after the project
#: whose ggml defines it (``inspect`` prints them), not a server dialect; its two comparisons became a
#: table lookup (1b3fc27 had them).
LIMITS = {"conditionals": 0, "literals": 2, "str signatures": 0, "mixed signatures": 0}


def _is_dialecty(node: ast.expr) -> bool:
    """A particular dialect: its name literal, ``Dialect.X`` / ``Flavor.X`` or an old constant."""
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id in ("Dialect", "Flavor"):
            return True
        return node.attr in CONSTANTS
    return isinstance(node, ast.Name) and node.id in CONSTANTS


def _is_condition(node: ast.AST) -> bool:
    """A comparison with a dialect operand, or a flag like ``ik`` / ``ik_mla`` tested on its own."""
    if isinstance(node, ast.Compare):
        return any(map(_is_dialecty, [node.left, *node.comparators]))
    tests: list[ast.expr] = []
    if isinstance(node, ast.If | ast.IfExp | ast.While):
        tests = [node.test]
    elif isinstance(node, ast.BoolOp):
        tests = node.values
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        tests = [node.operand]
    return any(isinstance(t, ast.Name) and t.id in IK_FLAGS for t in tests)


def _annotation_kind(arg: ast.arg) -> str | None:
    if arg.arg != "dialect" or arg.annotation is None:
        return None
    parts = set(ast.unparse(arg.annotation).replace(" ", "").split("|")) - {"None"}
    if parts == {"str"}:
        return "str signatures"
    return "Dialect signatures" if parts == {"Dialect"} else "mixed signatures"


def count(root: Path = ROOT) -> tuple[Counter[str], Counter[str]]:
    """(totals, conditionals per file) for the package under ``root``."""
    totals: Counter[str] = Counter()
    per_file: Counter[str] = Counter()
    for path in sorted((root / "offload_planner").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(EXEMPT):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if _is_condition(node):
                totals["conditionals"] += 1
                per_file[rel] += 1
            elif isinstance(node, ast.Constant) and node.value in NAMES:
                totals["literals"] += 1
            elif isinstance(node, ast.arg) and (kind := _annotation_kind(node)):
                totals[kind] += 1
    return totals, per_file


def test_dialect_conditionals_and_literals_do_not_grow() -> None:
    totals, per_file = count()
    assert totals["conditionals"] > 0 or per_file == {}, "the counter must see the package"
    over = {k: (totals[k], limit) for k, limit in LIMITS.items() if totals[k] > limit}
    assert over == {}, f"dialect branches outside core/dialects grew (count, limit): {over}; {per_file}"


def test_the_counter_sees_each_kind() -> None:
    src = ('def f(dialect: str, d: Dialect) -> None:\n'
           '    if dialect == "ik_llama.cpp" or d is Dialect.IK or ik: pass\n'
           '    x = "llama.cpp-2025" if not ik_mla else 0\n')
    tree = ast.parse(src)
    assert sum(map(_is_condition, ast.walk(tree))) == 4  # ==, is, the ``or ik``, ``not ik_mla``
    consts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in NAMES]
    assert sorted(consts) == ["ik_llama.cpp", "llama.cpp-2025"]
    args = [a for a in ast.walk(tree) if isinstance(a, ast.arg)]
    assert [_annotation_kind(a) for a in args] == ["str signatures", None]


if __name__ == "__main__":
    t, files = count(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
    print(dict(t))
    print(f"{len(files)} files:", dict(files.most_common()))
