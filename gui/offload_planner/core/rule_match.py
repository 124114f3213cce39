"""Which tensor override places a tensor: the first rule whose pattern ``std::regex_search`` finds
in the tensor's name (``llama_model_loader::create_tensor``), fast and on a budget.

- A pattern is matched once per name however many rules repeat it, and results are kept while the
  rules stay the same (a plan places its tensors several times).
- A rule is tried on a name only when the literal every match of its pattern contains is in the
  name (``exps`` for ``exps=CPU``), so 10,000 rules cost what the few candidates cost.
- A pattern whose parse shows the risk of exponential backtracking is first run by a step counter
  on every name (:mod:`~offload_planner.core.cmdline.ecma_backtrack`); over the budget, the rule
  is *broken*: it matches nothing and :attr:`RuleSet.errors` says why, naming the rule, instead of
  a hang (``std::regex`` would stall the same way).  A pattern nested too deep for the planner is
  broken too.  Callers turn :attr:`RuleSet.errors` into a :class:`RuleError` (the CLI) or a
  problem (the window), so placement itself never fails on a rule.
- A pattern ``std::regex`` refuses matches nothing (the refusal is reported by the argument checks).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence, Sized
from functools import lru_cache
from typing import TYPE_CHECKING

from offload_planner.core.cmdline.ecma_backtrack import OverBudget, StepCounter
from offload_planner.core.cmdline.ecma_regex import PatternCheck, check_pattern
from offload_planner.core.errors import RuleError

if TYPE_CHECKING:
    from offload_planner.core.placement import Override

#: Backtracking steps one name may take (std::regex needs about as many; 10^5 is milliseconds).
NAME_STEPS = 100_000
#: Steps one risky pattern may take over all names of a model.
RULE_STEPS = 1_000_000
_NEVER = re.compile(r"(?!)")


def rule_label(o: Override) -> str:
    """``-ot 'PATTERN=CPU'`` as messages name a rule (a long pattern shortened)."""
    pattern = o.pattern if len(o.pattern) <= 60 else o.pattern[:57] + "..."
    return f"{o.source} '{pattern}={o.buft}'"


class _Pattern:
    """One distinct pattern of a rule set and the rules that use it."""

    def __init__(self, check: PatternCheck) -> None:
        self.check = check
        self.members: list[int] = []
        self.steps = 0
        self.broken: str | None = None  # why the planner does not evaluate it
        self._regex: re.Pattern[str] | None = None

    @property
    def regex(self) -> re.Pattern[str]:
        if self._regex is None:
            py = self.check.python
            try:
                self._regex = _NEVER if py is None else re.compile(py, re.ASCII)
            except (re.error, RecursionError, OverflowError):  # pragma: no cover - a translation bug
                self._regex = _NEVER
        return self._regex


class RuleSet:
    """Tensor overrides in command-line order, matched against tensor names."""

    def __init__(self, rules: Sequence[Override]) -> None:
        self.rules = tuple(rules)
        self.patterns: list[_Pattern] = []
        self.pattern_of: list[int] = []  # rule index -> index into patterns
        seen: dict[str, int] = {}
        for i, o in enumerate(self.rules):
            u = seen.get(o.pattern)
            if u is None:
                u = seen[o.pattern] = len(self.patterns)
                self.patterns.append(_Pattern(check_pattern(o.pattern)))
            self.patterns[u].members.append(i)
            self.pattern_of.append(u)
        for p in self.patterns:
            if p.check.limit is not None:
                p.broken = (f"{rule_label(self.rules[p.members[0]])}: {p.check.limit}; the "
                            "planner does not evaluate patterns nested that deep")
        self._always: list[int] = []  # patterns without a required literal: tried on every name
        self._by_literal: dict[str, list[int]] = {}
        for u, p in enumerate(self.patterns):
            if p.check.python is None:
                continue  # std::regex refuses it, or it is broken: matches nothing
            if p.check.required:
                self._by_literal.setdefault(p.check.required, []).append(u)
            else:
                self._always.append(u)
        self._lengths = sorted({len(k) for k in self._by_literal})
        self._risky = [u for u, p in enumerate(self.patterns) if p.check.may_backtrack]
        self._hits: dict[str, tuple[int, ...]] = {}
        self._lock = threading.Lock()

    @property
    def errors(self) -> list[str]:
        """One message per broken rule (in rule order): nested too deep, or backtracks too much
        on the names matched so far."""
        return [p.broken for p in self.patterns if p.broken is not None]

    def raise_errors(self) -> None:
        """:class:`RuleError` for the first broken rule, if any."""
        if errors := self.errors:
            raise RuleError(errors[0])

    def first_of_all(self, index: NameIndex) -> list[int | None] | None:
        """:meth:`first` of every name of ``index`` at once, or None where the per-name path must run
        (a pattern to budget, or too many patterns to scan the names for each).  Each pattern's matches
        come from ``index``, which keeps them for the next rule set that repeats the pattern (the
        ``--fit`` search places the model ~25 times with mostly the same per-layer rules)."""
        if self._risky or len(self.patterns) > BULK_PATTERNS:
            return None
        out: list[int | None] = [None] * len(index.names)
        for p in self.patterns:  # in order of first use: an earlier rule wins
            if p.broken is not None or p.check.python is None:
                continue
            rule = p.members[0]
            for i in index.matching(p):
                if out[i] is None:
                    out[i] = rule
        return out

    def matches_of_all(self, index: NameIndex) -> list[tuple[int, ...]] | None:
        """Per pattern (in :attr:`patterns`' order) the names of ``index`` it matches, () for one that
        matches nothing (refused or broken); None where the per-name path (:meth:`hits`) must run, as
        for :meth:`first_of_all`."""
        if self._risky or len(self.patterns) > BULK_PATTERNS:
            return None
        return [() if p.broken is not None or p.check.python is None else index.matching(p)
                for p in self.patterns]

    def first(self, name: str) -> int | None:
        """Index of the rule that places ``name`` (the first that matches), None if none does."""
        hits = self.hits(name)
        return self.patterns[hits[0]].members[0] if hits else None

    def hits(self, name: str) -> tuple[int, ...]:
        """Indices (into :attr:`patterns`, ascending) of the patterns that match ``name``."""
        got = self._hits.get(name)
        if got is None:
            with self._lock:
                got = self._hits.get(name)
                if got is None:
                    got = self._hits[name] = self._match(name)
        return got

    def _match(self, name: str) -> tuple[int, ...]:
        for u in self._risky:
            if self.patterns[u].broken is None:
                self._count_steps(u, name)
        cands = set(self._always)
        by_literal = self._by_literal
        if len(by_literal) <= len(name):  # a few literals: a substring search each
            for lit, lit_us in by_literal.items():
                if lit in name:
                    cands.update(lit_us)
        else:  # many: look up every substring of a literal's length
            for n in self._lengths:
                for i in range(len(name) - n + 1):
                    us = by_literal.get(name[i : i + n])
                    if us is not None:
                        cands.update(us)
        if not cands:
            return ()
        ps = self.patterns
        return tuple(u for u in sorted(cands) if ps[u].broken is None and ps[u].regex.search(name))

    def _count_steps(self, u: int, name: str) -> None:
        p = self.patterns[u]
        assert p.check.python is not None
        counter = StepCounter(p.check.python, min(NAME_STEPS, RULE_STEPS - p.steps))
        label = rule_label(self.rules[p.members[0]])
        try:
            counter.search(name)
        except OverBudget as over:
            p.broken = _over_budget(label, name, over.deep, counter.state.steps,
                                    p.steps + counter.state.steps >= RULE_STEPS)
        p.steps += counter.state.steps


def _over_budget(label: str, name: str, deep: bool, steps: int, total: bool) -> str:
    if deep:
        return (f"{label}: the pattern backtracks too deep on {name!r} for the planner to evaluate "
                f"(over {steps:,} steps); llama.cpp's std::regex backtracks the same way and would "
                "stall or overflow its stack on it")
    if total:
        return (f"{label}: the pattern backtracks too much on tensor names (over {RULE_STEPS:,} "
                "steps over the model's tensors); llama.cpp's std::regex backtracks the same way "
                "and would stall on it")
    return (f"{label}: the pattern backtracks catastrophically on tensor names (over "
            f"{NAME_STEPS:,} steps on {name!r}); llama.cpp's std::regex backtracks the same way "
            "and would stall or crash on it")


#: the most patterns :meth:`RuleSet.first_of_all` scans the names for, one pattern at a time
BULK_PATTERNS = 512


class NameIndex:
    """One model's tensor names and, per required literal and per pattern, the names holding or
    matching it (indices into :attr:`names`), kept across rule sets."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self._with: dict[str, tuple[int, ...]] = {}
        self._matches: dict[str, tuple[int, ...]] = {}
        self._lock = threading.Lock()

    def matching(self, p: _Pattern) -> tuple[int, ...]:
        py = p.check.python
        assert py is not None
        got = self._matches.get(py)
        if got is None:
            with self._lock:
                names, lit = self.names, p.check.required
                cands = self._containing(lit) if lit else range(len(names))
                search = p.regex.search
                got = self._matches[py] = tuple(i for i in cands if search(names[i]))
        return got

    def _containing(self, lit: str) -> tuple[int, ...]:
        got = self._with.get(lit)
        if got is None:
            got = self._with[lit] = tuple(i for i, n in enumerate(self.names) if lit in n)
        return got


_INDEXES: OrderedDict[int, tuple[Sized, NameIndex]] = OrderedDict()
_INDEX_LOCK = threading.Lock()


def name_index(key: Sized, names: Callable[[], Sequence[str]]) -> NameIndex:
    """The (cached) :class:`NameIndex` of ``names()``, kept while ``key`` (a model's tensor list, held
    here so its id stays unique) is among the last few asked for."""
    with _INDEX_LOCK:
        e = _INDEXES.get(id(key))
        if e is None or e[0] is not key or len(e[1].names) != len(key):
            e = _INDEXES[id(key)] = (key, NameIndex(tuple(names())))
            if len(_INDEXES) > 4:
                _INDEXES.popitem(last=False)
        _INDEXES.move_to_end(id(key))
        return e[1]


@lru_cache(maxsize=8)
def rule_set(rules: tuple[Override, ...]) -> RuleSet:
    """The (cached) matcher of these rules."""
    return RuleSet(rules)
