"""How much a backtracking matcher works to search a tensor name with an ``-ot`` pattern.

libstdc++'s ``std::regex`` (what llama.cpp matches ``-ot`` patterns with) and Python's ``re`` are
both depth-first backtrackers: on ``(.+)+Z`` they try every way to split a name among the
iterations, 2^n for a name of n characters, and never return.  The planner cannot interrupt
``re``, so before matching a pattern whose parse shows that risk (a repeat inside a repeat, an
alternation or back-reference inside a repeat, five or more repeats) it counts the steps a plain
ECMAScript backtracker takes on each name, up to a budget.  Patterns without that risk are at
worst a polynomial of degree 5 in the name length, which llama.cpp bounds (``GGML_MAX_NAME``:
63 bytes), and they are only run on names holding the literal each of their matches contains.

The matcher is built from Python's own parse of the translated pattern (``re._parser``), the
structure ``re`` executes; it counts steps and decides nothing the planner shows.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

_parser: Any = importlib.import_module("re._parser")
_c: Any = importlib.import_module("re._constants")

Cont = Callable[[int], bool]
Matcher = Callable[[int, Cont], bool]

_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_DIGIT = frozenset("0123456789")
_SPACE = frozenset(" \t\n\r\f\v")
_CATEGORY: dict[Any, Callable[[str], bool]] = {
    _c.CATEGORY_DIGIT: lambda ch: ch in _DIGIT,
    _c.CATEGORY_NOT_DIGIT: lambda ch: ch not in _DIGIT,
    _c.CATEGORY_SPACE: lambda ch: ch in _SPACE,
    _c.CATEGORY_NOT_SPACE: lambda ch: ch not in _SPACE,
    _c.CATEGORY_WORD: lambda ch: ch in _WORD,
    _c.CATEGORY_NOT_WORD: lambda ch: ch not in _WORD,
}


class OverBudget(Exception):
    """The search took more steps than the budget (``deep``: it recursed deeper than Python allows)."""

    def __init__(self, deep: bool = False) -> None:
        super().__init__()
        self.deep = deep


class _State:
    __slots__ = ("budget", "caps", "s", "steps")

    def __init__(self, budget: int) -> None:
        self.s = ""
        self.steps = 0
        self.budget = budget
        self.caps: dict[int, tuple[int, int]] = {}

    def tick(self) -> None:
        self.steps += 1
        if self.steps > self.budget:
            raise OverBudget


def _is(c: str) -> Callable[[str], bool]:
    return lambda ch: ch == c


def _is_not(c: str) -> Callable[[str], bool]:
    return lambda ch: ch != c


def _in_range(lo: int, hi: int) -> Callable[[str], bool]:
    return lambda ch: lo <= ord(ch) <= hi


def _char_set(items: list[tuple[Any, Any]]) -> Callable[[str], bool]:
    negate = bool(items) and items[0][0] is _c.NEGATE
    tests: list[Callable[[str], bool]] = []
    for op, av in items[1:] if negate else items:
        if op is _c.LITERAL:
            tests.append(_is(chr(av)))
        elif op is _c.RANGE:
            tests.append(_in_range(av[0], av[1]))
        elif op is _c.CATEGORY:
            tests.append(_CATEGORY[av])
        else:  # pragma: no cover - the translation emits nothing else inside a set
            raise ValueError(f"unexpected set item {op}")
    if negate:
        return lambda ch: not any(t(ch) for t in tests)
    return lambda ch: any(t(ch) for t in tests)


class _Builder:
    def __init__(self, st: _State) -> None:
        self.st = st

    def seq(self, nodes: list[tuple[Any, Any]]) -> Matcher:
        ms = [self.node(op, av) for op, av in nodes]

        def chain(i: int) -> Matcher:
            if i == len(ms):
                return lambda pos, k: k(pos)
            first, rest = ms[i], chain(i + 1)
            return lambda pos, k: first(pos, lambda p: rest(p, k))

        return chain(0)

    def char(self, test: Callable[[str], bool]) -> Matcher:
        st = self.st

        def m(pos: int, k: Cont) -> bool:
            st.tick()
            return pos < len(st.s) and test(st.s[pos]) and k(pos + 1)

        return m

    def node(self, op: Any, av: Any) -> Matcher:
        st = self.st
        if op is _c.LITERAL:
            return self.char(_is(chr(av)))
        if op is _c.NOT_LITERAL:
            return self.char(_is_not(chr(av)))
        if op is _c.ANY:
            return self.char(lambda ch: ch != "\n")
        if op is _c.IN:
            return self.char(_char_set(list(av)))
        if op is _c.AT:
            return self.at(av)
        if op is _c.BRANCH:
            alts = [self.seq(list(a)) for a in av[1]]

            def branch(pos: int, k: Cont) -> bool:
                st.tick()
                for a in alts:  # noqa: SIM110 - not any(): Python-to-Python calls only, no C stack
                    if a(pos, k):
                        return True
                return False

            return branch
        if op is _c.SUBPATTERN:
            return self.group(av[0], self.seq(list(av[3])))
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
            lo, hi = av[0], (None if av[1] is _c.MAXREPEAT else av[1])
            return self.repeat(lo, hi, self.seq(list(av[2])), greedy=op is _c.MAX_REPEAT)
        if op in (_c.ASSERT, _c.ASSERT_NOT):
            body = self.seq(list(av[1]))
            want = op is _c.ASSERT
            return lambda pos, k: body(pos, lambda p: True) is want and k(pos)
        if op is _c.GROUPREF:
            return self.backref(av)
        raise ValueError(f"unexpected opcode {op}")  # pragma: no cover

    def at(self, code: Any) -> Matcher:
        st = self.st

        def word(pos: int) -> bool:
            return 0 <= pos < len(st.s) and st.s[pos] in _WORD

        tests: dict[Any, Callable[[int], bool]] = {
            _c.AT_BEGINNING: lambda pos: pos == 0,
            _c.AT_BEGINNING_STRING: lambda pos: pos == 0,
            _c.AT_END: lambda pos: pos == len(st.s),
            _c.AT_END_STRING: lambda pos: pos == len(st.s),
            _c.AT_BOUNDARY: lambda pos: word(pos - 1) != word(pos),
            _c.AT_NON_BOUNDARY: lambda pos: word(pos - 1) == word(pos),
        }
        test = tests[code]
        return lambda pos, k: test(pos) and k(pos)

    def group(self, index: int | None, body: Matcher) -> Matcher:
        if index is None:
            return body
        caps = self.st.caps

        def m(pos: int, k: Cont) -> bool:
            def after(p: int) -> bool:
                prev = caps.get(index)
                caps[index] = (pos, p)
                if k(p):
                    return True
                if prev is None:
                    caps.pop(index, None)
                else:
                    caps[index] = prev
                return False

            return body(pos, after)

        return m

    def backref(self, index: int) -> Matcher:
        st = self.st

        def m(pos: int, k: Cont) -> bool:
            a, b = st.caps.get(index, (0, 0))
            text = st.s[a:b]
            st.steps += len(text)
            st.tick()
            return st.s.startswith(text, pos) and k(pos + len(text))

        return m

    def repeat(self, lo: int, hi: int | None, body: Matcher, *, greedy: bool) -> Matcher:
        st = self.st

        def rep(pos: int, k: Cont, count: int) -> bool:
            st.tick()
            if hi is not None and count >= hi:
                return k(pos)
            if count < lo:
                return body(pos, lambda p: rep(p, k, count + 1))

            def more() -> bool:  # ECMAScript: an iteration past the minimum may not be empty
                return body(pos, lambda p: p != pos and rep(p, k, count + 1))

            return (more() or k(pos)) if greedy else (k(pos) or more())

        return lambda pos, k: rep(pos, k, 0)


class StepCounter:
    """Searches names with one translated pattern, counting backtracking steps."""

    def __init__(self, python_pattern: str, budget: int) -> None:
        self.state = _State(budget)
        self.matcher = _Builder(self.state).seq(list(_parser.parse(python_pattern, 0)))

    def search(self, name: str) -> bool:
        """Whether the pattern matches somewhere in ``name``; raises :class:`OverBudget`."""
        st = self.state
        st.s, st.steps = name, 0
        try:
            for start in range(len(name) + 1):
                st.caps.clear()
                if self.matcher(start, lambda p: True):
                    return True
        except RecursionError:
            raise OverBudget(deep=True) from None
        return False
