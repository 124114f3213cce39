"""``-ot`` patterns as llama.cpp reads them: ``std::regex`` (ECMAScript grammar, libstdc++).

:func:`check_pattern` validates a pattern the way libstdc++'s ``std::regex`` constructor does and
returns the ``what()`` text it would throw (llama.cpp prints ``llama_model_load: error loading
model: <what>`` and the server exits), warnings for constructs that mean something else than in
Python/PCRE, and an equivalent Python ``re`` pattern so the planner can preview matches.

The error texts were captured from libstdc++ (GCC 12, the compiler of the pinned build) on the same
patterns; MSVC builds word their errors differently.  The NFA state limit check is approximate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from offload_planner.core.errors import PlannerError

PAREN = "Mismatched '(' and ')' in regular expression"
BRACE = "Mismatched '{' and '}' in regular expression"
BAD_BRACE = "Invalid range in '{}' in regular expression"
BRACKET = "Unexpected character within '[...]' in regular expression"
RANGE_ORDER = "Invalid range in bracket expression."
RANGE_START = "Invalid start of '[x-x]' range in regular expression"
RANGE_END = "Invalid end of '[x-x]' range in regular expression"
CTYPE = "Invalid character class."
CTYPE_SYNTAX = "Invalid character class in regular expression"
COLLATE = "Invalid collating element in regular expression"
INCOMPLETE_CLASS = "Incomplete '[[' character class in regular expression"
EQUIVALENCE = "Invalid equivalence class."
COLLATE_NAME = "Invalid collate element."
ESCAPE_BRACKET = "Invalid escape in regular expression"
ESCAPE_END = "Invalid escape at end of regular expression"
CTRL = "invalid '\\cX' control character in regular expression"
HEX = "Invalid '\\xNN' control character in regular expression"
UNICODE = "Invalid '\\uNNNN' control character in regular expression"
BACKREF_COUNT = "Back-reference index exceeds current sub-expression count."
BACKREF_OPEN = "Back-reference referred to an opened sub-expression."
ASSERTION = "Invalid '(?...)' zero-width assertion in regular expression"
STATES = (
    "Number of NFA states exceeds limit. Please use shorter regex string, or use smaller brace "
    "expression, or make _GLIBCXX_REGEX_STATE_LIMIT larger."
)
_STATE_LIMIT = 100_000
#: Characters that stand for themselves, and ``\.``: a pattern of only these is translated without
#: the parser, and runs of them are read in one step (10,000 -ot rules).
_PLAIN = re.compile(r"(?:[A-Za-z0-9_=,:;'\"/<>@#%&~!` -]|\\\.)+")
#: Groups (and chained quantifiers) nested deeper than this are refused by the planner: its parser
#: and Python's ``re`` recurse on them (1,000 levels were a RecursionError).
MAX_NESTING = 100

_POSIX_CLASSES = {
    "alnum": "a-zA-Z0-9",
    "alpha": "a-zA-Z",
    "blank": " \\t",
    "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9",
    "d": "0-9",
    "graph": "\\x21-\\x7e",
    "lower": "a-z",
    "print": "\\x20-\\x7e",
    "punct": re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
    "space": " \\t\\n\\r\\f\\v",
    "s": " \\t\\n\\r\\f\\v",
    "upper": "A-Z",
    "w": "a-zA-Z0-9_",
    "xdigit": "0-9A-Fa-f",
}
_CLASS_ESCAPES = "dDsSwW"
_CONTROL_ESCAPES = {"f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
# Escapes that are a plain literal in ECMAScript but special in Python or PCRE.
_MISREAD_ESCAPES = {
    "A": "start of string",
    "Z": "end of string",
    "z": "end of string",
    "G": "start of match",
    "Q": "start of a quoted span",
    "E": "end of a quoted span",
    "K": "match reset",
    "R": "any line break",
    "X": "extended grapheme",
    "h": "horizontal whitespace",
    "H": "non-horizontal-whitespace",
    "p": "Unicode property",
    "P": "negated Unicode property",
    "k": "named back-reference",
    "g": "back-reference",
    "N": "non-newline / named character",
    "e": "escape character",
    "a": "bell character",
}


# POSIX collating-element names libstdc++ knows (punctuation subset; letters and digits are single chars).
_COLLATE_NAMES = {
    "space": " ",
    "exclamation-mark": "!",
    "quotation-mark": '"',
    "number-sign": "#",
    "dollar-sign": "$",
    "percent-sign": "%",
    "ampersand": "&",
    "apostrophe": "'",
    "left-parenthesis": "(",
    "right-parenthesis": ")",
    "asterisk": "*",
    "plus-sign": "+",
    "comma": ",",
    "hyphen": "-",
    "period": ".",
    "slash": "/",
    "colon": ":",
    "semicolon": ";",
    "less-than-sign": "<",
    "equals-sign": "=",
    "greater-than-sign": ">",
    "question-mark": "?",
    "commercial-at": "@",
    "left-square-bracket": "[",
    "backslash": "\\",
    "right-square-bracket": "]",
    "circumflex": "^",
    "underscore": "_",
    "grave-accent": "`",
    "left-curly-bracket": "{",
    "vertical-line": "|",
    "right-curly-bracket": "}",
    "tilde": "~",
}


class EcmaRegexError(ValueError):
    """A pattern ``std::regex`` rejects; ``str()`` is libstdc++'s ``what()`` text."""


