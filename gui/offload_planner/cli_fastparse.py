"""A command's options read without building its argparse parser, when argparse would read them the
same way and succeed; anything else (help, an error, an abbreviation, a value that looks like an
option) is left to the real parser, which says what argparse says.

Building an :class:`argparse.ArgumentParser` costs about half a millisecond a command (a help
formatter and a terminal-size lookup per option, gettext lookups of its titles): a tenth of a small
model's whole ``plan``.  The command's ``add_*_parser`` function is run once against a
:class:`Recorder` instead, which keeps its calls, and :func:`fast_parse` reads the arguments from them;
where it cannot, the caller builds the real parser with the same function.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

#: the ``add_argument`` keywords the fast path reads (any other: the real parser decides)
_KEYWORDS = frozenset({"action", "default", "type", "choices", "help", "metavar"})
#: actions the fast path performs (None: store)
_ACTIONS = frozenset({None, "store", "store_true", "append"})
#: the ``add_parser`` keywords that leave parsing as the fast path does it (any other, e.g.
#: ``prefix_chars``, ``argument_default``, ``allow_abbrev``: the real parser decides)
_PARSER_KEYWORDS = frozenset({"help", "description", "epilog", "formatter_class", "usage"})


class RecordedParser:
    """One command's ``add_parser`` call and the ``add_argument``/``set_defaults`` calls made on it."""

    def __init__(self, name: str, kwargs: dict[str, Any]) -> None:
        self.name, self.kwargs = name, kwargs
        self.arguments: list[tuple[tuple[str, ...], dict[str, Any]]] = []
        self.defaults: dict[str, Any] = {}

    def add_argument(self, *names: str, **kwargs: Any) -> None:
        self.arguments.append((names, kwargs))

    def set_defaults(self, **kwargs: Any) -> None:
        self.defaults.update(kwargs)


class Recorder:
    """Stands for ``argparse``'s subparsers action: keeps each ``add_parser`` call."""

    def __init__(self) -> None:
        self.parsers: list[RecordedParser] = []

    def add_parser(self, name: str, **kwargs: Any) -> RecordedParser:
        self.parsers.append(RecordedParser(name, kwargs))
        return self.parsers[-1]


class _Option:
    """One recorded option or positional as the fast path reads it."""

    def __init__(self, names: tuple[str, ...], kwargs: dict[str, Any]) -> None:
        self.positional = not names[0].startswith("-")
        self.dest = names[0] if self.positional else _dest(names)
        self.action = kwargs.get("action")
        self.default = kwargs.get("default", False if self.action == "store_true" else None)
        self.type: Callable[[str], Any] | None = kwargs.get("type")
        self.choices = kwargs.get("choices")


def _dest(names: tuple[str, ...]) -> str:
    """argparse's dest of an option: the first long name, else the first, without its dashes."""
    long = [n for n in names if n.startswith("--")]
    return (long or list(names))[0].lstrip("-").replace("-", "_")


def fast_options(rec: RecordedParser) -> list[tuple[tuple[str, ...], _Option]] | None:
    """The recorded arguments as the fast path reads them; None when one is beyond it (an action,
    ``nargs``, a string default with a type, a positional with a default, a parser option that
    changes how arguments are read...)."""
    if set(rec.kwargs) - _PARSER_KEYWORDS:
        return None
    out = []
    for names, kwargs in rec.arguments:
        if set(kwargs) - _KEYWORDS or kwargs.get("action") not in _ACTIONS or "-h" in names:
            return None
        if kwargs.get("default") is argparse.SUPPRESS:
            return None
        opt = _Option(names, kwargs)
        if (opt.positional and (len(names) > 1 or "default" in kwargs)) or opt.dest in rec.defaults:
            return None
        if isinstance(opt.default, str) and opt.type is not None:
            return None  # argparse converts such a default: left to it
        out.append((names, opt))
    return out


def fast_parse(rec: RecordedParser, argv: Sequence[str], command: str) -> argparse.Namespace | None:
    """``argv`` (the arguments after the command's name) as argparse reads them, or None where the
    real parser must decide: an option not spelled in full, help, a value starting with ``-``, a type
    or choice argparse would refuse, a missing or extra positional."""
    table = fast_options(rec)
    if table is None:
        return None
    by_name = {n: opt for names, opt in table for n in names if not opt.positional}
    positionals = [opt for _, opt in table if opt.positional]
    values: dict[str, Any] = {}
    given: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if not word.startswith("-"):
            given.append(word)
            continue
        name, eq, value = word.partition("=") if word.startswith("--") else (word, "", "")
        opt = by_name.get(name)
        if opt is None:
            return None
        if opt.action == "store_true":
            if eq:
                return None  # "ignored explicit argument": argparse's error
            values[opt.dest] = True
            continue
        if not eq:
            if i >= len(argv) or argv[i].startswith("-"):
                return None
            value, i = argv[i], i + 1
        if not _store(opt, value, values):
            return None
    if len(given) != len(positionals):
        return None
    for opt, word in zip(positionals, given, strict=True):
        if not _store(opt, word, values):
            return None
    return _namespace(command, table, values, rec.defaults)


def _store(opt: _Option, text: str, values: dict[str, Any]) -> bool:
    """Convert and keep one value as argparse would; False where argparse would refuse it."""
    try:
        value = opt.type(text) if opt.type is not None else text
    except (argparse.ArgumentTypeError, TypeError, ValueError):
        return False
    if opt.choices is not None and value not in opt.choices:
        return False
    if opt.action == "append":
        values[opt.dest] = [*values.get(opt.dest, opt.default or []), value]
    else:
        values[opt.dest] = value
    return True


def _namespace(command: str, table: list[tuple[tuple[str, ...], _Option]], values: dict[str, Any],
               defaults: dict[str, Any]) -> argparse.Namespace:
    """What argparse returns: the command, every option's value or default, the parser's defaults."""
    ns = argparse.Namespace(command=command)
    for _, opt in table:
        setattr(ns, opt.dest, values.get(opt.dest, opt.default))
    for k, v in defaults.items():
        setattr(ns, k, v)
    return ns
