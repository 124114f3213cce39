"""What a llama-server flag looks like to the argument parser: spellings, value, env variable."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property


class ValueKind(StrEnum):
    """How the parser consumes a flag (mirrors the handler kinds of llama.cpp's ``common_arg``)."""

    NONE = "none"  # handler_void: no value; the env form applies it when truthy
    BOOL = "bool"  # handler_bool: a positive and a negated spelling, no value
    INT = "int"  # handler_int: one value read with std::stoi
    STRING = "string"  # handler_string: one value, parsed by the flag's own code
    PAIR = "pair"  # handler_str_str: two values

    @property
    def arity(self) -> int:
        return _ARITY.get(self, 1)


_ARITY = {ValueKind.NONE: 0, ValueKind.BOOL: 0, ValueKind.PAIR: 2}  # else 1


@dataclass(frozen=True)
class FlagSpec:
    """One option: ``names`` set it (or take its value), ``neg`` are the negated spellings."""

    names: tuple[str, ...]
    kind: ValueKind = ValueKind.NONE
    neg: tuple[str, ...] = ()
    hint: str | None = None
    env: str | None = None
    help: str = ""

    @cached_property  # asked several times per flag a parse; a spec never changes
    def key(self) -> str:
        """Canonical name: the first ``--`` spelling (llama.cpp's long name), else the first one."""
        for name in self.names:
            if name.startswith("--"):
                return name
        return self.names[0]

    @property
    def arity(self) -> int:
        return self.kind.arity

    @property
    def neg_env(self) -> str | None:
        """The ``LLAMA_ARG_NO_*`` alias that mainline also reads for a negatable flag."""
        if self.env is None or not self.neg:
            return None
        return self.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_")

    @property
    def spellings(self) -> tuple[str, ...]:
        return self.names + self.neg


@dataclass(frozen=True)
class Lookup:
    spec: FlagSpec
    positive: bool


class FlagTable:
    """The flags one dialect's llama-server accepts, searchable by any spelling."""

    def __init__(self, flags: Iterable[FlagSpec]) -> None:
        self._flags: tuple[FlagSpec, ...] = tuple(flags)
        self._by_spelling: dict[str, Lookup] = {}
        self._by_key: dict[str, FlagSpec] = {}
        for spec in self._flags:
            self._by_key.setdefault(spec.key, spec)
            for name in spec.names:
                self._by_spelling[name] = Lookup(spec, True)
            for name in spec.neg:
                self._by_spelling[name] = Lookup(spec, False)
        #: position of every flag each environment variable sets (``env`` and the ``neg_env`` alias)
        self._by_env_var: dict[str, list[int]] = {}
        for i, spec in enumerate(self._flags):
            for var in dict.fromkeys((spec.env, spec.neg_env)):
                if var is not None:
                    self._by_env_var.setdefault(var, []).append(i)

    def __iter__(self) -> Iterator[FlagSpec]:
        return iter(self._flags)

    def __len__(self) -> int:
        return len(self._flags)

    def __contains__(self, spelling: object) -> bool:
        return isinstance(spelling, str) and spelling in self._by_spelling

    def lookup(self, spelling: str) -> Lookup | None:
        return self._by_spelling.get(spelling)

    def by_key(self, key: str) -> FlagSpec | None:
        return self._by_key.get(key)

    def set_by(self, env: Mapping[str, str]) -> list[FlagSpec]:
        """The flags whose variable (``env`` or ``neg_env``) is in ``env``, in the table's order: those
        ``for spec in table`` finds set, without looking up ~300 variables."""
        found = sorted({i for var in env for i in self._by_env_var.get(var, ())})
        return [self._flags[i] for i in found]

    def by_env(self, env: str) -> FlagSpec | None:
        for spec in self._flags:
            if env in (spec.env, spec.neg_env):
                return spec
        return None


def normalize_spelling(arg: str) -> str:
    """llama.cpp and ik_llama.cpp both read ``--a_b`` as ``--a-b`` (only for ``--`` arguments)."""
    return arg.replace("_", "-") if arg.startswith("--") else arg