class PatternLimitError(PlannerError):
    """A pattern llama.cpp may accept but the planner does not evaluate (nested too deep)."""


@dataclass
class PatternCheck:
    pattern: str
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    python: str | None = None  # equivalent pattern for ``re.compile(python, re.ASCII)``
    limit: str | None = None  # why the planner does not evaluate it (llama.cpp may accept it)
    required: str = ""  # a literal every match contains (a necessary condition for a match)
    may_backtrack: bool = False  # nested or many repeats: matching may take exponential time

    @property
    def ok(self) -> bool:
        return self.error is None


def _esc(ch: str) -> str:
    """One character as a Python pattern that matches exactly it (inside or outside a class)."""
    if ch.isalnum() and ch.isascii():
        return ch
    if ch == "\n":
        return "\\n"
    if ord(ch) < 0x20 or ord(ch) == 0x7F:
        return f"\\x{ord(ch):02x}"
    return "\\" + ch if ch in "\\^$.|?*+()[]{}-&~#" or ch in " \t" else ch


_ESC_PLAIN = str.maketrans({c: _esc(c) for c in "=,:;'\"/<>@#%&~!` -."})


@dataclass
class _Node:
    """A parsed term: its Python text, an estimate of libstdc++ NFA states, and what the planner
    needs to match it fast and safely: the literal it always matches (``exact``), a literal every
    match contains (``required``), how many repeats it holds and whether a repeat holds another
    repeat, an alternation or a back-reference (``risky``: backtracking may be exponential)."""

    py: str
    states: int
    quantified: bool = False
    exact: str | None = None
    required: str = ""
    reps: int = 0
    risky: bool = False
    branch: bool = False


def _concat(nodes: list[_Node]) -> _Node:
    """What a sequence of terms always matches and must contain (Python text and states aside)."""
    best, run, exact = "", "", True
    for n in nodes:
        if n.exact is not None:
            run += n.exact
            continue
        exact = False
        best = max(best, run, n.required, key=len)
        run = ""
    return _Node("", 0, exact=run if exact else None, required=max(best, run, key=len),
                 reps=sum(n.reps for n in nodes), risky=any(n.risky for n in nodes),
                 branch=any(n.branch for n in nodes))


class _Limit(Exception):
    """Internal: the pattern is beyond what the planner evaluates."""


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.p = pattern
        self.i = 0
        self.groups_opened = 0
        self.open_groups: list[int] = []
        self.warnings: list[str] = []
        self.depth = 0
        self.info = _Node("", 0)

    # -- helpers
    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.p[j] if j < len(self.p) else ""

    def at_end(self) -> bool:
        return self.i >= len(self.p)

    def fail_after_token(self, message: str, in_bracket: bool) -> EcmaRegexError:
        """An error the compiler raises after consuming a token: libstdc++'s scanner has already
        read the next token by then, so an error in that token is what gets reported."""
        return EcmaRegexError(self.lookahead_error(in_bracket) or message)

    def lookahead_error(self, in_bracket: bool) -> str | None:
        """The error libstdc++'s scanner raises while reading the token at the current position."""
        c, nxt = self.peek(), self.peek(1)
        if c == "\\":
            if nxt == "":
                return ESCAPE_BRACKET if in_bracket else ESCAPE_END
            return self.escape_syntax_error(self.i + 1)
        if in_bracket:
            if c == "[" and nxt == "":
                return INCOMPLETE_CLASS
            if c == "[" and nxt in (":", ".", "=") and self.p.find(nxt + "]", self.i + 2) < 0:
                return CTYPE_SYNTAX if nxt == ":" else COLLATE
            return None
        if c == "(" and nxt == "?":
            after = self.peek(2)
            if after == "":
                return PAREN
            if after not in (":", "=", "!"):
                return ASSERTION
        return None

    def escape_syntax_error(self, at: int) -> str | None:
        """Scanner error of the escape whose letter is at ``at`` (\\c, \\x, \\u need more)."""
        c = self.p[at]
        if c == "c" and at + 1 >= len(self.p):
            return CTRL
        if c in "xu":
            n = 2 if c == "x" else 4
            digits = self.p[at + 1 : at + 1 + n]
            if len(digits) < n or not all(d in "0123456789abcdefABCDEF" for d in digits):
                return HEX if c == "x" else UNICODE
        return None

    def warn(self, msg: str) -> None:
        if msg not in self.warnings:
            self.warnings.append(msg)

    # -- grammar
    def parse(self) -> tuple[str, int]:
        node = self.disjunction()
        if not self.at_end():
            raise EcmaRegexError(PAREN)
        if node.states + 7 > _STATE_LIMIT:
            raise EcmaRegexError(STATES)
        self.info = node
        return node.py, node.states + 7

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise _Limit(f"groups nested more than {MAX_NESTING} deep")

    def disjunction(self) -> _Node:
        alts = [self.alternative()]
        while self.peek() == "|":
            self.i += 1
            alts.append(self.alternative())
        if len(alts) == 1:
            return alts[0]
        return _Node("|".join(a.py for a in alts), sum(a.states for a in alts) + 3 * (len(alts) - 1),
                     reps=sum(a.reps for a in alts), risky=any(a.risky for a in alts), branch=True)

    def alternative(self) -> _Node:
        nodes: list[_Node] = []
        states = 0
        while not self.at_end() and self.peek() not in "|)":
            node = self.run() or self.term()
            if node is None:
                break
            nodes.append(node)
            states += node.states
            if states > _STATE_LIMIT:
                raise EcmaRegexError(STATES)
        out = _concat(nodes)
        out.py, out.states = "".join(n.py for n in nodes), states
        return out

    def run(self) -> _Node | None:
        """Two or more plain characters (or ``\\.``) at once, the last left to :meth:`term` when
        a quantifier follows it: what most of an -ot pattern is, read in one step."""
        m = _PLAIN.match(self.p, self.i)
        if m is None:
            return None
        src = m.group()
        if m.end() < len(self.p) and self.p[m.end()] in "*+?{":
            src = src[:-2] if src.endswith("\\.") else src[:-1]
        text = src.replace("\\.", ".")
        if len(text) < 2:
            return None
        self.i += len(src)
        return _Node(text.translate(_ESC_PLAIN), len(text), exact=text, required=text)

    def term(self) -> _Node | None:
        assertion = self.assertion()
        if assertion is not None:
            return assertion
        node = self.atom()
        if node is None:
            return None
        chain = 0
        while (quantified := self.quantifier(node)) is not None:
            node = quantified
            chain += 1
            if self.depth + chain > MAX_NESTING:
                raise _Limit(f"quantifiers and groups nested more than {MAX_NESTING} deep")
        return node

    def assertion(self) -> _Node | None:
        c = self.peek()
        if c == "^":
            self.i += 1
            return _Node("^", 1, exact="")
        if c == "$":
            self.i += 1
            return _Node("\\Z", 1, exact="")
        if c == "\\" and self.peek(1) in ("b", "B"):
            self.i += 2
            # Python's \B never matches an empty string; ECMAScript's does.
            return _Node("\\b" if self.p[self.i - 1] == "b" else "(?:\\B|\\A\\Z)", 1, exact="")
        if c == "(" and self.peek(1) == "?" and self.peek(2) in ("=", "!"):
            kind = self.peek(2)
            self.i += 3
            self.enter()
            inner = self.disjunction()
            self.expect_close()
            self.depth -= 1
            return _Node(f"(?{kind}{inner.py})", inner.states + 3, exact="", reps=inner.reps,
                         risky=inner.risky, branch=inner.branch)
        return None

    def expect_close(self) -> None:
        if self.peek() != ")":
            raise EcmaRegexError(PAREN)
        self.i += 1

    def atom(self) -> _Node | None:
        c = self.peek()
        if c == "" or c in "*+?{)|":
            return None
        if c == ".":
            self.i += 1
            return _Node("[^\\n\\r\\u2028\\u2029]", 1)
        if c == "(":
            return self.group()
        if c == "[":
            return self.bracket()
        if c == "\\":
            return self.escape()
        self.i += 1
        return _Node(_esc(c), 1, exact=c, required=c)

    def group(self) -> _Node:
        self.i += 1
        if self.peek() == "?":
            if self.peek(1) == "":
                raise EcmaRegexError(PAREN)
            if self.peek(1) != ":":
                self.warn_python_group()
                raise EcmaRegexError(ASSERTION)
            self.i += 2
            self.enter()
            inner = self.disjunction()
            self.expect_close()
            self.depth -= 1
            return _Node(f"(?:{inner.py})", inner.states + 2, False, inner.exact, inner.required,
                         inner.reps, inner.risky, inner.branch)
        self.groups_opened += 1
        self.open_groups.append(self.groups_opened)
        self.enter()
        inner = self.disjunction()
        self.expect_close()
        self.depth -= 1
        self.open_groups.pop()
        return _Node(f"({inner.py})", inner.states + 3, False, inner.exact, inner.required,
                     inner.reps, inner.risky, inner.branch)

    def warn_python_group(self) -> None:
        rest = self.p[self.i :]
        names = (
            ("?<=", "lookbehind"),
            ("?<!", "negative lookbehind"),
            ("?P<", "named groups"),
            ("?P=", "named back-references"),
            ("?<", "named groups"),
            ("?>", "atomic groups"),
            ("?#", "comments"),
        )
        for prefix, what in names:
            if rest.startswith(prefix):
                self.warn(f"std::regex (ECMAScript) has no {what}: '({prefix}' is rejected")
                return
        if re.match(r"\?[aiLmsux-]+[:)]", rest):
            self.warn("std::regex (ECMAScript) has no inline flags such as '(?i)'")

    def escape(self) -> _Node:
        self.i += 1
        if self.at_end():
            raise EcmaRegexError(ESCAPE_END)
        c = self.p[self.i]
        self.i += 1
        if c in _CLASS_ESCAPES:
            return _Node("\\" + c, 1)
        if c.isdigit():
            return self.backref(c)
        ch = self.escaped_char(c)
        return _Node(_esc(ch), 1, exact=ch, required=ch)

    def escaped_char(self, c: str) -> str:
        """The character an escape other than a class/assertion/backref stands for."""
        if c in _CONTROL_ESCAPES:
            return _CONTROL_ESCAPES[c]
        if c == "c":
            if self.at_end():
                raise EcmaRegexError(CTRL)
            self.i += 1
            letter = self.p[self.i - 1]
            self.warn(
                f"'\\c{letter}' matches a literal '{letter}' in libstdc++'s std::regex, "
                "not a control character"
            )
            return letter
        if c in "xu":
            n = 2 if c == "x" else 4
            digits = self.p[self.i : self.i + n]
            if len(digits) < n or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise EcmaRegexError(HEX if c == "x" else UNICODE)
            self.i += n
            return chr(int(digits, 16))
        if c in _MISREAD_ESCAPES:
            self.warn(
                f"'\\{c}' is a literal '{c}' in std::regex (ECMAScript), not the "
                f"{_MISREAD_ESCAPES[c]} it is in Python/PCRE"
            )
        return c

    def backref(self, first: str) -> _Node:
        if first == "0":
            return _Node("\\x00", 1, exact="\0", required="\0")
        digits = first
        while self.peek().isdigit():
            digits += self.peek()
            self.i += 1
        index = int(digits)
        if index in self.open_groups:
            raise self.fail_after_token(BACKREF_OPEN, in_bracket=False)
        if index > self.groups_opened:
            raise self.fail_after_token(BACKREF_COUNT, in_bracket=False)
        if index >= 100:
            self.warn(f"back-reference \\{index} cannot be previewed with Python re")
            return _Node("(?:)", 1, risky=True)
        return _Node(f"(?:\\{index})", 1, risky=True)

    # -- quantifiers
    def quantifier(self, node: _Node) -> _Node | None:
        c = self.peek()
        if c in ("*", "+", "?"):
            self.i += 1
            quant, lo, hi = c, (1 if c == "+" else 0), (1 if c == "?" else None)
        elif c == "{":
            quant, lo, hi = self.brace()
        else:
            return None
        if self.peek() == "?":
            self.i += 1
            quant += "?"
        states = node.states + 2 if c == "?" else _repeat_states(node.states, lo, hi)
        if states > _STATE_LIMIT:
            raise EcmaRegexError(STATES)
        base = node.py
        if node.quantified:
            if quant[0] in "*+?":
                self.warn(
                    f"'{quant}' after a quantifier is not possessive in std::regex: it repeats "
                    "the quantified atom again"
                )
            base = f"(?:{base})"
        return _quantified(node, base + quant, states, lo, hi)

    def brace(self) -> tuple[str, int, int | None]:
        """``{n}``, ``{n,}`` or ``{n,m}``: libstdc++ wants a count first, then ``,`` and ``}``."""
        m = re.match(r"\{(\d+)(,(\d*))?", self.p[self.i :])
        if not m:
            raise EcmaRegexError(BAD_BRACE)
        after = self.i + m.end()
        if after >= len(self.p):
            raise EcmaRegexError(BRACE)
        if self.p[after] != "}":
            raise EcmaRegexError(BAD_BRACE)
        lo = int(m.group(1))
        hi: int | None = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
        if hi is not None and hi < lo:
            raise EcmaRegexError(BAD_BRACE)
        self.i = after + 1
        return self.p[self.i - (m.end() + 1) : self.i], lo, hi

    # -- brackets
    def bracket(self) -> _Node:
        self.i += 1
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        items: list[str] = []
        prev: str | None = None  # last single character (a possible range start)
        prev_is_class = False
        while True:
            if self.at_end():
                raise EcmaRegexError(BRACKET)
            c = self.peek()
            if c == "]":
                self.i += 1
                break
            if c == "-" and (prev is not None or prev_is_class) and self.peek(1) != "]":
                self.i += 1
                if prev_is_class:
                    raise self.fail_after_token(RANGE_START, in_bracket=True)
                at_end = self.at_end()
                end_char = self.bracket_item()
                if end_char is None:
                    raise EcmaRegexError(RANGE_END) if at_end else self.fail_after_token(RANGE_END, True)
                assert prev is not None
                if ord(end_char) < ord(prev):
                    raise self.fail_after_token(RANGE_ORDER, in_bracket=True)
                items[-1] = f"{_esc(prev)}-{_esc(end_char)}"
                prev, prev_is_class = None, False
                continue
            char = self.bracket_item(items)
            prev, prev_is_class = char, char is None
            if char is not None:
                items.append(_esc(char))
        return _Node(_bracket_python(items, negated), 1)

    def bracket_item(self, items: list[str] | None = None) -> str | None:
        """Read one bracket element; a character is returned, a class is appended to ``items``."""
        c = self.peek()
        if c == "[" and self.peek(1) in (":", ".", "="):
            return self.posix_item(items)
        if c == "[" and self.peek(1) == "":
            raise EcmaRegexError(INCOMPLETE_CLASS)
        if c == "":
            raise EcmaRegexError(RANGE_END)
        self.i += 1
        if c != "\\":
            return c
        if self.at_end():
            raise EcmaRegexError(ESCAPE_BRACKET)
        e = self.p[self.i]
        self.i += 1
        if e in _CLASS_ESCAPES:
            if items is not None:
                items.append("\\" + e)
            return None
        if e == "b":
            return "\b"
        if e == "B" or e in "123456789":
            raise EcmaRegexError(BRACKET)
        if e == "0":
            return "\0"
        return self.escaped_char(e)

    def posix_item(self, items: list[str] | None) -> str | None:
        kind = self.peek(1)
        close = self.p.find(kind + "]", self.i + 2)
        if close < 0:
            raise EcmaRegexError(CTYPE_SYNTAX if kind == ":" else COLLATE)
        name = self.p[self.i + 2 : close]
        self.i = close + 2
        if kind == ":":
            if items is None:
                return None  # a class as a range end: libstdc++ reports the range first
            if name not in _POSIX_CLASSES:
                raise self.fail_after_token(CTYPE, in_bracket=True)
            if items is not None:
                items.append(_POSIX_CLASSES[name])
            return None
        if len(name) == 1:
            return name
        if kind == "." and name in _COLLATE_NAMES:
            return _COLLATE_NAMES[name]
        raise self.fail_after_token(COLLATE_NAME if kind == "." else EQUIVALENCE, in_bracket=True)


def _quantified(node: _Node, py: str, states: int, lo: int, hi: int | None) -> _Node:
    """``node`` repeated ``lo`` to ``hi`` times (None: unbounded)."""
    exact = node.exact * lo if node.exact is not None and lo == hi and len(node.exact) * lo <= 256 \
        else None
    required = (exact or node.exact or node.required) if lo >= 1 else ""
    if hi is not None and hi <= 1:
        return _Node(py, states, True, exact, required, node.reps, node.risky, node.branch)
    risky = node.risky or node.reps > 0 or node.branch
    return _Node(py, states, True, exact, required, node.reps + 1, risky, node.branch)


def _repeat_states(atom: int, lo: int, hi: int | None) -> int:
    """Rough libstdc++ NFA size of ``atom{lo,hi}`` (each copy of the atom plus a repeat state)."""
    if hi is None:
        return atom * max(lo, 1) + 1
    return atom * lo + (atom + 1) * (hi - lo)


def _bracket_python(items: list[str], negated: bool) -> str:
    if not items:
        return "[\\s\\S]" if negated else "[^\\s\\S]"
    return "[" + ("^" if negated else "") + "".join(items) + "]"


#: Repeats in sequence (``.*a.*b.*c.*d.*``) that make backtracking a polynomial of this degree or
#: more in the name length get the step budget too; fewer are cheap on names of < 64 bytes.
_POLY_REPEATS = 5


def check_pattern(pattern: str) -> PatternCheck:
    """Validate ``pattern`` as libstdc++'s ``std::regex`` (ECMAScript) would, and translate it."""
    c = _check_cached(pattern)
    return PatternCheck(c.pattern, c.error, list(c.warnings), c.python, c.limit, c.required, c.may_backtrack)


#: The patterns llama.cpp writes itself for ``--cpu-moe``, ``--n-cpu-moe`` and ``--n-cpu-ffn``
#: (``common/common.h``'s ``LLM_FFN_EXPS_REGEX``, the 2025 builds' and ``LLM_FFN_DENSE_REGEX``; ik's
#: generated block rule), each after an optional ``blk\\.<layer>`` (``llm_ffn_block_regex``), by the
#: literal every match contains: escaped dots, literals and groups of plain alternatives, each its own
#: Python translation, far below the state limit, no repeat.  :func:`_check_cached` gives their checks
#: without the parser (one ran for each ``--cpu-moe`` check of a plan's command, and a plan's
#: ``--n-cpu-moe N`` parsed N); the same checks as the parser's (a test compares every one).
_FIXED_TAILS = {
    r"\.ffn_(up|down|gate|gate_up)_(ch|)exps": ".ffn_",
    r"\.ffn_(up|down|gate)_exps": ".ffn_",
    r"\.ffn_(up|down|gate)\.": ".ffn_",
    r"\.ffn_(up|down|gate|gate_up)_exps\.(weight|scale)": ".ffn_",
}
_FIXED_BLOCK = re.compile(r"blk\\\.([0-9]{1,3})", re.ASCII)  # a layer below LLAMA_MAX_LAYERS (512)


def _fixed_check(pattern: str) -> PatternCheck | None:
    """The check of one of :data:`_FIXED_TAILS` (after ``blk\\.<layer>`` or alone), else None."""
    block = _FIXED_BLOCK.match(pattern)
    required = _FIXED_TAILS.get(pattern[block.end():] if block else pattern)
    if required is None:
        return None
    if block:
        required = f"blk.{block.group(1)}{required}"
    return PatternCheck(pattern, python=pattern, required=required)


@lru_cache(maxsize=32768)
def _check_cached(pattern: str) -> PatternCheck:
    if len(pattern) + 7 <= _STATE_LIMIT and _PLAIN.fullmatch(pattern):
        text = pattern.replace("\\.", ".")
        return PatternCheck(pattern, python=re.escape(text), required=text)
    fixed = _fixed_check(pattern)
    return fixed if fixed is not None else _parsed(pattern)


def _parsed(pattern: str) -> PatternCheck:
    """The check the parser gives."""
    parser = _Parser(pattern)
    result = PatternCheck(pattern)
    try:
        py, _states = parser.parse()
    except EcmaRegexError as exc:
        result.error = str(exc)
        result.warnings = parser.warnings
        return result
    except _Limit as exc:
        result.limit = str(exc)
        result.warnings = parser.warnings
        return result
    result.warnings = parser.warnings
    result.python = py  # compiled when a name needs it (rule_match), or by compile_pattern
    info = parser.info
    result.required = info.required
    result.may_backtrack = info.risky or info.reps >= _POLY_REPEATS
    return result


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """A Python pattern that ``re.search`` matches wherever ``std::regex_search`` would.

    Raises :class:`EcmaRegexError` for a pattern llama.cpp would reject and
    :class:`PatternLimitError` for one the planner does not evaluate.
    """
    check = _check_cached(pattern)
    if check.error is not None:
        raise EcmaRegexError(check.error)
    if check.limit is not None:
        raise PatternLimitError(check.limit)
    assert check.python is not None
    return re.compile(check.python, re.ASCII)
